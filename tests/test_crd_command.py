"""`goodput crds [--check] [--out DIR]`: writes the rendered CRDs, and fails CI when crds/ drifts."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.api.crd import render_crds
from goodput.operator.cli import main


def docs_args(tmp_path: Path) -> list[str]:
    """Keep the API reference of each test beside its CRD folder, never in the repository."""
    return ["--docs", str(tmp_path.with_name(tmp_path.name + "-docs"))]


def test_writes_every_crd_and_then_checks_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "crds"

    assert main(["crds", "--out", str(out), *docs_args(tmp_path)]) == 0

    assert {path.name: path.read_text() for path in out.iterdir()} == render_crds()
    assert main(["crds", "--check", "--out", str(out), *docs_args(tmp_path)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_writing_again_touches_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["crds", "--out", str(tmp_path), *docs_args(tmp_path)])
    capsys.readouterr()

    assert main(["crds", "--out", str(tmp_path), *docs_args(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_check_names_a_stale_file_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["crds", "--out", str(tmp_path), *docs_args(tmp_path)])
    stale = tmp_path / "goodput.dev_slopolicies.yaml"
    stale.write_text(stale.read_text().replace("default: 300", "default: 301", 1))
    before = {path.name: path.read_text() for path in tmp_path.iterdir()}

    assert main(["crds", "--check", "--out", str(tmp_path), *docs_args(tmp_path)]) == 1

    errors = capsys.readouterr().err
    assert f"{stale}: stale" in errors
    assert "goodput.dev_modelgroups.yaml" not in errors
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == before, "--check must not write"


def test_check_fails_on_a_missing_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["crds", "--out", str(tmp_path), *docs_args(tmp_path)])
    (tmp_path / "goodput.dev_modelgroups.yaml").unlink()

    assert main(["crds", "--check", "--out", str(tmp_path), *docs_args(tmp_path)]) == 1
    assert "goodput.dev_modelgroups.yaml: missing" in capsys.readouterr().err


def test_check_fails_on_a_crd_file_not_rendered_from_the_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["crds", "--out", str(tmp_path), *docs_args(tmp_path)])
    (tmp_path / "goodput.dev_oldkinds.yaml").write_text("kind: CustomResourceDefinition\n")

    assert main(["crds", "--check", "--out", str(tmp_path), *docs_args(tmp_path)]) == 1
    assert "goodput.dev_oldkinds.yaml: not rendered from the API models" in capsys.readouterr().err


def test_check_of_a_directory_that_does_not_exist_fails(tmp_path: Path) -> None:
    assert main(["crds", "--check", "--out", str(tmp_path / "absent"), *docs_args(tmp_path)]) == 1


def test_the_api_reference_is_rendered_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["crds", "--out", str(tmp_path), *docs_args(tmp_path)])
    reference = tmp_path.with_name(tmp_path.name + "-docs") / "api-reference.md"
    text = reference.read_text()
    assert "| `parallelism.gpusPerPod` | integer |" in text
    assert "| `replicas` |" in text and "## SLOPolicy" in text
    assert "`parallelism.gpusPerPod` must divide" in text, "CEL messages belong in the reference"
    reference.write_text(text.replace("## SLOPolicy", "## Policy"))
    capsys.readouterr()
    assert main(["crds", "--check", "--out", str(tmp_path), *docs_args(tmp_path)]) == 1
    assert f"{reference}: stale" in capsys.readouterr().err


def test_the_repository_reference_is_current() -> None:
    assert main(["crds", "--check"]) == 0, "run `make crds`"
