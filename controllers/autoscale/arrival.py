"""What arrives: the work rate a decision sizes groups for.

The engines' token counters show what the Ready groups *served* over the metrics window. In a burst
that figure lags the offered load by the window and can never exceed what the Ready groups serve, so
a decision sized on it asks for one group and then waits a whole ready time for new evidence. Two
readings see further:

- a gateway in front counts every request offered to it (admitted, deferred, held or rejected; the
  infeasible ones set aside, as everywhere in the decision), so its offered requests over the
  window, priced at the mix's mean work, are the arrival rate, refused demand included;
- the waiting work (the gateway's, the exact queue's or the engines') grows by what arrives beyond
  what is served: its growth over a short window, added to the longer window's rate, rises within
  a tick or two of a step. Running work is not read: it rises whenever load rises, within capacity
  too, as the batches fill. While the waiting work grows, the serving groups are saturated: they
  serve their capacity now, whatever the window's average of the minute before says.

A rise is taken at once; a fall is smoothed by the scale-down stabilisation window, which holds the
highest recommendation of its window. Pure: readings in, figures out.
"""

from __future__ import annotations

from dataclasses import dataclass

from goodput.controllers.autoscale.model import GatewayObservation, QueueReading
from goodput.estimators.queueing import TrafficMix, prefill_work_per_request
from goodput.estimators.work import WorkPricing

QUEUE_GROWTH_WINDOW_SECONDS = 30.0
"""How far back the queue's growth is read: two or three decision intervals, short against the
metrics window (60 s by default) whose rates it completes."""


@dataclass(frozen=True, slots=True)
class ArrivalReading:
    """The arrival work rate and the readings it was made of, in work-seconds per second.

    served_work_rate: what the fresh engines served over the metrics window (None: no fresh engine);
    offered_work_rate: what the gateway was offered over the window (None: no fresh gateway);
    queue_growth_work_rate: how fast the queued work grew over the last QUEUE_GROWTH_WINDOW_SECONDS
    (None: fewer than two readings in it; a shrinking queue reads 0, its drain is the spare rate's).
    """

    served_work_rate: float | None
    offered_work_rate: float | None
    queue_growth_work_rate: float | None
    saturated_work_rate: float = 0.0
    """The serving groups' capacity when their queue is past what a request can afford to wait
    behind (0 otherwise): what they serve now while the waiting work grows."""

    @property
    def arrival_work_rate(self) -> float | None:
        """The larger of served and offered, plus the queue's growth; None when neither is known.
        While the queue grows, served is at least the serving groups' capacity."""
        rates = [rate for rate in (self.served_work_rate, self.offered_work_rate) if rate is not None]
        if not rates:
            return None
        growth = self.queue_growth_work_rate or 0.0
        served_now = max(self.served_work_rate or 0.0, self.saturated_work_rate if growth > 0 else 0.0)
        return max(served_now, self.offered_work_rate or 0.0) + growth


def mean_request_work_seconds(pricing: WorkPricing, mix: TrafficMix) -> float:
    """One request of the mix's mean shape: its prefill plus its output at the mean decode context."""
    mean_decode_context = mix.mean_input_tokens + mix.mean_output_tokens / 2
    return prefill_work_per_request(pricing, mix) + mix.mean_output_tokens * pricing.decode_work_per_token(
        mean_decode_context
    )


def offered_work_rate(
    gateway: GatewayObservation | None, pricing: WorkPricing, mix: TrafficMix, window_seconds: float
) -> float | None:
    """Feasible requests offered to the gateway per second, priced at the mix: over the recent
    window where the gateway exports it and that reads higher (a rise shows at once), else over the
    goodput window (a fall shows slowly). The recent rate keeps the window's feasible share."""
    if gateway is None or window_seconds <= 0:
        return None
    offered = sum(c.offered_requests for c in gateway.classes)
    feasible = sum(max(0.0, c.offered_requests - c.infeasible_requests) for c in gateway.classes)
    per_second = feasible / window_seconds
    recent = [c.recent_offered_per_second for c in gateway.classes if c.recent_offered_per_second is not None]
    if recent:
        feasible_share = feasible / offered if offered > 0 else 1.0
        per_second = max(per_second, sum(recent) * feasible_share)
    return per_second * mean_request_work_seconds(pricing, mix)


def queue_growth_work_rate(readings: tuple[QueueReading, ...], now: float) -> float | None:
    """The queued work's growth per second from the oldest reading inside the window to the newest
    (`readings` ends with this tick's); never negative."""
    inside = [reading for reading in readings if reading.at >= now - QUEUE_GROWTH_WINDOW_SECONDS]
    if len(inside) < 2 or inside[-1].at <= inside[0].at:
        return None
    grown = inside[-1].waiting_work_seconds - inside[0].waiting_work_seconds
    return max(0.0, grown / (inside[-1].at - inside[0].at))


def remember_queue(
    readings: tuple[QueueReading, ...], waiting_work_seconds: float | None, now: float
) -> tuple[QueueReading, ...]:
    """The readings a later tick's growth needs: those inside the window, plus this tick's when
    the queue is known (an unknown queue breaks the trail: growth is never read across a gap)."""
    if waiting_work_seconds is None:
        return ()
    kept = tuple(reading for reading in readings if reading.at >= now - QUEUE_GROWTH_WINDOW_SECONDS)
    return (*kept, QueueReading(now, waiting_work_seconds))
