"""SLOPolicy (goodput.dev/v1alpha1): the service-level contract and the control behaviour around it.

A policy says what "good" means per request class (TTFT, inter-token latency, completion,
attainment) and how the autoscaler may move toward it (signals, tolerance, stabilisation, step
limits, metric staleness). `revision` is an opaque string a pipeline bumps on every change; each
decision records it, so every scaling action names the policy that made it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from goodput.api.base import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    CelRule,
    ObjectMeta,
    SpecModel,
    StatusModel,
    list_map,
)
from goodput.api.conditions import Condition

AutoscalingMode = Literal["Active", "Advisory", "Frozen"]


def _positive(field: str, python_name: str, *, optional: bool = False) -> CelRule:
    """`field` > 0, reported at the field (an optional field is checked only when set)."""
    rule = f"self.{field} > 0.0"
    if optional:
        rule = f"!has(self.{field}) || {rule}"
    return CelRule(
        rule=rule,
        message=f"`{field}` must be greater than zero",
        field_path=f".{field}",
        check=lambda model: (value := getattr(model, python_name)) is None or value > 0,
    )


def _fraction(field: str, python_name: str, example: str) -> CelRule:
    """0 < `field` <= 1, reported at the field."""
    return CelRule(
        rule=f"self.{field} > 0.0 && self.{field} <= 1.0",
        message=f"`{field}` must be greater than 0 and at most 1 (for example {example})",
        field_path=f".{field}",
        check=lambda model: 0 < getattr(model, python_name) <= 1,
    )


class SessionBudget(SpecModel):
    """What one session (a root request and every branch it fans out to) may spend, reserved at the
    root and inherited by each child (an agent's query rewrites, tool summaries, retries and
    candidates); absent fields: no limit on that dimension."""

    cel_rules = (
        CelRule(
            rule="has(self.tokens) || has(self.branches) || has(self.wallClockSeconds)",
            message="`sessionBudget` must set at least one of `tokens`, `branches`, `wallClockSeconds`",
            check=lambda budget: any(
                value is not None for value in (budget.tokens, budget.branches, budget.wall_clock_seconds)
            ),
        ),
    )

    tokens: int | None = Field(default=None, ge=1, le=1_000_000_000)
    """Prompt plus output tokens of all the session's requests, the root included."""
    branches: int | None = Field(default=None, ge=1, le=100_000)
    """Requests the session may make, the root included."""
    wall_clock_seconds: float | None = Field(default=None, gt=0, le=86400)
    """From the root's arrival to the session's deadline: then its children in flight are cancelled
    together and new ones refused."""


DegradeRung = Literal["CapOutput", "DropOptionalContext", "Fallback", "AsyncBatch", "Reject"]


def _ladder_rules() -> tuple[CelRule, ...]:
    return (
        CelRule(
            rule="self.rungs.all(r, self.rungs.exists_one(o, o == r))",
            message="`degrade.rungs` must name each rung at most once",
            field_path=".rungs",
            check=lambda ladder: len(set(ladder.rungs)) == len(ladder.rungs),
        ),
        CelRule(
            rule="!self.rungs.exists(r, r == 'Reject') || self.rungs[size(self.rungs) - 1] == 'Reject'",
            message="`Reject` must be the last rung of `degrade.rungs`: nothing is tried after a refusal",
            field_path=".rungs",
            check=lambda ladder: "Reject" not in ladder.rungs or ladder.rungs[-1] == "Reject",
        ),
        CelRule(
            rule="!self.rungs.exists(r, r == 'Fallback') || has(self.fallbackModelGroup)",
            message="`degrade.fallbackModelGroup` must name the approved ModelGroup of the `Fallback` rung",
            field_path=".fallbackModelGroup",
            check=lambda ladder: "Fallback" not in ladder.rungs or ladder.fallback_model_group is not None,
        ),
        CelRule(
            rule="!self.rungs.exists(r, r == 'CapOutput') || has(self.capOutputTokens)",
            message="`degrade.capOutputTokens` must be set for the `CapOutput` rung: the cap it serves under",
            field_path=".capOutputTokens",
            check=lambda ladder: "CapOutput" not in ladder.rungs or ladder.cap_output_tokens is not None,
        ),
    )


