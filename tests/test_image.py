"""The operator image's recipe: what the chart deploys by default is what `make image` builds, and the
Containerfile keeps the image slim, non-root and fit for a read-only root filesystem."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = (ROOT / "Containerfile").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def make_variable(name: str) -> str:
    match = re.search(rf"^{name} :?= (.+)$", MAKEFILE, re.MULTILINE)
    assert match, f"the Makefile sets no {name}"
    return match.group(1).strip()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name} (.+)$", CONTAINERFILE, re.MULTILINE)


def test_the_chart_deploys_by_default_the_image_make_image_builds() -> None:
    values = yaml.safe_load((ROOT / "charts" / "goodput" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "goodput" / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert make_variable("IMAGE_REPOSITORY") == values["image"]["repository"]
    assert values["image"]["tag"] == "" and values["image"]["digest"] == "", "the tag defaults to appVersion"
    # make image reads the tag from appVersion; the image carries the package of that version.
    assert "appVersion" in make_variable("IMAGE_TAG")
    assert chart["appVersion"] == project["version"]
    assert instructions("ARG").count(f"VERSION={project['version']}") == 1


def test_the_image_runs_goodput_as_a_non_root_numeric_user() -> None:
    # runAsNonRoot needs a numeric user; 65532 is the chart's podSecurityContext.runAsUser.
    values = yaml.safe_load((ROOT / "charts" / "goodput" / "values.yaml").read_text())
    (user,) = instructions("USER")
    assert user == f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    assert instructions("ENTRYPOINT") == ['["goodput"]'] and instructions("CMD") == ['["run"]']


def test_the_image_holds_the_operator_and_its_production_dependencies_only() -> None:
    copied = " ".join(instructions("COPY"))
    for folder in ("tests", "e2e", "bench", "manifests", "charts", "testbed"):
        assert f"{folder}/" not in copied, f"{folder} does not belong in the operator's image"
    # The package is installed with the agent's extra only: plots, progress bars and dev tools stay out.
    assert re.search(r"pip install (--[a-z-]+ )*'/src\[agent\]'( |\\\\|$)", CONTAINERFILE, re.MULTILINE)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    shipped = project["dependencies"] + project["optional-dependencies"]["agent"]
    assert not [d for d in shipped if d.startswith(("matplotlib", "tqdm", "pytest", "hypothesis"))]
    # The test bed is a distribution of its own: goodput's wheel does not even hold it.
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not [package for package in packages if package.startswith("goodput.testbed")]
    # Bytecode compiled at build time: a read-only root filesystem needs no writes at start.
    assert "compileall" in CONTAINERFILE and "PYTHONDONTWRITEBYTECODE=1" in CONTAINERFILE


def test_the_build_context_leaves_out_what_the_image_never_copies() -> None:
    ignored = (ROOT / ".containerignore").read_text().split()
    assert {".git", ".venv", "out", "tests", "e2e"} <= set(ignored)


def test_the_wheel_holds_every_package_of_the_layers_it_maps() -> None:
    # Development imports the layers through folder links, so a sub-package missing from the list
    # only shows in the wheel and the image, where the operator then fails to start.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        f"goodput.{package}": Path(folder)
        for package, folder in (
            (name.removeprefix("goodput."), path) for name, path in setuptools["package-dir"].items()
        )
    }
    found = {
        ".".join((name, *init.parent.relative_to(ROOT / folder).parts))
        for name, folder in folders.items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert found == set(setuptools["packages"])
