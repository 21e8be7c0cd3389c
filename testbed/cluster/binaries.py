"""Find (building once, if needed) the pinned binaries the local cluster runs.

`tools/build-binaries.sh` builds every program from its Go module into a cache keyed by version;
`GOODPUT_BIN_DIR` points at a ready directory instead (e.g. a CI cache or an installed copy).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "prometheus",
    "keda-operator",
    "keda-adapter",
    "karpenter",
)
BIN_DIR_ENV = "GOODPUT_BIN_DIR"


class BinariesUnavailableError(RuntimeError):
    """The binaries are neither cached nor buildable here; the message says what is missing."""


def repository_root() -> Path:
    """The checkout this package runs from (the folders map 1:1 to `goodput.<folder>`)."""
    return Path(__file__).resolve().parents[2]


def build_script() -> Path:
    return repository_root() / "tools" / "build-binaries.sh"


def missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in REQUIRED if not os.access(bin_dir / name, os.X_OK)]


def ensure_binaries(*, build: bool = True, progress: bool = True) -> Path:
    """The directory holding every REQUIRED binary; runs the build script when some are missing.

    The build prints its own progress (to stderr) unless `progress` is False.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        bin_dir = Path(override)
        missing = missing_binaries(bin_dir)
        if missing:
            raise BinariesUnavailableError(f"{BIN_DIR_ENV}={bin_dir} lacks {', '.join(missing)}")
        return bin_dir
    script = build_script()
    if not script.is_file():
        raise BinariesUnavailableError(
            f"{script} not found: run from a goodput checkout or set {BIN_DIR_ENV} to a directory "
            f"holding {', '.join(REQUIRED)}"
        )
    bin_dir = Path(_run_script(script, "--print-bin-dir", progress=False).strip())
    if missing_binaries(bin_dir) and build:
        output = _run_script(script, progress=progress)
        bin_dir = Path(output.strip().splitlines()[-1])
    missing = missing_binaries(bin_dir)
    if missing:
        raise BinariesUnavailableError(f"{bin_dir} lacks {', '.join(missing)}; run {script}")
    return bin_dir


def _run_script(script: Path, *args: str, progress: bool) -> str:
    try:
        result = subprocess.run(
            [str(script), *args],
            stdout=subprocess.PIPE,
            stderr=None if progress else subprocess.PIPE,
            text=True,
            check=False,
        )
    except OSError as error:
        raise BinariesUnavailableError(f"cannot run {script}: {error}") from error
    if result.returncode != 0:
        detail = "" if progress else f": {(result.stderr or '').strip()[-2000:]}"
        raise BinariesUnavailableError(
            f"{script} {' '.join(args)} failed with exit code {result.returncode}{detail} "
            "(it needs Go and the Go module proxy; see its output above)"
        )
    if progress:
        sys.stderr.flush()
    return result.stdout