class DegradeLadder(SpecModel):
    """The lesser contracts a class accepts, in the order the gateway tries them under overload and
    while new groups warm; every response served on a rung says which (`X-Goodput-Degraded`).
    Nothing the class does not list is ever done to its requests."""

    cel_rules = _ladder_rules()

    rungs: tuple[DegradeRung, ...] = Field(min_length=1, max_length=5)
    """'CapOutput' (serve with at most `capOutputTokens` output tokens), 'DropOptionalContext' (leave
    out the chat messages the client marked optional), 'Fallback' (serve on `fallbackModelGroup`),
    'AsyncBatch' (accept now with 202 and a result URL, answer when capacity frees) and 'Reject'
    (429); each at most once, 'Reject' last."""
    cap_output_tokens: int | None = Field(default=None, ge=1, le=16777216)
    """The output cap of the 'CapOutput' rung."""
    fallback_model_group: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """The approved ModelGroup (same namespace, same `goodput.dev/model-family` label) of the
    'Fallback' rung; one that is missing or of another family is reported, never served."""


class SloClass(SpecModel):
    """One class of requests and its latency targets (interactive, long reasoning, batch, ...)."""

    cel_rules = (
        _positive("ttftSeconds", "ttft_seconds"),
        _positive("itlSeconds", "itl_seconds"),
        _positive("e2eSeconds", "e2e_seconds", optional=True),
        CelRule(
            rule="!has(self.e2eSeconds) || self.e2eSeconds >= self.ttftSeconds",
            message="`e2eSeconds` must be greater than or equal to `ttftSeconds`: a request completes "
            "after its first token",
            field_path=".e2eSeconds",
            check=lambda cls: cls.e2e_seconds is None or cls.e2e_seconds >= cls.ttft_seconds,
        ),
        _fraction("attainment", "attainment", "0.99"),
        _fraction("percentile", "percentile", "0.99"),
    )

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Class name; requests name their class (for example 'interactive' or 'batch')."""
    ttft_seconds: float
    """Time-to-first-token target: routing, queueing, prefill and the first decode step."""
    itl_seconds: float
    """Inter-token latency target: the gap between consecutive output tokens."""
    e2e_seconds: float | None = None
    """Completion target for the whole request; absent: no completion deadline."""
    attainment: float = 0.99
    """Fraction of admitted requests of this class that must meet every target, in (0, 1]."""
    percentile: float = 0.99
    """Percentile of TTFT and ITL that must stay within target, in (0, 1]; 0.99 bounds the tail
    gaps a mean would hide."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Order under contention: lower values are served first (vLLM's priority order)."""
    overload_action: Literal["Reject", "Defer", "Degrade"] = "Reject"
    """What the gateway does with a request of this class that cannot meet its targets: 'Reject' (429
    or 503 with Retry-After), 'Defer' (queue it for later) or 'Degrade' (serve it under a lesser
    contract)."""
    max_prompt_tokens: int | None = Field(default=None, ge=1, le=16777216)
    """The class's contract on prompt length: the gateway answers a longer prompt with 400; absent:
    only the model's context limits it."""
    max_output_tokens: int | None = Field(default=None, ge=1, le=16777216)
    """The class's contract on `max_tokens`: the gateway answers a larger request with 400, and uses
    this as the output budget of a request that names none; absent: only the context limits it."""
    session_budget: SessionBudget | None = None
    """The budget a session of this class reserves at its root (header `X-Goodput-Session`); absent:
    requests of this class open no budgeted session."""
    degrade: DegradeLadder | None = None
    """The degrade ladder of this class; absent: only `overloadAction` answers overload."""


class GoodputSpec(SpecModel):
    """How goodput (SLO-attaining work per second) is measured."""

    window_seconds: int = Field(default=300, ge=10, le=86400)
    """Window over which attainment and goodput are computed."""
    unit: Literal["Requests", "Tokens"] = "Requests"
    """Count SLO-attaining 'Requests' or their 'Tokens'."""


