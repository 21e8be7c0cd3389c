"""The service-time model against published vLLM throughput and latency, pair by pair.

Run: .venv/bin/python bench/bench_service_time.py

Each point of `goodput.simulator.published` (source, model, accelerator and the benchmark's settings)
is replayed on the simulator's engine priced by the service-time model, with no figure fitted to
any point. Prints, per point, every published figure beside the modelled one and the signed error
((modelled - published) / published) of the figures compared, then per model/accelerator pair its
worst compared error and the median over pairs. Nothing is asserted here;
tests/test_service_time_published.py holds the model to the table.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from goodput.simulator.published import (
    POINTS,
    TOLERANCE,
    PublishedPoint,
    error,
    model_figures,
    modelled,
    worst_error,
)
from goodput.simulator.replay import ReplayResult

FIGURES = (
    ("output_tokens_per_second", "out tok/s", 1.0, 0),
    ("requests_per_second", "req/s", 1.0, 2),
    ("tpot_seconds", "TPOT ms", 1e3, 1),
    ("ttft_seconds", "TTFT ms", 1e3, 0),
)


def figure_lines(point: PublishedPoint, result: ReplayResult) -> list[str]:
    lines = []
    for figure, label, scale, digits in FIGURES:
        published: float | None = getattr(point.published, figure)
        if published is None:
            continue
        shown = f"{published * scale:>9.{digits}f}", f"{modelled(result, figure) * scale:>9.{digits}f}"
        held = "compared" if figure in point.compared else "shown only"
        lines.append(
            f"    {label:<10} published {shown[0]}  modelled {shown[1]}  "
            f"error {error(point, result, figure):>+7.1%}  ({held})"
        )
    return lines


def pair_of(point: PublishedPoint) -> str:
    return f"{point.model.rsplit('/', 1)[-1]} on {point.tensor_parallel}x {point.gpu}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    by_pair: dict[str, list[float]] = defaultdict(list)
    for point in POINTS:
        result = model_figures(point)
        worst = worst_error(point, result)
        by_pair[pair_of(point)].append(worst)
        status = "within" if abs(worst) <= TOLERANCE else "OUTSIDE"
        print(f"{point.key}  [{status} {TOLERANCE:.0%}]")
        print(f"    source: {point.source}")
        print(f"    settings: {point.settings}")
        print("\n".join(figure_lines(point, result)))
        if not point.reproduced:
            print(f"    not reproduced: {point.why_not}")
    print()
    print(f"{'model / accelerator pair':<48} {'worst error':>12}")
    worst_by_pair = {pair: max(errors, key=abs) for pair, errors in by_pair.items()}
    for pair, worst in worst_by_pair.items():
        print(f"{pair:<48} {worst:>+12.1%}")
    errors = [abs(worst) for worst in worst_by_pair.values()]
    within = [value for value in errors if value <= TOLERANCE]
    print(
        f"\n{len(within)} of {len(errors)} pairs within {TOLERANCE:.0%}; median absolute error "
        f"{statistics.median(errors):.1%} over all pairs, {statistics.median(within):.1%} over those within"
    )


if __name__ == "__main__":
    main()
