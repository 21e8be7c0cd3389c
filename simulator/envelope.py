"""The measured capacity envelope of one group (DESIGN §1, §26).

Work is priced in work-seconds exactly as the decision code prices it (`estimators.work`). The
capacity envelope C is *measured*, not assumed: a fleet of several groups behind the router is
offered the workload's *feasible* requests (those whose zero-load floors fit their class's targets,
see `simulator.feasible`) at rising rates, each rate repeated with other seeds, until a class's
attainment falls below its goal; C is the work rate per group it sustained (what a ModelGroup's
`profile.capacityWorkSecondsPerSecond` records). By default the trials offer steady (Poisson)
arrivals with requests drawn from the workload, so C is what a group sustains on this mix of
lengths, not on this trace's bursts: the decision code divides the arrival rate it reads *now* by
C, so a C measured through the trace's surges would count each surge twice, once in the rate and
once in C (on the 70B sample and the Azure 2024 code week's training window, surges four times the
mean held the traced trials to 4.2 requests per second per group where steady ones pass 11.2).
Headroom for what arrives while groups start is the policy's (its safety factor, the slack and
goodput signals, and the fair benchmark's factor). `EnvelopeSearch.arrivals="trace"` keeps the
trace's time profile instead: what a fixed fleet sustains on that trace's own shape, which the
benchmark suite uses to set each case's level. Infeasible requests are left out because no number
of groups serves them in time: with them in, the search would step down until a sample happened to
hold none, and report a floor. When no rate meets the SLO the search raises `EnvelopeNotFoundError`
saying which class reached which attainment at which rates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from goodput.estimators.work import WorkPricing
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import Workload, compress_time, multiply_rate

ArrivalShape = Literal["steady", "trace"]
"""How an envelope trial offers its requests: Poisson arrivals at the rate (`steady`), or the trace's
own time profile thinned or compressed to the rate (`trace`)."""


def request_work_seconds(pricing: WorkPricing, workload: Workload) -> np.ndarray:
    """Each request's work in work-seconds, priced as the decision code prices it (`estimators.work`)."""
    return np.fromiter(
        (
            pricing.prefill_work_seconds(float(n_in)) + pricing.decode_work_seconds(float(n_in), float(n_out))
            for n_in, n_out in zip(
                workload.input_tokens.tolist(), workload.output_tokens.tolist(), strict=True
            )
        ),
        dtype=np.float64,
        count=len(workload),
    )


@dataclass(frozen=True, slots=True)
class CapacityEnvelope:
    """What one group sustains at the SLO, measured on the workload."""

    work_seconds_per_second: float
    requests_per_second: float
    attainment_goal: float
    trials: int
    """Simulated trials behind the figure (0: taken from the ModelGroup's profile)."""
    concurrency: float | None = None
    """Mean requests in flight (running + waiting) in one group at that rate, when measured."""
    failing_requests_per_second: float | None = None
    """The lowest rate per group that failed: the figure's upper bound at the search's resolution."""
    groups: int = 1
    """Groups in the trial fleet."""
    repeats: int = 1
    """Seeded repeats of each trial."""
    trial_seconds: float = 0.0
    """Arrivals per trial (0: taken from the ModelGroup's profile)."""
    attainment_lower_bounds: tuple[float, ...] = ()
    """Per class, the 95 % Wilson lower bound of the pooled attainment at the figure's rate."""
    trial_log: tuple[EnvelopeTrial, ...] = ()
    """Every rate tried, in rising order."""
    arrivals: ArrivalShape = "steady"
    """How the trials offered their requests."""

    def groups_for(self, work_rate: float) -> int:
        return max(1, math.ceil(work_rate / self.work_seconds_per_second - 1e-9))

    def scaled(self, factor: float) -> CapacityEnvelope:
        """The envelope with its capacity times `factor`: the fair benchmark's knob for goodput (below
        1, headroom a reactive fleet keeps for what arrives while groups start)."""
        if factor <= 0:
            raise ValueError(f"an envelope factor must be positive, got {factor}")
        return replace(
            self,
            work_seconds_per_second=self.work_seconds_per_second * factor,
            requests_per_second=self.requests_per_second * factor,
        )


def trial_workload(
    workload: Workload,
    rate_per_second: float,
    trial_seconds: float,
    seed: int,
    arrivals: ArrivalShape = "steady",
) -> Workload:
    """One trial's requests: `steady_trial_workload` or `traced_trial_workload`, as `arrivals` says."""
    if arrivals == "steady":
        return steady_trial_workload(workload, rate_per_second, trial_seconds, seed)
    return traced_trial_workload(workload, rate_per_second, trial_seconds, seed)