class QueueWorkSignal(SpecModel):
    """Scale so that queued work drains within a target time: R = ceil((s x lambda_w + Q_work / T_d) / C)."""

    enabled: bool = True
    """Use this signal."""
    drain_target_seconds: float = Field(default=10.0, gt=0, le=3600)
    """T_d: time within which the backlog of work should drain; only the part the ready groups
    cannot drain before a new group is ready (`profile.readyTimeSeconds`) asks for groups. Arrival
    rates are read over T_d where it is longer than the operator's rate window (never past the
    goodput window): a burst shorter than T_d counts as backlog."""
    safety_factor: float = Field(default=1.2, ge=1, le=10)
    """s: headroom multiplied onto the arrival work rate."""


class SlackSignal(SpecModel):
    """Scale out when requests are about to miss their first-token deadline."""

    enabled: bool = True
    """Use this signal."""
    min_slack_seconds: float = Field(default=0.0, ge=0, le=3600)
    """A request whose predicted slack (deadline minus now minus predicted wait) is below this is at risk."""
    low_slack_fraction: float = Field(default=0.05, ge=0, le=1)
    """Scale out when more than this fraction of waiting requests is at risk."""


class KvCacheSignal(SpecModel):
    """Scale out before the KV cache fills and requests are preempted."""

    enabled: bool = True
    """Use this signal."""
    min_free_fraction: float = Field(default=0.15, ge=0, lt=1)
    """Keep at least this fraction of every group's KV cache free."""


class GoodputSignal(SpecModel):
    """Scale out when measured attainment falls below a floor."""

    enabled: bool = True
    """Use this signal."""
    attainment_floor: float = Field(default=0.95, gt=0, le=1)
    """Scale out while the measured attainment of any class is below this. Read from vLLM's latency
    histograms, a miss counts once the histogram shows it: against a target inside a bucket (60 s
    in vLLM's TTFT bucket from 40 s to 80 s), only observations past that bucket are misses, so a
    target on a bucket bound (vLLM's TTFT bounds include 1, 2.5, 5, 10, 20, 40, 80 s) is read
    exactly."""


class Signals(SpecModel):
    """The scaling signals; each enabled one proposes a number of groups and the largest wins."""

    cel_rules = (
        CelRule(
            rule="self.queueWork.enabled || self.slack.enabled || self.kvCache.enabled "
            "|| self.goodput.enabled",
            message="`autoscaling.signals` must enable at least one signal",
            check=lambda signals: any(
                signal.enabled
                for signal in (signals.queue_work, signals.slack, signals.kv_cache, signals.goodput)
            ),
        ),
    )

    queue_work: QueueWorkSignal = QueueWorkSignal()
    """Queued and arriving work against the capacity of one group."""
    slack: SlackSignal = SlackSignal()
    """Deadline slack of waiting requests."""
    kv_cache: KvCacheSignal = KvCacheSignal()
    """KV-cache headroom."""
    goodput: GoodputSignal = GoodputSignal()
    """Measured attainment."""


class StepPolicy(SpecModel):
    """A step limit: at most `value` groups (or percent of the current groups) per `periodSeconds`."""

    type: Literal["Groups", "Percent"]
    """'Groups': an absolute number of groups. 'Percent': a percentage of the current groups."""
    value: int = Field(ge=1, le=1000)
    """Groups, or percent, allowed per period."""
    period_seconds: int = Field(ge=1, le=3600)
    """Length of the period the limit applies to."""


class ScalingRules(SpecModel):
    """Behaviour in one direction, in the shape of the HorizontalPodAutoscaler's scaling rules."""

    tolerance: float = Field(default=0.1, ge=0, lt=1)
    """Ignore proposals within this fraction of the current groups (dead band against noise)."""
    stabilization_window_seconds: int = Field(default=0, ge=0, le=3600)
    """Act on the most conservative proposal of this trailing window."""
    policies: tuple[StepPolicy, ...] = Field(default=(), max_length=8)
    """Step limits."""
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    """Which step limit applies when several do: the one allowing the 'Max' change, the 'Min', or
    'Disabled' (no scaling in this direction)."""


