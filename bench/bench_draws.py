"""The suite's verdicts across draws (`make bench-draws`): several runs of `bench_suite.py`, each with
its own --seed, read back and set side by side.

Run: .venv/bin/python bench/bench_draws.py --out out/bench-draws/draws.md RESULTS.json [RESULTS.json ...]

Each RESULTS.json is one run's `results.json`; its seed is the one its records carry (0 where a
record predates the field). Writes OUT (per case, goodput's multiples of the HPA's and KEDA's
SLO-meeting requests per GPU-hour and the baselines it is behind, in each draw; then the goal counted
per draw, with the geometric means of goodput's ratios and of the searched oracle's over HPA and
KEDA, and how many test runs held their warm start) and prints it. Nothing is asserted: these are
figures. A file that is not a list of case records is refused by name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from goodput.simulator.suite_report import draws_markdown


def _seed_of(records: Any, path: Path) -> int:
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise ValueError(f"{path}: not a suite run's results.json (a list of case records)")
    seeds = {int(record.get("seed", 0)) for record in records}
    if len(seeds) != 1:
        raise ValueError(f"{path}: its records carry seeds {sorted(seeds)}, not one")
    return seeds.pop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="results.json of one suite run each")
    parser.add_argument("--out", type=Path, default=Path("out/bench-draws/draws.md"))
    args = parser.parse_args()
    draws: dict[int, list[dict[str, Any]]] = {}
    try:
        for path in args.results:
            records = json.loads(path.read_text())
            seed = _seed_of(records, path)
            if seed in draws:
                raise ValueError(f"{path}: seed {seed} is already read from another file")
            draws[seed] = records
    except (OSError, ValueError) as error:
        print(f"bench_draws: {error}", file=sys.stderr)
        return 2
    text = draws_markdown(draws)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
