"""Value types of the scaling decision: policy, snapshot, state and decision.

The operator builds these from the SLOPolicy, the ModelGroup and Prometheus; the simulator builds
them from its fleet. Both hand them to `autoscale.decide`, so the policy evaluated offline is the
policy deployed. Every type is frozen; `decide` returns a new `DecisionState` for the next tick.

Names and defaults follow the SLOPolicy API (queueWork, slack, kvCache, goodput; HPA-shaped
scaleUp / scaleDown; HoldScaleIn | Freeze on stale metrics), with groups where the API says replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from goodput.api import slopolicy as api
from goodput.api.modelgroup import GroupState, ScheduledReplicas
from goodput.api.reasons import Guard, Signal
from goodput.controllers.autoscale.forecast import WorkForecaster
from goodput.controllers.autoscale.ready_time import ReadyTimeSource
from goodput.estimators.attainment import GoodputReport, Histogram
from goodput.estimators.capacity import CapacityProfile
from goodput.estimators.queueing import QueuedRequest


class Mode(StrEnum):
    """Active: decisions are applied. Advisory: computed and recorded, never applied. Frozen: the
    count is held whatever the signals say (the kill switch)."""

    ACTIVE = "Active"
    ADVISORY = "Advisory"
    FROZEN = "Frozen"


class StepPolicyType(StrEnum):
    GROUPS = "Groups"
    PERCENT = "Percent"


class SelectPolicy(StrEnum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


class StaleMetricsAction(StrEnum):
    """HoldScaleIn: never scale in, scale out only on what is still known. Freeze: change nothing."""

    HOLD_SCALE_IN = "HoldScaleIn"
    FREEZE = "Freeze"


# --- Policy -----------------------------------------------------------------------------------------

# goodput's defaults are the API's (api/slopolicy.py); the decision's value types read them from
# there instead of writing them a second time.
_API_AUTOSCALING = api.Autoscaling()
_API_SIGNALS = _API_AUTOSCALING.signals
_API_MODE = Mode(_API_AUTOSCALING.mode)
_API_ON_STALE = StaleMetricsAction(_API_AUTOSCALING.metrics.on_stale)
_API_INTERVAL_SECONDS = float(_API_AUTOSCALING.interval_seconds)
_API_MAX_AGE_SECONDS = float(_API_AUTOSCALING.metrics.max_age_seconds)


@dataclass(frozen=True, slots=True)
class SloTargets:
    """One request class's targets.

    attainment: the share of requests that must meet every target.
    percentile: the share of first-token times and of token gaps that must each be within target
    (the tail a mean TPOT hides).
    """

    name: str
    ttft_seconds: float
    itl_seconds: float
    attainment: float = api.SloClass.model_fields["attainment"].default
    percentile: float = api.SloClass.model_fields["percentile"].default


@dataclass(frozen=True, slots=True)
class QueueWorkSignal:
    """R = ceil((s·λ_w + Q/T_d) / C), Q the work queued for a group.

    Running requests are in Q_work's estimate but not in Q here: a sequence decodes one token per
    step however many groups there are, so more groups cannot drain it sooner; its work is already
    in λ_w. Counting it would ask for T_decode/T_d more groups at steady state.
    """

    drain_target_seconds: float = _API_SIGNALS.queue_work.drain_target_seconds
    safety_factor: float = _API_SIGNALS.queue_work.safety_factor


@dataclass(frozen=True, slots=True)
class SlackSignal:
    """Keep waiting requests' first-token slack above `min_slack_seconds`, all but a fraction.

    margin_seconds: U, the prediction uncertainty subtracted from every slack (§9).
    route_seconds: T_route, gateway and routing time inside the TTFT (§8).
    """

    min_slack_seconds: float = _API_SIGNALS.slack.min_slack_seconds
    low_slack_fraction: float = _API_SIGNALS.slack.low_slack_fraction
    margin_seconds: float = 0.0
    route_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class KvCacheSignal:
    min_free_fraction: float = _API_SIGNALS.kv_cache.min_free_fraction


@dataclass(frozen=True, slots=True)
class GoodputSignal:
    """The feedback signal: one more group while measured attainment misses the SLO and the misses
    come from load, which more groups relieve.

    The SLO is judged as it is defined: per request (the share of requests within the TTFT target,
    and within the ITL target on their TPOT) against `attainment_floor`, and per percentile (the
    class's percentile of first-token times and of token gaps) against the class's targets. Misses
    are load-driven when requests wait in the engine queue beyond the queue budget, or when the
    groups run more sequences than the ITL budget allows; a stall that every step with a long
    prefill chunk causes is not, and more groups would not remove it.

    Each scale-out is a trial: the signal waits until the added group has served a full metrics
    window, and after `max_fruitless_steps` consecutive scale-outs that did not raise the worst
    measure by more than its sampling error, it stops asking for more at that count.
    """

    attainment_floor: float = _API_SIGNALS.goodput.attainment_floor
    min_observations: int = 20
    max_fruitless_steps: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.attainment_floor <= 1:
            raise ValueError("attainment_floor must be in (0, 1]")
        if self.max_fruitless_steps < 1:
            raise ValueError("max_fruitless_steps must be at least 1")


@dataclass(frozen=True, slots=True)
class Signals:
    """The signals; None disables one."""

    queue_work: QueueWorkSignal | None = QueueWorkSignal()
    slack: SlackSignal | None = SlackSignal()
    kv_cache: KvCacheSignal | None = KvCacheSignal()
    goodput: GoodputSignal | None = GoodputSignal()


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """At most `value` groups (or percent of the groups at the period's start) per period."""

    type: StepPolicyType
    value: int
    period_seconds: float


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction's behaviour, in the HorizontalPodAutoscaler's shape."""

    tolerance: float = _API_AUTOSCALING.scale_up.tolerance
    stabilization_window_seconds: float = 0.0
    policies: tuple[StepPolicy, ...] = (StepPolicy(StepPolicyType.PERCENT, 100, 60.0),)
    select_policy: SelectPolicy = SelectPolicy.MAX

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")
        if self.stabilization_window_seconds < 0:
            raise ValueError("stabilization_window_seconds must not be negative")
        if not self.policies and self.select_policy is not SelectPolicy.DISABLED:
            raise ValueError("scaling rules need at least one step policy unless disabled")
        if any(policy.value < 1 or policy.period_seconds <= 0 for policy in self.policies):
            raise ValueError("step policies need a value >= 1 and a positive period")


def _api_rules(rules: api.ScalingRules) -> ScalingRules:
    """The API's default rules for one direction, as the decision reads them."""
    return ScalingRules(
        tolerance=rules.tolerance,
        stabilization_window_seconds=float(rules.stabilization_window_seconds),
        policies=tuple(
            StepPolicy(StepPolicyType(step.type), step.value, float(step.period_seconds))
            for step in rules.policies
        ),
        select_policy=SelectPolicy(rules.select_policy),
    )


def default_scale_up() -> ScalingRules:
    """The API's default: act at once; add up to 100 % or 4 groups a minute, whichever is more."""
    return _api_rules(_API_AUTOSCALING.scale_up)


def default_scale_down() -> ScalingRules:
    """The API's default: wait five minutes for a lower proposal to hold; drain one group a minute."""
    return _api_rules(_API_AUTOSCALING.scale_down)


@dataclass(frozen=True, slots=True)
class MetricStaleness:
    max_age_seconds: float = _API_MAX_AGE_SECONDS
    action: StaleMetricsAction = _API_ON_STALE


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """Everything a decision obeys: bounds, SLO targets, signals, behaviour and mode.

    classes: request classes; the first is the one engine histograms are judged against (vLLM's
    histograms carry no class), and per-request data uses each request's own class.
    """

    min_groups: int = 1
    max_groups: int = 10
    warm_groups: int = 0
    revision: str = ""
    mode: Mode = _API_MODE
    interval_seconds: float = _API_INTERVAL_SECONDS
    classes: tuple[SloTargets, ...] = (SloTargets("interactive", 2.0, 0.08),)
    signals: Signals = Signals()
    scale_up: ScalingRules = field(default_factory=default_scale_up)
    scale_down: ScalingRules = field(default_factory=default_scale_down)
    staleness: MetricStaleness = MetricStaleness()

    def __post_init__(self) -> None:
        if not 0 <= self.min_groups <= self.max_groups:
            raise ValueError("need 0 <= min_groups <= max_groups")
        if self.warm_groups < 0:
            raise ValueError("warm_groups must not be negative")
        if not self.classes:
            raise ValueError("a policy needs at least one SLO class")
        if any(target.ttft_seconds <= 0 or target.itl_seconds <= 0 for target in self.classes):
            raise ValueError("TTFT and ITL targets must be positive")
        if any(not (0 < target.attainment <= 1 and 0 < target.percentile <= 1) for target in self.classes):
            raise ValueError("attainment and percentile targets must be in (0, 1]")
        if self.interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")

    @property
    def primary_class(self) -> SloTargets:
        return self.classes[0]

    def targets_for(self, class_name: str) -> SloTargets:
        for target in self.classes:
            if target.name == class_name:
                return target
        return self.classes[0]


# --- Snapshot ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupMetrics:
    """One ready group's engine metrics (its leader's vLLM series), as of `age_seconds` ago: the one
    record of a group's engine figures. The operator fills it from its Prometheus answer, the
    simulator from its scrapes of the simulated engine (`goodput.simulator.goodput_policy`), and
    `snapshot.clamped` applies the one rule about raw figures before any decision reads them; the
    means and shares a decision reads are derived here, from the window's sums and counts, so no
    world can derive them its own way.

    Gauges are the latest values; rates, sums, counts and histograms cover the snapshot's metrics
    window (token rates, sums and counts its rate window).
    waiting_requests: vLLM's capacity backlog (num_requests_waiting_by_reason{reason="capacity"}).
    kv_usage_fraction: vllm:kv_cache_usage_perc, 0..1.
    prompt_tokens_sum / prompt_tokens_count: vllm:request_prompt_tokens' sum and count over the
    window, the prompts of finished requests; generation_tokens_sum / generation_tokens_count the
    same of vllm:request_generation_tokens.
    prompts_started / prompt_tokens_started: the requests whose first token came in the window
    (vllm:time_to_first_token_seconds' count) and their prompt tokens (vllm:prompt_tokens, which vLLM
    counts at the first token).
    prefix_hits / prefix_queries: prefix-cache hit and looked-up tokens over the window.
    ttft / itl / queue_time: window deltas of vLLM's histograms (its default buckets).
    tpot: window delta of vllm:request_time_per_output_token_seconds, one observation per finished
    request (its decode time over its tokens after the first); None where the engine does not export it.
    prompt_tokens: window delta of vllm:request_prompt_tokens, the prompt lengths of finished
    requests (what the infeasible share is estimated from).
    prompt_tokens_lookback: the same over a longer lookback, read only when no group finished a
    prompt within the window (a backlog of long prefills can finish nothing for a whole window, and a
    missed scrape leaves a short window without the two samples a delta needs).
    finished_requests: finished with stop or length; aborted_requests: abort or error;
    rejected_requests: admission rejections (HTTP 503s).
    """

    age_seconds: float
    waiting_requests: float = 0.0
    running_requests: float = 0.0
    kv_usage_fraction: float = 0.0
    prompt_tokens_per_second: float = 0.0
    generation_tokens_per_second: float = 0.0
    prompt_tokens_sum: float = 0.0
    prompt_tokens_count: float = 0.0
    prompts_started: float = 0.0
    prompt_tokens_started: float = 0.0
    generation_tokens_sum: float = 0.0
    generation_tokens_count: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    ttft: Histogram | None = None
    itl: Histogram | None = None
    queue_time: Histogram | None = None
    tpot: Histogram | None = None
    prompt_tokens: Histogram | None = None
    prompt_tokens_lookback: Histogram | None = None
    finished_requests: float = 0.0
    aborted_requests: float = 0.0
    rejected_requests: float = 0.0

    @property
    def mean_input_tokens(self) -> float | None:
        """The mean prompt of the requests the prompt rate counts: those whose first token fell in the
        window. The finished requests' mean stands in where the engine exported no first-token count;
        it lags a change of prompt lengths by a request's lifetime. None when nothing was counted."""
        if self.prompts_started > 0 and self.prompt_tokens_started > 0:
            return self.prompt_tokens_started / self.prompts_started
        return _per(self.prompt_tokens_sum, self.prompt_tokens_count)

    @property
    def mean_output_tokens(self) -> float | None:
        """Output tokens per finished request over the window; None when none finished."""
        return _per(self.generation_tokens_sum, self.generation_tokens_count)

    @property
    def prefix_hit_fraction(self) -> float:
        """Prefix-cache hits / queries over the window, within 0..1 (0 without a query). NaN stays
        NaN: a figure nobody can trust is kept visible to the missing-metrics guard."""
        share = _per(self.prefix_hits, self.prefix_queries)
        if share is None:
            return 0.0
        return share if math.isnan(share) else min(1.0, max(0.0, share))

    @property
    def unfinished_prompts(self) -> float:
        """Requests whose first token came in the window less those whose prompt length reached the
        histogram (at their finish), floored at 0: prompts begun and not finished, whose lengths
        `prompt_tokens` cannot hold yet (a long prompt's decode can last minutes)."""
        return max(0.0, self.prompts_started - self.prompt_tokens_count)

    @property
    def unfinished_prompt_tokens(self) -> float:
        """The prompt tokens of `unfinished_prompts`, floored at 0."""
        return max(0.0, self.prompt_tokens_started - self.prompt_tokens_sum)


def _per(numerator: float, denominator: float) -> float | None:
    """A mean over the window; None when nothing was counted."""
    return numerator / denominator if denominator > 0 else None


@dataclass(frozen=True, slots=True)
class GroupObservation:
    """One complete replica group. Only Ready groups are capacity; metrics are read from them only."""

    name: str
    state: GroupState
    created_at: float
    unschedulable: bool = False
    metrics: GroupMetrics | None = None


@dataclass(frozen=True, slots=True)
class RequestQueue:
    """Exact queue contents from a gateway: waiting requests in dispatch order, and running ones."""

    requests: tuple[QueuedRequest, ...]
    age_seconds: float


@dataclass(frozen=True, slots=True)
class GatewayClassFigures:
    """One SLO class as the gateway in front of a ModelGroup counts it (exact, per request).

    waiting_*: requests held in the gateway's fair queue now (not yet dispatched to a group), their
    prompt tokens and predicted work; earliest_slack_seconds: the least first-token slack of any of
    them (None when none waits). The counts and histograms cover the snapshot's metrics window:
    offered (every request that reached admission with a readable body), admitted (admitted,
    deferred or degraded: it proceeded), rejected (429 or 503), infeasible (its zero-load floor
    misses the class, counted apart), attaining / missed (answered within every target of the class,
    or not; best-effort service is neither).
    """

    class_name: str
    waiting_requests: float = 0.0
    waiting_prompt_tokens: float = 0.0
    waiting_work_seconds: float = 0.0
    earliest_slack_seconds: float | None = None
    offered_requests: float = 0.0
    admitted_requests: float = 0.0
    rejected_requests: float = 0.0
    infeasible_requests: float = 0.0
    attaining_requests: float = 0.0
    missed_requests: float = 0.0
    ttft: Histogram | None = None
    itl: Histogram | None = None
    recent_offered_per_second: float | None = None
    """Offered requests per second over the recent rate window (the token rates' window, shorter
    than the goodput window): how a burst shows within an interval or two. None: not exported."""

    def __post_init__(self) -> None:
        for name in (
            "waiting_requests",
            "waiting_prompt_tokens",
            "waiting_work_seconds",
            "offered_requests",
            "admitted_requests",
            "rejected_requests",
            "infeasible_requests",
            "attaining_requests",
            "missed_requests",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} of class {self.class_name!r} must be finite and >= 0, got {value}")
        recent = self.recent_offered_per_second
        if recent is not None and not (math.isfinite(recent) and recent >= 0):
            raise ValueError(f"recent_offered_per_second of {self.class_name!r} must be >= 0, got {recent}")


@dataclass(frozen=True, slots=True)
class GatewayObservation:
    """What the gateway in front of a ModelGroup reports, as of `age_seconds` ago (DESIGN §6 step 2).

    With a gateway, demand is known exactly where engines only let it be inferred: the requests it
    holds (also at zero groups, where no engine reports anything), the work in flight on the groups
    (which covers the engines' waiting and running requests), and every offered request's outcome.
    running_requests / running_work_seconds: dispatched to a group and not answered yet.
    routable_groups: the groups the gateway routes to (Ready, not draining).
    kept_session_kv_tokens: KV that sessions waiting on a tool hold in the groups' GPU memory for
    their next request (kept, not offloaded): in no engine's usage figure (a finished request's
    blocks count as free), yet not free for anyone else.
    """

    age_seconds: float
    classes: tuple[GatewayClassFigures, ...] = ()
    running_requests: float = 0.0
    running_work_seconds: float = 0.0
    routable_groups: int = 0
    kept_session_kv_tokens: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.age_seconds):
            raise ValueError(f"age_seconds must be finite, got {self.age_seconds}")
        if self.running_requests < 0 or self.running_work_seconds < 0 or self.routable_groups < 0:
            raise ValueError("running requests, running work and routable groups must not be negative")
        if not (math.isfinite(self.kept_session_kv_tokens) and self.kept_session_kv_tokens >= 0):
            raise ValueError(
                f"kept_session_kv_tokens must be finite and >= 0, got {self.kept_session_kv_tokens}"
            )

    def figures_for(self, class_name: str) -> GatewayClassFigures | None:
        return next((entry for entry in self.classes if entry.class_name == class_name), None)

    @property
    def waiting_requests(self) -> float:
        return sum(entry.waiting_requests for entry in self.classes)

    @property
    def waiting_work_seconds(self) -> float:
        return sum(entry.waiting_work_seconds for entry in self.classes)

    @property
    def waiting_prompt_tokens(self) -> float:
        return sum(entry.waiting_prompt_tokens for entry in self.classes)

    @property
    def earliest_slack_seconds(self) -> float | None:
        slacks = [e.earliest_slack_seconds for e in self.classes if e.earliest_slack_seconds is not None]
        return min(slacks) if slacks else None


@dataclass(frozen=True, slots=True)
class ClassFeasibility:
    """How much of one class's demand no number of groups of this shape can serve within its SLO.

    longest_feasible_prompt_tokens: the longest prompt whose idle-group TTFT floor (net of the
    expected prefix-cache hits) fits the class's TTFT target; 0 when no request can meet the class.
    infeasible_request_share / infeasible_token_share: the share of requests, and of prompt tokens,
    in prompts past it; None when unknown (no prompt lengths observed), which the decision reads as
    "all feasible": unknown never invents infeasibility.
    unmet_field: the class's field that no request can meet (`ttftSeconds`, `itlSeconds`), when the
    threshold is 0.
    """

    class_name: str
    longest_feasible_prompt_tokens: int
    infeasible_request_share: float | None = None
    infeasible_token_share: float | None = None
    unmet_field: str | None = None

    def __post_init__(self) -> None:
        if self.longest_feasible_prompt_tokens < 0:
            raise ValueError("longest_feasible_prompt_tokens must not be negative")
        for name in ("infeasible_request_share", "infeasible_token_share"):
            share = getattr(self, name)
            if share is not None and not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {share}")

    @property
    def feasible_request_fraction(self) -> float:
        """The share of requests the signals count: everything while unknown, nothing when no
        request can meet the class."""
        if self.longest_feasible_prompt_tokens == 0:
            return 0.0
        return 1.0 - (self.infeasible_request_share or 0.0)

    @property
    def feasible_token_fraction(self) -> float:
        if self.longest_feasible_prompt_tokens == 0:
            return 0.0
        return 1.0 - (self.infeasible_token_share or 0.0)

    def admits(self, prompt_tokens: int) -> bool:
        """Whether a prompt of this length can meet the class's TTFT on an idle group."""
        return (
            self.longest_feasible_prompt_tokens > 0 and prompt_tokens <= self.longest_feasible_prompt_tokens
        )


class CapacitySource(StrEnum):
    """Where the capacity a decision uses comes from (`status.capacity.source`).

    prior: the service-time model (or the catalogue behind it); learnt: the prior refined from the
    ModelGroup's own engines (`capacity_learner`); measured: the team's
    `profile.capacityWorkSecondsPerSecond`, used as given unless the ModelGroup opts into learning."""

    PRIOR = "prior"
    LEARNT = "learnt"
    MEASURED = "measured"


@dataclass(frozen=True, slots=True)
class LearntCapacity:
    """The capacity C at the profile's reference mix a decision uses, where it comes from and why.

    confidence: 0 for a prior nothing has confirmed, growing towards 1 with evidence (1 for a
    measured figure). evidence_start / evidence_end: the window of the evidence behind a learnt
    value (None without evidence)."""

    source: CapacitySource
    work_seconds_per_second: float
    confidence: float
    evidence_start: float | None = None
    evidence_end: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelGroupSnapshot:
    """One ModelGroup at one instant: its groups, their metrics, and its capacity profile.

    spec_replicas: the complete groups currently wanted (spec.replicas); the decision's current count.
    feasibility: per SLO class, the feasible threshold and the infeasible share of the demand
    (`controllers.autoscale.feasible_demand.assess`); a class without an entry has all its demand counted.
    gateway: the gateway's figures when one fronts the ModelGroup; they replace what is inferred
    from engine metrics (queue, slack, attainment against offered requests).
    group_ready_seconds: how long a group asked for now takes to become capacity
    (`controllers.autoscale.ready_time.estimate_ready_time`); None while unknown.
    group_ready_source: where that figure comes from: "prior" (the declared readyTimeSeconds) or
    "measured" (the ModelGroup's recent groups); None while unknown.
    capacity: where the profile's capacity comes from (prior, learnt, measured), carried into the
    decision and its record.
    replica_schedule: `spec.replicaSchedule`, the floors a team set by time of day.
    forecaster: the offered work's history fitted one ready time ahead (`forecast.fit_forecaster`);
    None: no forecast (not asked for, or the history gives none), the decision only reacts.
    """

    spec_replicas: int
    groups: tuple[GroupObservation, ...]
    profile: CapacityProfile
    name: str = ""
    metrics_window_seconds: float = 60.0
    queue: RequestQueue | None = None
    feasibility: tuple[ClassFeasibility, ...] = ()
    gateway: GatewayObservation | None = None
    group_ready_seconds: float | None = None
    group_ready_source: ReadyTimeSource | None = None
    capacity: LearntCapacity | None = None
    """The capacity in `profile` and its source; None: the profile's, not said."""
    replica_schedule: tuple[ScheduledReplicas, ...] = ()
    forecaster: WorkForecaster | None = None

    def __post_init__(self) -> None:
        if self.spec_replicas < 0:
            raise ValueError("spec_replicas must not be negative")

    def feasibility_for(self, class_name: str) -> ClassFeasibility | None:
        return next((entry for entry in self.feasibility if entry.class_name == class_name), None)


# --- State ------------------------------------------------------------------------------------------


class Recommendation(NamedTuple):
    """A tick's recommendation before stabilisation, for the stabilisation windows."""

    at: float
    groups: int


class QueueReading(NamedTuple):
    """A tick's waiting work, for how fast the queue grows between ticks."""

    at: float
    waiting_work_seconds: float


class ScaleEvent(NamedTuple):
    """A change that was applied: `groups` added (scale-up events) or removed (scale-down events)."""

    at: float
    groups: int


@dataclass(frozen=True, slots=True)
class SloCheck:
    """One SLO condition as measured: the share within target, the share required, and how many
    independent observations the share rests on (for its sampling error)."""

    name: str
    within: float
    required: float
    observations: float
    read_at_seconds: float | None = None
    """The bucket bound the share was read at, when the target lies inside a histogram bucket: only
    observations past it count as misses (None: read at the target itself)."""

    @property
    def shortfall(self) -> float:
        """How far the share is below what is required (negative: met with room to spare)."""
        return self.required - self.within


@dataclass(frozen=True, slots=True)
class GoodputTrial:
    """The goodput signal's last scale-out and what it has shown so far.

    groups: the count it scaled out to; the trial holds only while the count stays there (any
    other change makes its evidence about another fleet).
    baseline: the worst SLO check when it acted, to compare the same check against afterwards.
    settled_at: the first tick at which all `groups` groups were ready (None: not yet). Evidence
    counts only from a metrics window that starts after it.
    judged: whether the scale-out has been judged; fruitless: how many consecutive goodput
    scale-outs, this one included once judged, brought no improvement.
    """

    groups: int
    baseline: SloCheck
    acted_at: float
    settled_at: float | None = None
    judged: bool = False
    fruitless: int = 0


@dataclass(frozen=True, slots=True)
class DecisionState:
    """What a decision remembers between ticks: recent recommendations and applied changes, and the
    goodput signal's trial."""

    recommendations: tuple[Recommendation, ...] = ()
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()
    started: bool = False
    goodput_trial: GoodputTrial | None = None
    queue_readings: tuple[QueueReading, ...] = ()

    @classmethod
    def initial(cls) -> DecisionState:
        return cls()


# --- Decision ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proposal:
    """One signal's count. `value` is the signal's own measure (see `detail`); `demand_groups` is the
    fractional demand of a proportional signal, to which the tolerance band applies."""

    signal: Signal
    groups: int
    value: float | None
    detail: str
    demand_groups: float | None = None


@dataclass(frozen=True, slots=True)
class GroupCounts:
    current: int
    ready: int
    coming: int
    draining: int
    failed: int
    unschedulable: int
    fresh_metrics: int
    stale_metrics: int
    missing_metrics: int
    gateway_fresh: bool = False
    gateway_stale: bool = False


@dataclass(frozen=True, slots=True)
class Estimates:
    """The SLO math behind a decision. Work is in work-seconds (engine seconds of one group).

    None means unknown (no fresh data). `predicted_queue_wait_seconds` is infinite when work waits
    and no group serves it.

    ttft / itl / tpot_attainment: shares within the primary class's targets (of requests, of token
    gaps, of requests by their TPOT); itl_tail_seconds: the token gap at the class percentile.
    queue_within_budget: share of requests whose engine queue time was within the queue budget.
    running_per_group / slo_batch_per_group: sequences each fresh group runs, and the most its steps
    carry within the ITL budget for this mix. slo_checks: the goodput signal's SLO conditions with
    enough observations; load_driven: whether their misses come from load (None: nothing missed).
    Every demand figure (rates, queued work, KV, the mix) is of feasible demand only: the share of
    it past a class's feasible threshold (`feasibility`, as the snapshot carried it) is set aside.
    """

    mean_input_tokens: float
    mean_output_tokens: float
    capacity_per_group: float
    waiting_requests: float | None
    running_requests: float | None
    arrival_work_rate: float | None
    queue_work_seconds: float | None
    waiting_work_seconds: float | None
    running_work_seconds: float | None
    waiting_work_seconds_p90: float | None
    predicted_queue_wait_seconds: float | None
    queue_budget_seconds: float
    earliest_slack_seconds: float | None
    low_slack_fraction: float | None
    kv_demand_tokens: float | None
    kv_free_fraction: float | None
    ttft_attainment: float | None
    itl_attainment: float | None
    queue_time_p90_seconds: float | None
    goodput: GoodputReport | None
    tpot_attainment: float | None = None
    itl_tail_seconds: float | None = None
    queue_within_budget: float | None = None
    running_per_group: float | None = None
    slo_batch_per_group: float | None = None
    slo_checks: tuple[SloCheck, ...] = ()
    load_driven: bool | None = None
    feasibility: tuple[ClassFeasibility, ...] = ()
    waiting_work_at_ready_seconds: float | None = None
    """Of the waiting work, what will still wait when a group asked for now is ready (the serving
    groups drain the rest first): the backlog more groups can serve. None: unknown."""
    group_ready_seconds: float | None = None
    group_ready_source: ReadyTimeSource | None = None
    """Where `group_ready_seconds` comes from: "prior" (declared) or "measured" (recent groups)."""
    served_work_rate: float | None = None
    """What the fresh engines served over the metrics window (`arrival_work_rate` is made of it, the
    gateway's `offered_work_rate` and the queue's `queue_growth_work_rate`:
    `controllers.autoscale.arrival`)."""
    offered_work_rate: float | None = None
    queue_growth_work_rate: float | None = None


def _json_number(value: float | None) -> float | None:
    """Finite numbers to 6 significant digits; unknown and infinite values as null."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one tick.

    reason: the guard that last changed the count, or else the winning signal.
    signal: the winning signal (the largest proposal).
    applies: True only in Active mode; Advisory and Frozen decisions are recorded, not applied.
    """

    desired_groups: int
    current_groups: int
    reason: str
    signal: Signal
    proposals: tuple[Proposal, ...]
    guards: tuple[Guard, ...]
    estimates: Estimates
    counts: GroupCounts
    next_state: DecisionState
    policy_revision: str
    mode: Mode
    applies: bool
    time: float
    model_group: str
    slo: SloTargets
    capacity: LearntCapacity | None = None
    """The capacity the decision used and its source (the snapshot's)."""

    @property
    def changes(self) -> bool:
        return self.applies and self.desired_groups != self.current_groups

    def to_record(self) -> dict[str, object]:
        """The decision as a JSON-ready log record (§38): inputs, estimates, proposals, result,
        reason and policy revision, without any request content."""
        estimates = self.estimates
        counts = self.counts
        return {
            "model_group": self.model_group,
            "time": self.time,
            "policy_revision": self.policy_revision,
            "mode": str(self.mode),
            "slo_ms": {
                "class": self.slo.name,
                "ttft": _json_number(self.slo.ttft_seconds * 1000),
                "itl": _json_number(self.slo.itl_seconds * 1000),
            },
            "inputs": _inputs_record(counts, estimates),
            "estimates": _estimates_record(estimates),
            "proposals": [
                {
                    "signal": str(proposal.signal),
                    "groups": proposal.groups,
                    "value": _json_number(proposal.value),
                    "detail": proposal.detail,
                }
                for proposal in self.proposals
            ],
            "result": {
                "desired_groups": self.desired_groups,
                "current_groups": self.current_groups,
                "applies": self.applies,
                "signal": str(self.signal),
                "guards": [str(guard) for guard in self.guards],
            },
            "reason": self.reason,
            "capacity": _capacity_record(self.capacity),
        }


def _capacity_record(capacity: LearntCapacity | None) -> dict[str, object] | None:
    """The capacity a decision used: its source, value and confidence, and the evidence window."""
    if capacity is None:
        return None
    return {
        "source": str(capacity.source),
        "work_seconds_per_second": _json_number(capacity.work_seconds_per_second),
        "confidence": _json_number(capacity.confidence),
        "evidence_start": _json_number(capacity.evidence_start),
        "evidence_end": _json_number(capacity.evidence_end),
        "reason": capacity.reason,
    }


def _inputs_record(counts: GroupCounts, estimates: Estimates) -> dict[str, object]:
    """A decision record's inputs: the group counts and the requests the engines hold."""
    return {
        "current_groups": counts.current,
        "ready_groups": counts.ready,
        "coming_groups": counts.coming,
        "draining_groups": counts.draining,
        "failed_groups": counts.failed,
        "unschedulable_groups": counts.unschedulable,
        "fresh_metrics_groups": counts.fresh_metrics,
        "stale_metrics_groups": counts.stale_metrics,
        "missing_metrics_groups": counts.missing_metrics,
        "gateway": "fresh" if counts.gateway_fresh else "stale" if counts.gateway_stale else "none",
        "waiting_requests": _json_number(estimates.waiting_requests),
        "running_requests": _json_number(estimates.running_requests),
    }


def _estimates_record(estimates: Estimates) -> dict[str, object]:
    """A decision record's estimates: every figure a signal read, the SLO checks, the feasibility
    of the demand and the goodput report."""
    figures = {
        "mean_input_tokens": estimates.mean_input_tokens,
        "mean_output_tokens": estimates.mean_output_tokens,
        "capacity_work_per_second_per_group": estimates.capacity_per_group,
        "arrival_work_rate": estimates.arrival_work_rate,
        "served_work_rate": estimates.served_work_rate,
        "offered_work_rate": estimates.offered_work_rate,
        "queue_growth_work_rate": estimates.queue_growth_work_rate,
        "queue_work_seconds": estimates.queue_work_seconds,
        "waiting_work_seconds": estimates.waiting_work_seconds,
        "running_work_seconds": estimates.running_work_seconds,
        "waiting_work_seconds_p90": estimates.waiting_work_seconds_p90,
        "waiting_work_at_ready_seconds": estimates.waiting_work_at_ready_seconds,
        "group_ready_seconds": estimates.group_ready_seconds,
        "predicted_queue_wait_seconds": estimates.predicted_queue_wait_seconds,
        "queue_budget_seconds": estimates.queue_budget_seconds,
        "earliest_slack_seconds": estimates.earliest_slack_seconds,
        "low_slack_fraction": estimates.low_slack_fraction,
        "kv_demand_tokens": estimates.kv_demand_tokens,
        "kv_free_fraction": estimates.kv_free_fraction,
        "ttft_attainment": estimates.ttft_attainment,
        "itl_attainment": estimates.itl_attainment,
        "tpot_attainment": estimates.tpot_attainment,
        "itl_tail_seconds": estimates.itl_tail_seconds,
        "queue_time_p90_seconds": estimates.queue_time_p90_seconds,
        "queue_within_budget": estimates.queue_within_budget,
        "running_per_group": estimates.running_per_group,
        "slo_batch_per_group": estimates.slo_batch_per_group,
    }
    record: dict[str, object] = {name: _json_number(value) for name, value in figures.items()}
    # Which ready time the look ahead used: "prior" (declared) or "measured"; None while unknown.
    record["group_ready_source"] = estimates.group_ready_source
    record["slo_checks"] = [
        {
            "name": check.name,
            "within": _json_number(check.within),
            "required": _json_number(check.required),
            "observations": _json_number(check.observations),
            "read_at_seconds": _json_number(check.read_at_seconds),
        }
        for check in estimates.slo_checks
    ]
    record["load_driven"] = estimates.load_driven
    record["feasibility"] = [
        {
            "class": entry.class_name,
            "longest_feasible_prompt_tokens": entry.longest_feasible_prompt_tokens,
            "infeasible_request_share": _json_number(entry.infeasible_request_share),
            "infeasible_token_share": _json_number(entry.infeasible_token_share),
            "unmet_field": entry.unmet_field,
        }
        for entry in estimates.feasibility
    ]
    record["goodput"] = _goodput_record(estimates.goodput)
    return record


def _goodput_record(goodput: GoodputReport | None) -> dict[str, object] | None:
    """The §5 report: attaining requests against the offered, admitted and feasible populations."""
    if goodput is None:
        return None
    figures = {
        "window_seconds": goodput.window_seconds,
        "offered_requests": goodput.offered_requests,
        "admitted_requests": goodput.admitted_requests,
        "rejected_requests": goodput.rejected_requests,
        "attaining_requests": goodput.attaining_requests,
        "attainment_admitted": goodput.attainment_admitted,
        "attainment_offered": goodput.attainment_offered,
        "feasible_requests": goodput.feasible_requests,
        "attainment_attainable": goodput.attainment_attainable,
        "request_goodput_per_second": goodput.request_goodput_per_second,
        "token_goodput_per_second": goodput.token_goodput_per_second,
    }
    return {name: _json_number(value) for name, value in figures.items()}