def steady_trial_workload(
    workload: Workload, rate_per_second: float, trial_seconds: float, seed: int
) -> Workload:
    """`trial_seconds` of Poisson arrivals at `rate_per_second`, each request drawn (seeded, with
    replacement) from the workload: its length mix, classes and prefixes, none of its timing."""
    rng = np.random.default_rng([seed, 12])
    count = int(rng.poisson(rate_per_second * trial_seconds)) if len(workload) else 0
    drawn = rng.integers(0, max(1, len(workload)), size=count)
    arrival_seconds = np.sort(rng.uniform(0.0, trial_seconds, size=count))
    return workload.placed(
        drawn, arrival_seconds, f"steady: Poisson at {rate_per_second:.3g}/s for {trial_seconds:g} s"
    )


def traced_trial_workload(
    workload: Workload, rate_per_second: float, trial_seconds: float, seed: int
) -> Workload:
    """`trial_seconds` of the workload at `rate_per_second`, from a seeded offset: thinned (seeded), or
    time-compressed when the rate is above the workload's own. The length mix and the time profile
    are kept; other seeds give other stretches of the trace."""
    own_rate = len(workload) / max(workload.span_seconds, 1e-9)
    ratio = rate_per_second / own_rate
    rng = np.random.default_rng([seed, 11])
    shaped = workload
    if ratio < 1.0:
        keep = rng.random(len(workload)) < ratio
        shaped = workload.take(np.flatnonzero(keep), f"thinned to {rate_per_second:.3g}/s")
    elif ratio > 1.0:
        # compress as far as the trace still fills the trial; replicate (seeded) beyond that
        compression = max(1.0, min(ratio, workload.span_seconds / trial_seconds))
        shaped = compress_time(workload, compression)
        if ratio > compression:
            shaped = multiply_rate(shaped, ratio / compression, seed)
    offset = float(rng.uniform(0.0, max(0.0, shaped.span_seconds - trial_seconds)))
    arrivals = shaped.arrival_seconds
    chosen = np.flatnonzero((arrivals >= offset) & (arrivals < offset + trial_seconds))
    cut = shaped.take(chosen, f"[{offset:.0f}, {offset + trial_seconds:.0f}) s")
    return replace(cut, arrival_seconds=cut.arrival_seconds - offset)


class EnvelopeNotFoundError(ValueError):
    """No rate at which the fleet meets the SLO: the reason names the class, the attainment it reached
    and the rates that were tried (never a floor returned in silence)."""


@dataclass(frozen=True, slots=True)
class EnvelopeTrial:
    """One arrival rate tried on the trial fleet, pooled over its repeats."""

    rate_per_group: float
    requests: int
    met: tuple[int, ...]
    offered: tuple[int, ...]
    """SLO-meeting and offered requests per class, summed over the repeats."""
    passed: bool

    def attainment(self, class_number: int) -> float:
        offered = self.offered[class_number]
        return self.met[class_number] / offered if offered else math.nan


def wilson_lower_bound(successes: int, trials: int, z: float = 1.96) -> float:
    """The lower end of the Wilson score interval (95 % by default) for a binomial share."""
    if trials <= 0:
        return math.nan
    share = successes / trials
    denominator = 1 + z * z / trials
    centre = share + z * z / (2 * trials)
    spread = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials))
    # With no successes the centre and the spread are equal in exact arithmetic; rounding can leave a
    # share a hair below zero.
    return max(0.0, (centre - spread) / denominator)


BRACKET_FACTOR = 1.5
"""The envelope search steps its rate by this factor until one rate passes and the next fails."""


