"""The health agent's image: goodput's agent installed into the vLLM image without displacing vLLM.

The agent runs vLLM's NCCL wrapper, so its image is vLLM's (agent/Containerfile). pip there keeps
vLLM's packages only if every requirement of goodput's `agent` extra admits the version the vLLM
image holds. That is checked offline against the vLLM wheel's own Requires-Dist, recorded in
tests/fixtures/vllm-0.33.0-metadata.json with the release history of each package the agent needs
(how it was recorded is in its `source`): a package vLLM pins must be admitted at that pin; one it
bounds from below must be admitted at the newest release vLLM admits (what its image resolves to).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "vllm-0.33.0-metadata.json").read_text())
CONTAINERFILE = (ROOT / "agent" / "Containerfile").read_text()
# The vLLM image's interpreter and platform, for the markers of vLLM's requirements.
VLLM_IMAGE_ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
# What the agent imports that the vLLM image already has: vLLM itself (the NCCL wrapper).
FROM_THE_IMAGE = {"vllm"}


def agent_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in project["optional-dependencies"]["agent"]]


def vllm_requirements() -> dict[str, Requirement]:
    """vLLM's requirements that apply in its image, by canonical name."""
    applying = (Requirement(line) for line in FIXTURE["requires_dist"])
    return {
        canonicalize_name(r.name): r
        for r in applying
        if r.marker is None or r.marker.evaluate(VLLM_IMAGE_ENVIRONMENT)
    }


def version_in_the_vllm_image(vllm: Requirement, released: Sequence[str]) -> Version | None:
    """The version vLLM's requirement settles on: its pin, else the newest final release it admits."""
    pinned = [spec.version for spec in vllm.specifier if spec.operator in ("==", "===")]
    if pinned:
        return Version(pinned[0])
    admitted = [v for v in map(Version, released) if not v.is_prerelease and vllm.specifier.contains(v)]
    return max(admitted, default=None)


def conflicts(agent: Sequence[Requirement], vllm: Mapping[str, Requirement]) -> list[str]:
    """Each agent requirement that would make pip replace the version of a package vLLM holds."""
    found = []
    for requirement in agent:
        name = canonicalize_name(requirement.name)
        if name not in vllm:
            continue
        held = version_in_the_vllm_image(vllm[name], FIXTURE["released"][requirement.name])
        if held is None or not requirement.specifier.contains(held):
            found.append(
                f"{requirement} does not admit {name} {held} ({vllm[name]} in vLLM {FIXTURE['version']})"
            )
    return found


def test_every_agent_requirement_admits_the_version_the_vllm_image_holds() -> None:
    assert conflicts(agent_requirements(), vllm_requirements()) == []


@pytest.mark.parametrize(
    "requirement",
    ["pydantic==2.11.0", "numpy<2", "prometheus-client>=99"],
    ids=["an exact pin below vLLM's floor", "a cap below what vLLM's image resolves", "a floor above"],
)
def test_a_requirement_vllm_cannot_live_with_is_refused(requirement: str) -> None:
    assert conflicts([Requirement(requirement)], vllm_requirements()) != []


def test_agent_requirements_have_floors_only_so_later_vllm_images_keep_their_versions() -> None:
    for requirement in agent_requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">="}, f"{requirement}: the agent extra takes lower bounds only"


def test_the_release_history_covers_every_agent_requirement() -> None:
    assert {r.name for r in agent_requirements()} <= set(FIXTURE["released"])


def third_party_imports(folder: Path) -> Iterator[str]:
    """Top-level names of the modules a layer imports, goodput's and the standard library's left out."""
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in {"goodput", "__future__"}:
                    yield top


def test_every_package_the_agent_imports_comes_from_its_extra_or_the_vllm_image() -> None:
    # The agent builds on the API and the estimators (import-linter holds it to them).
    imported = {
        name for layer in ("agent", "api", "estimators") for name in third_party_imports(ROOT / layer)
    }
    distributions = packages_distributions()
    provided = {canonicalize_name(r.name) for r in agent_requirements()} | set(vllm_requirements())
    missing = sorted(
        name
        for name in imported - FROM_THE_IMAGE
        if not {canonicalize_name(d) for d in distributions.get(name, [name])} & provided
    )

    assert missing == [], f"imported by the agent, in neither its extra nor vLLM's requirements: {missing}"


def test_the_agent_image_is_the_vllm_image_the_samples_run() -> None:
    (image,) = re.findall(r"^ARG VLLM_IMAGE=(\S+)$", CONTAINERFILE, re.MULTILINE)
    assert image == f"vllm/vllm-openai:v{FIXTURE['version']}"
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}$", CONTAINERFILE, re.MULTILINE)
    samples = {
        match
        for path in (ROOT / "manifests" / "samples").glob("modelgroup-*.yaml")
        for match in re.findall(r"image: (vllm/vllm-openai:\S+)", path.read_text())
    }
    assert samples == {image}


def test_the_agent_image_installs_goodput_without_its_dependencies_then_the_agent_extra() -> None:
    installs = re.findall(r"pip install ([^\\&\n]+)", CONTAINERFILE)
    assert [line.strip() for line in installs] == ["--no-deps .", "-r /tmp/agent-requirements.txt"]
    assert 'evaluate({"extra": "agent"})' in CONTAINERFILE