class ScaleUpRules(ScalingRules):
    """Scale-up behaviour: act at once, add up to 100 % or 4 groups a minute, whichever is more.

    Four groups, as the HPA's default scale-up allows four pods: a burst to three times the load of
    two groups needs five, and a limit of two held the fifth a whole minute (and its ready time)
    behind the first step. The ceiling on spend is `maxReplicas`, not this limit."""

    policies: tuple[StepPolicy, ...] = Field(
        default=(
            StepPolicy(type="Percent", value=100, period_seconds=60),
            StepPolicy(type="Groups", value=4, period_seconds=60),
        ),
        max_length=8,
    )
    """Step limits."""


class ScaleDownRules(ScalingRules):
    """Scale-down behaviour: wait 5 minutes for a lower proposal to hold, drain one group a minute."""

    stabilization_window_seconds: int = Field(default=300, ge=0, le=3600)
    """Act on the highest proposal of this trailing window."""
    policies: tuple[StepPolicy, ...] = Field(
        default=(StepPolicy(type="Groups", value=1, period_seconds=60),),
        max_length=8,
    )
    """Step limits."""


class MetricsPolicy(SpecModel):
    """What the autoscaler does when the metrics behind its signals are old or missing."""

    max_age_seconds: int = Field(default=60, ge=1, le=3600)
    """Metrics older than this are stale."""
    on_stale: Literal["HoldScaleIn", "Freeze"] = "HoldScaleIn"
    """'HoldScaleIn': never scale in, scale out only on the signals still known. 'Freeze': change nothing."""


class Autoscaling(SpecModel):
    """How the autoscaler moves the number of groups toward the SLO."""

    mode: AutoscalingMode = "Active"
    """'Active': decisions are applied. 'Advisory': decisions are recorded, never applied. 'Frozen':
    no decisions (the kill switch)."""
    interval_seconds: int = Field(default=15, ge=1, le=3600)
    """Time between decisions."""
    signals: Signals = Signals()
    """The signals and their parameters."""
    scale_up: ScaleUpRules = ScaleUpRules()
    """Scale-up behaviour."""
    scale_down: ScaleDownRules = ScaleDownRules()
    """Scale-down behaviour."""
    metrics: MetricsPolicy = MetricsPolicy()
    """Metric staleness."""


class AdmissionGate(SpecModel):
    """One admission gate of the gateway."""

    name: Literal["Contract", "Memory", "Deadline", "Budget"]
    """'Contract' (tenant, model, limits), 'Memory' (the request's KV fits), 'Deadline' (predicted
    latency within target) or 'Budget' (tenant quota left)."""
    enabled: bool = True
    """Apply this gate."""


class Admission(SpecModel):
    """Admission control in the request path. Reserved for the gateway: the operator does not act on it."""

    gates: tuple[AdmissionGate, ...] = Field(default=(), max_length=4, json_schema_extra=list_map("name"))
    """Gates to apply, in order; absent: all four."""
    default_class: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Class of a request that names none (header `X-Goodput-Class`); absent: the first class."""
    max_defer_seconds: float = Field(default=30.0, ge=0, le=3600)
    """Longest the gateway holds a deferred request (or any request while no group is Ready) before
    answering 503; a request is never held past the point where its deadline can no longer be met."""
    retry_budget_ratio: float = Field(default=0.2, ge=0, le=10)
    """Retries a tenant may send per first attempt (a retry budget against retry storms): each
    first attempt earns this many retry tokens, each retry spends one."""


class TenantWeight(SpecModel):
    """A tenant's share of contended capacity."""

    name: str = Field(min_length=1, max_length=253)
    """Tenant name as the gateway identifies it."""
    weight: float = Field(default=1.0, gt=0, le=1000)
    """Relative share: a tenant of weight 2 gets twice the work of a tenant of weight 1."""
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """The tenant's token budget (prompt plus requested output tokens), refilled continuously with a
    burst of one minute's worth; absent: no budget."""