@dataclass(frozen=True, slots=True)
class EnvelopeSearch:
    """How the envelope is measured: a fleet of `groups` behind the router, each trial `trial_seconds`
    of the workload's feasible requests at one rate, `repeats` times with different seeds."""

    groups: int = 4
    repeats: int = 2
    trial_seconds: float = 300.0
    arrivals: ArrivalShape = "steady"
    """Steady arrivals measure the group on the workload's mix; `trace` measures it on the trace's
    shape too (see the module's docstring)."""
    refinements: int = 4
    min_requests_per_class: int = 50
    """A class with fewer requests (pooled over repeats) in a trial cannot be judged at that rate."""
    lowest_rate_fraction: float = 1e-3
    """How far below the first guess the search goes before it gives up."""

    trial_ttft_multiple: float = 50.0
    """A trial offers arrivals for at least this many times the tightest TTFT target (see
    `trial_seconds_for`)."""

    def trial_seconds_for(self, classes: Sequence[ClassTargets], span_seconds: float) -> float:
        """How long each trial offers arrivals: at least `trial_seconds`, and `trial_ttft_multiple`
        times the tightest TTFT target, but never longer than the workload, which cannot offer more.

        Why: a fleet a little above its capacity first fills its running batches (decode slows,
        within a loose ITL target), and only then builds a queue that grows by the overload's share
        of every second; a request behind it misses a TTFT target T some tens of T after the trial
        starts. A shorter trial passes rates the fleet cannot sustain. On steady arrivals under a
        20 s target, trials of 120 s, 300 s and 900 s passed 72, 65 and 62 requests per second per
        group, and 1,800 s trials 62 again; with 240 s trials, a 70B fleet under a 60 s target passed
        18.5 where whole-window trials pass 10.6. A 1 s target keeps the configured trial."""
        tightest_ttft_seconds = min((targets.ttft_seconds for targets in classes), default=0.0)
        needed = max(self.trial_seconds, self.trial_ttft_multiple * tightest_ttft_seconds)
        return min(needed, max(self.trial_seconds, span_seconds))


def _trial(
    fleet: FleetConfig,
    workload: Workload,
    classes: Sequence[ClassTargets],
    rate_per_group: float,
    *,
    search: EnvelopeSearch,
    seed: int,
) -> EnvelopeTrial:
    from goodput.simulator.baselines import FixedFleet
    from goodput.simulator.report import judge
    from goodput.simulator.simulation import SimulationConfig, simulate

    met = np.zeros(len(classes), np.int64)
    offered = np.zeros(len(classes), np.int64)
    total = 0
    for repeat in range(search.repeats):
        sample = trial_workload(
            workload, rate_per_group * search.groups, search.trial_seconds, seed + repeat, search.arrivals
        )
        if len(sample) == 0:
            continue
        config = SimulationConfig(
            fleet=fleet, seed=seed + repeat, initial_groups=search.groups, tail_seconds=300.0
        )
        result = simulate(sample, config, FixedFleet(search.groups))
        verdicts = judge(result, tuple(classes))
        index = sample.class_index if sample.class_index is not None else np.zeros(len(sample), np.int64)
        met += np.bincount(index[verdicts.met], minlength=len(classes))[: len(classes)]
        offered += np.bincount(index, minlength=len(classes))[: len(classes)]
        total += len(sample)
    passed = all(
        offered[number] == 0 or met[number] / offered[number] >= targets.attainment
        for number, targets in enumerate(classes)
    )
    return EnvelopeTrial(rate_per_group, total, tuple(met.tolist()), tuple(offered.tolist()), passed)


def _too_thin(trial: EnvelopeTrial, search: EnvelopeSearch) -> bool:
    return (
        any(0 < offered < search.min_requests_per_class for offered in trial.offered) or trial.requests == 0
    )


def _not_found(
    trials: Sequence[EnvelopeTrial], classes: Sequence[ClassTargets], why: str
) -> EnvelopeNotFoundError:
    lowest = min(trials, key=lambda trial: trial.rate_per_group)
    failing = [
        f"{targets.name} reached {lowest.attainment(number):.3f} against attainment {targets.attainment:g}"
        for number, targets in enumerate(classes)
        if lowest.offered[number] and lowest.attainment(number) < targets.attainment
    ]
    tried = ", ".join(
        f"{trial.rate_per_group:.3g}" for trial in sorted(trials, key=lambda t: t.rate_per_group)
    )
    return EnvelopeNotFoundError(
        f"no capacity envelope: {why}; at the lowest rate ({lowest.rate_per_group:.3g} req/s per group, "
        f"{lowest.requests} requests) {'; '.join(failing) or 'every class passed'}; rates tried per group: "
        f"{tried}"
    )


