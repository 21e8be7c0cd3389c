"""How far the deadline gate's TTFT prediction runs short of what admitted requests see.

The deadline gate (`admission.predicted_ttft`) prices a newcomer's wait from the work queued ahead
over the groups' capacity, and its service from the zero-load prefill and first-step floor. Both are
figures of engines running as profiled. When they run slower (a loaded host, a capacity figure that
is optimistic for the live mix, batching interference) every prediction is low, and the gate admits
requests that then miss their TTFT target. The drain-rate meter (`admission.DrainRateMeter`) corrects
the queue's pace, but only while requests wait and only after the fact; the engines' measured pace
lags the load that slows them. So the gateway also keeps, for each admitted request, what the gate
predicted, the budget it had and the TTFT it then saw, and corrects the next predictions by that
measured error, as the autoscaler's forecast takes its safety margin from its own measured error.

The correction is judged by the decision it drives, not by the prediction's spread. A request was
admitted because `waited + ahead <= target`; under a correction c the gate would still admit it
while `c <= (target - waited) / ahead`, its headroom. The correction is the least c >= 1 under which
the recent admitted requests the gate would still admit met their target at least `attainment` of
the time: with no misses it stays 1, and each miss among requests admitted with little headroom
raises it past their headroom. A ratio of observed over predicted would not do: a wait for a slot
is priced at its mean and is often twice that, so a tenant whose requests all meet their target
with room to spare would still get a correction of about 2 and be refused for no miss.

It is bounded above (a burst of misses cannot close the gate for good), never below 1 (the figures'
own p90 price stays the least the gate asks), stays 1 until enough requests were seen, and forgets
requests older than its window, so an old slow spell stops counting. Pure: the caller passes `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TtftSample:
    """One admitted request, from its admission decision on: the wait and service the gate predicted,
    the time its TTFT target left it, and the time its first token took."""

    observed_at: float
    predicted_seconds: float
    budget_seconds: float
    observed_seconds: float

    @property
    def headroom(self) -> float:
        """The largest correction under which the gate would still have admitted it."""
        return self.budget_seconds / self.predicted_seconds

    @property
    def met(self) -> bool:
        return self.observed_seconds <= self.budget_seconds


@dataclass(frozen=True, slots=True)
class TtftCalibrationSettings:
    """How the deadline gate's correction is measured.

    attainment: the fraction of the admitted requests the corrected gate would still admit that must
    have met their target.
    min_samples: live samples needed before the correction departs from 1.0.
    max_samples: the most recent samples kept; max_age_seconds: older ones no longer count.
    max_ttft_correction: the bound, so that a burst of misses cannot close the gate for good.
    """

    attainment: float = 0.95
    min_samples: int = 4
    max_samples: int = 128
    max_age_seconds: float = 60.0
    max_ttft_correction: float = 4.0

    def __post_init__(self) -> None:
        if not 0.0 < self.attainment <= 1.0:
            raise ValueError(f"attainment must be in (0, 1], got {self.attainment}")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(
                f"need 1 <= min_samples <= max_samples, got min_samples={self.min_samples}, "
                f"max_samples={self.max_samples}"
            )
        if not self.max_age_seconds > 0:
            raise ValueError(f"max_age_seconds must be positive, got {self.max_age_seconds}")
        if not 1.0 <= self.max_ttft_correction < math.inf:
            raise ValueError(
                f"max_ttft_correction must be finite and at least 1, got {self.max_ttft_correction}"
            )


@dataclass(frozen=True, slots=True)
class TtftCalibration:
    """The deadline gate's measured error on one ModelGroup (for one tenant), and the correction."""

    settings: TtftCalibrationSettings = TtftCalibrationSettings()
    samples: tuple[TtftSample, ...] = ()

    def observed(
        self, predicted_seconds: float, budget_seconds: float, observed_seconds: float, now: float
    ) -> TtftCalibration:
        """With one admitted request's predicted wait and service, its budget and its observed TTFT
        (all from the decision on). A request that says nothing of the error (a prediction not above
        0, no budget left, a figure not finite, a negative time) leaves it as it was."""
        figures = (predicted_seconds, budget_seconds, observed_seconds)
        if not all(math.isfinite(value) for value in figures):
            return self
        if predicted_seconds <= 0 or budget_seconds <= 0 or observed_seconds < 0:
            return self
        # Bounded by count here; age is read where the correction is (samples past it never count).
        kept = self.samples[max(0, len(self.samples) - self.settings.max_samples + 1) :]
        sample = TtftSample(now, predicted_seconds, budget_seconds, observed_seconds)
        return TtftCalibration(self.settings, (*kept, sample))

    def ttft_correction(self, now: float) -> float:
        """The factor the deadline gate applies to its predicted wait and service: 1.0 until
        `min_samples` live samples were seen, then the least correction (at least 1) under which
        those it would still admit met their target at `attainment`, halfway between the headroom
        of the last request it leaves out and the next; at most `max_ttft_correction`."""
        settings = self.settings
        # A request with headroom under 1 was not admitted on the gate's figures: it says nothing of them.
        admitted = (sample for sample in self._live(now) if sample.headroom >= 1.0)
        live = sorted(admitted, key=lambda sample: sample.headroom)
        if len(live) < settings.min_samples:
            return 1.0
        allowed_misses = (1.0 - settings.attainment) * (1.0 + 1e-9)  # a quotient exactly at it passes
        misses_from = [0] * (len(live) + 1)  # misses among live[k:]
        for k in range(len(live) - 1, -1, -1):
            misses_from[k] = misses_from[k + 1] + (not live[k].met)
        for k in range(len(live)):
            if k > 0 and live[k - 1].headroom == live[k].headroom:
                continue  # no correction admits one of two requests with the same headroom
            if misses_from[k] <= allowed_misses * (len(live) - k):
                correction = 1.0 if k == 0 else (live[k - 1].headroom + live[k].headroom) / 2
                return min(settings.max_ttft_correction, correction)
        return settings.max_ttft_correction

    def live_samples(self, now: float) -> int:
        return len(self._live(now))

    def _live(self, now: float) -> tuple[TtftSample, ...]:
        horizon = now - self.settings.max_age_seconds
        return tuple(sample for sample in self.samples if sample.observed_at >= horizon)