class CostWeights(SpecModel):
    """Price of a request's work in fairness accounting."""

    input_tokens: float = Field(default=1.0, ge=0)
    """Cost per prompt token (prefill)."""
    output_tokens: float = Field(default=1.0, ge=0)
    """Cost per generated token (decode)."""
    kv_byte_seconds: float = Field(default=0.0, ge=0)
    """Cost per byte-second of KV cache held."""


class Fairness(SpecModel):
    """Token-weighted fairness between tenants. Reserved for the gateway: the operator does not act on it."""

    tenants: tuple[TenantWeight, ...] = Field(default=(), max_length=256, json_schema_extra=list_map("name"))
    """Tenant weights; tenants not listed have weight 1."""
    default_tenant: str = Field(default="default", min_length=1, max_length=253)
    """Tenant of a request that names none (header `X-Goodput-Tenant`)."""
    priority_allowance_tokens: float = Field(default=0.0, ge=0)
    """How far (in weighted cost) a tenant's counter may run ahead of the least-served backlogged
    tenant and still be served first for a higher-priority class: priority is a bounded exception to
    fairness; 0 makes fairness strict."""
    cost_weights: CostWeights = CostWeights()
    """How work is priced."""


class SloPolicySpec(SpecModel):
    """Desired state of an SLOPolicy."""

    cel_rules = (
        CelRule(
            rule="self == oldSelf || self.revision != oldSelf.revision",
            message="`revision` must change whenever the policy changes, so that every decision names the "
            "policy that made it: set a new `revision`",
            field_path=".revision",
        ),
        CelRule(
            rule="!has(self.admission.defaultClass) || "
            "self.classes.exists(c, c.name == self.admission.defaultClass)",
            message="`admission.defaultClass` must name one of `classes`",
            field_path=".admission.defaultClass",
            check=lambda spec: (
                spec.admission.default_class is None
                or any(cls.name == spec.admission.default_class for cls in spec.classes)
            ),
        ),
    )

    revision: str = Field(min_length=1, max_length=128)
    """Opaque revision a pipeline sets on every change (for example 'slo-2026-07-16.3'); recorded on
    every decision, Event and metric."""
    classes: tuple[SloClass, ...] = Field(min_length=1, max_length=16, json_schema_extra=list_map("name"))
    """Request classes and their targets; names are unique."""
    goodput: GoodputSpec = GoodputSpec()
    """How goodput is measured."""
    autoscaling: Autoscaling = Autoscaling()
    """Control behaviour."""
    admission: Admission = Admission()
    """Admission gates (reserved for the gateway)."""
    fairness: Fairness = Fairness()
    """Tenant fairness (reserved for the gateway)."""


class SloPolicyStatus(StatusModel):
    """Observed state of an SLOPolicy, written by the operator."""

    observed_generation: int = Field(default=-1, json_schema_extra={"format": "int64"})
    """The `metadata.generation` last read; -1 before the operator's first visit."""
    observed_revision: str | None = Field(default=None, max_length=128)
    """The `spec.revision` last read."""
    conditions: tuple[Condition, ...] = Field(default=(), json_schema_extra=list_map("type"))
    """'Accepted', with the reason when it is not."""
    bound_model_groups: tuple[Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)], ...] = (
        Field(default=(), json_schema_extra={"x-kubernetes-list-type": "set"})
    )
    """ModelGroups in this namespace whose `policyRef` or `shadowPolicyRef` names this policy."""


class SloPolicy(SpecModel):
    """The SLO contract (targets per request class) and the autoscaling behaviour that keeps it."""

    api_version: Literal["goodput.dev/v1alpha1"] = "goodput.dev/v1alpha1"
    """API version of the object."""
    kind: Literal["SLOPolicy"] = "SLOPolicy"
    """Kind of the object."""
    metadata: ObjectMeta = ObjectMeta()
    """Standard object metadata."""
    spec: SloPolicySpec
    """Desired state."""
    status: SloPolicyStatus = SloPolicyStatus()
    """Observed state, written by the operator."""