def measure_envelope(
    fleet: FleetConfig,
    workload: Workload,
    classes: Sequence[ClassTargets],
    *,
    pricing: WorkPricing,
    first_guess_rate_per_group: float,
    search: EnvelopeSearch = EnvelopeSearch(),
    seed: int = 0,
) -> CapacityEnvelope:
    """The highest arrival rate per group at which a fleet of `search.groups` groups behind the router
    meets every class's attainment on `workload` (which should hold feasible requests only).

    Brackets the rate from the first guess by factors of `BRACKET_FACTOR`, then bisects geometrically.
    Each trial is as long as `EnvelopeSearch.trial_seconds_for` says for the classes. The figure
    is the highest rate that passed; the lowest that failed is its upper bound at the search's
    resolution, and the pooled attainment at the figure carries a 95 % Wilson lower bound per class.
    A rate whose trial holds too few requests of a class cannot be judged, and the search raises
    rather than report a figure no trial supports.
    """
    if len(workload) == 0:
        raise EnvelopeNotFoundError("no capacity envelope: the workload holds no feasible request")
    trial_fleet = replace(
        fleet,
        min_groups=search.groups,
        max_groups=search.groups,
        failure_rate_per_group_hour=0.0,
        scheduled_failures_seconds=(),
    )
    search = replace(search, trial_seconds=search.trial_seconds_for(classes, workload.span_seconds))
    trials = _Trials(trial_fleet, workload, classes, search, seed)
    low, high = _bracket(trials, first_guess_rate_per_group, search)
    for _ in range(search.refinements):
        middle = math.sqrt(low * high)
        if trials.run(middle).passed:
            low = middle
        else:
            high = middle
    best = trials.by_rate[low]
    mean_work = float(request_work_seconds(pricing, workload).mean())
    bounds = tuple(
        wilson_lower_bound(best.met[number], best.offered[number]) for number in range(len(classes))
    )
    return CapacityEnvelope(
        work_seconds_per_second=low * mean_work,
        requests_per_second=low,
        attainment_goal=min(targets.attainment for targets in classes),
        trials=len(trials.by_rate),
        failing_requests_per_second=high,
        groups=search.groups,
        repeats=search.repeats,
        trial_seconds=search.trial_seconds,
        attainment_lower_bounds=bounds,
        trial_log=tuple(sorted(trials.by_rate.values(), key=lambda trial: trial.rate_per_group)),
        arrivals=search.arrivals,
    )


class _Trials:
    """The envelope search's trials, one per rate tried, each run once."""

    def __init__(
        self,
        fleet: FleetConfig,
        workload: Workload,
        classes: Sequence[ClassTargets],
        search: EnvelopeSearch,
        seed: int,
    ) -> None:
        self.fleet, self.workload, self.classes, self.search, self.seed = (
            fleet,
            workload,
            classes,
            search,
            seed,
        )
        self.by_rate: dict[float, EnvelopeTrial] = {}

    def run(self, rate: float) -> EnvelopeTrial:
        """The trial at `rate` requests per second per group; a trial too thin to judge ends the search."""
        if rate not in self.by_rate:
            search = self.search
            self.by_rate[rate] = _trial(
                self.fleet, self.workload, self.classes, rate, search=search, seed=self.seed
            )
            if _too_thin(self.by_rate[rate], search):
                raise _not_found(
                    list(self.by_rate.values()),
                    self.classes,
                    f"too few requests to judge at {rate:.3g} req/s per group (fewer than "
                    f"{search.min_requests_per_class} of a class in {search.repeats} x "
                    f"{search.trial_seconds:g} s); "
                    "a longer trace or a longer trial would",
                )
        return self.by_rate[rate]


def _bracket(trials: _Trials, guess: float, search: EnvelopeSearch) -> tuple[float, float]:
    """A passing and a failing rate a factor `BRACKET_FACTOR` apart, stepping from the first guess."""
    if trials.run(guess).passed:
        low = guess
        while trials.run(low * BRACKET_FACTOR).passed and low < 1e5:
            low *= BRACKET_FACTOR
        return low, low * BRACKET_FACTOR
    high = guess
    while not trials.run(high / BRACKET_FACTOR).passed:
        high /= BRACKET_FACTOR
        if high < guess * search.lowest_rate_fraction:
            raise _not_found(list(trials.by_rate.values()), trials.classes, "no rate tried met the SLO")
    return high / BRACKET_FACTOR, high


def demand_groups(
    workload: Workload,
    work_seconds: np.ndarray,
    envelope: CapacityEnvelope,
    smoothing_seconds: float = 30.0,
) -> np.ndarray:
    """Groups needed at each second: trailing-window work arrival rate over the envelope."""
    span = math.ceil(workload.span_seconds) + 1
    per_request = work_seconds
    per_second = np.bincount(workload.arrival_seconds.astype(np.int64), weights=per_request, minlength=span)
    window = max(1, int(smoothing_seconds))
    cumulative = np.concatenate(([0.0], np.cumsum(per_second)))
    trailing = (cumulative[window:] - cumulative[:-window]) / window
    rates = np.concatenate((cumulative[1:window] / window, trailing))[:span]
    return np.maximum(1, np.ceil(rates / envelope.work_seconds_per_second - 1e-9)).astype(np.int64)
