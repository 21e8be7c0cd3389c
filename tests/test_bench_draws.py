"""`bench/bench_draws.py` sets several suite runs side by side, one seed each, and refuses a pair it
cannot tell apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from goodput.simulator.suite_report import POLICY_ORDER

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_draws.py"


def _results(path: Path, seed: int | None, good: float) -> Path:
    """One suite run's results.json with one case, goodput at `good` SLO-met per GPU-hour, the rest at 100."""

    def outcome(value: float) -> dict[str, Any]:
        return {"good_per_gpu_hour": value, "attainment_offered": 1.0, "gpu_hours": 10.0}

    record: dict[str, Any] = {
        "model": "m",
        "trace": "t",
        "policies": {name: {"test": outcome(good if name == "goodput" else 100.0)} for name in POLICY_ORDER},
        "oracle": {"searched": outcome(150.0), "fluid_bound_gpu_hours": 9.0},
    }
    if seed is not None:
        record["seed"] = seed
    path.write_text(json.dumps([record]))
    return path


def _run(*args: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_two_draws_are_set_side_by_side_by_their_seeds(tmp_path: Path) -> None:
    out = tmp_path / "draws.md"
    done = _run(
        _results(tmp_path / "a.json", 1, 130.0), _results(tmp_path / "b.json", None, 80.0), Path("--out"), out
    )
    assert done.returncode == 0, done.stderr
    row = next(line for line in out.read_text().splitlines() if line.startswith("| m | t |"))
    # the record without a seed is the default draw, 0, and comes first
    assert row.split(" | ")[2:] == [
        "0.80x hpa-running; behind 0.80x hpa-running, 0.80x keda-queue, 0.80x keda-cron-queue, 0.80x kpa, "
        "0.80x fixed, 0.80x hpa",
        "1.30x hpa-running",
        "1 of 2 draws |",
    ]


def test_two_runs_of_the_same_seed_are_refused_naming_the_second(tmp_path: Path) -> None:
    second = _results(tmp_path / "b.json", 2, 90.0)
    done = _run(_results(tmp_path / "a.json", 2, 130.0), second, Path("--out"), tmp_path / "draws.md")
    assert done.returncode == 2
    assert f"{second}: seed 2 is already read from another file" in done.stderr
    assert not (tmp_path / "draws.md").exists()


def test_a_file_that_is_not_a_list_of_case_records_is_refused_by_name(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"model": "m"}))
    done = _run(table, Path("--out"), tmp_path / "draws.md")
    assert done.returncode == 2
    assert f"{table}: not a suite run's results.json (a list of case records)" in done.stderr
    assert not (tmp_path / "draws.md").exists()
