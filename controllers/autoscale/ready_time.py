"""How long a group asked for now takes to become capacity: the one figure every look ahead uses.

The autoscaler looks one ready time ahead wherever it weighs work against groups not serving yet:
the queued work the serving groups drain before a new group is ready asks for no new group
(`estimate.work_left_when_ready`). A ready time is a distribution, not one number: image pulls,
weight loads and node provisioning vary from group to group, and a look ahead sized on the median
is short for every group slower than it. So:

- with at least READY_MIN_SAMPLES recent groups measured, the estimate is a high quantile
  (READY_QUANTILE) of their ready times, bounded by READY_MAX_MEDIAN_FACTOR times their median so
  that one group that waited for a node (or an image cache miss) does not stretch every decision;
- with fewer, the prior: the ModelGroup's declared `profile.readyTimeSeconds`;
- with no prior, the median of the few groups measured (a real figure, if a rough one);
- with none of these, unknown: nothing is discounted by a made-up ready time.

The operator reads the samples from `status.readyTime.recent`, the simulator from its own groups;
both call `estimate_ready_time`, and every decision records the figure and its source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ReadyTimeSource = Literal["prior", "measured"]

READY_MIN_SAMPLES = 5
"""Recent ready groups before their own distribution replaces the prior."""
READY_QUANTILE = 0.9
"""The quantile of the recent ready times the look ahead uses: most new groups are ready by then."""
READY_MAX_MEDIAN_FACTOR = 3.0
"""The measured estimate is at most this many times the recent median."""


@dataclass(frozen=True, slots=True)
class ReadyTimeEstimate:
    """The ready time a decision looks ahead by, where it comes from, and how many groups back it."""

    seconds: float
    source: ReadyTimeSource
    samples: int
    """Measured ready times available (valid ones), whichever source was used."""


def _nearest_rank(ordered: Sequence[float], quantile: float) -> float:
    rank = max(1, math.ceil(quantile * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def estimate_ready_time(
    prior_seconds: float | None, measured_seconds: Sequence[float]
) -> ReadyTimeEstimate | None:
    """The ready time to look ahead by (see the module's rules); None: unknown.

    prior_seconds: the declared ready time (absent, or not a positive finite figure: no prior).
    measured_seconds: recent groups' ready times; negative or non-finite entries are ignored.
    """
    measured = sorted(s for s in measured_seconds if math.isfinite(s) and s >= 0)
    prior = prior_seconds if prior_seconds is not None and math.isfinite(prior_seconds) else None
    if prior is not None and prior <= 0:
        prior = None
    if len(measured) >= READY_MIN_SAMPLES:
        median = _nearest_rank(measured, 0.5)
        high = _nearest_rank(measured, READY_QUANTILE)
        return ReadyTimeEstimate(min(high, READY_MAX_MEDIAN_FACTOR * median), "measured", len(measured))
    if prior is not None:
        return ReadyTimeEstimate(float(prior), "prior", len(measured))
    if measured:
        middle = len(measured) // 2
        median = measured[middle] if len(measured) % 2 else (measured[middle - 1] + measured[middle]) / 2
        return ReadyTimeEstimate(median, "measured", len(measured))
    return None
