"""Admission at the door of the request path: which requests can still meet their SLO (§10-§13).

The gates run in the design note's order, each on a frozen view of the fleet, the policy and `now`:

1. **Contract**: the class's limits on prompt and output tokens, the model's context; then
   feasibility: a request whose zero-load TTFT floor (`estimators.feasibility`) already exceeds its
   class's target cannot meet it on any number of groups, so it gets the class's overload action at
   once and is counted as infeasible, never as a reason to scale.
2. **Memory**: its KV need (prompt plus output budget) fits the free KV of some serving group.
3. **Deadline**: the predicted wait behind the queued work (`estimators.queueing`) plus its prefill
   and first decode fits the TTFT target, on the best group.
4. **Budget**: the tenant's token budget (a token bucket) holds the request.

A request failing a gate gets an outcome: admit, defer (held, at most `max_defer_seconds` and never
past the point its deadline is lost), degrade (a documented, reversible reduction: a lower
`max_tokens`, or best-effort service outside the SLO, marked in the response) or reject (429 with
`Retry-After` from the time the queue needs to drain back under the request's budget; 503 when no
group is ready and holding is not allowed). A request that breaks the contract itself is a client
error (400): it is not overload and retrying does not help.

Retry storms (§13) are damped twice: idempotency keys collapse duplicates (`IdempotencyLedger`), and
a tenant's retries are bounded by a retry budget earned by its first attempts (`RetryBudget`).

Nothing here does I/O or reads a clock; the gateway and the simulator call the same functions.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from goodput.api.reasons import AdmissionReason
from goodput.api.slopolicy import SloPolicySpec
from goodput.controllers.requests.degrade import Ladder
from goodput.controllers.requests.sessions import SessionLimits
from goodput.estimators.feasibility import (
    FloorModel,
    FloorTargets,
    prefill_floor_seconds,
    request_floors,
    unmet_targets,
)
from goodput.estimators.queueing import predicted_queue_wait_seconds
from goodput.estimators.work import WorkPricing


class Gate(StrEnum):
    CONTRACT = "Contract"
    MEMORY = "Memory"
    DEADLINE = "Deadline"
    BUDGET = "Budget"


ALL_GATES: tuple[Gate, ...] = (Gate.CONTRACT, Gate.MEMORY, Gate.DEADLINE, Gate.BUDGET)


class Outcome(StrEnum):
    ADMIT = "admitted"
    DEFER = "deferred"
    DEGRADE = "degraded"
    REJECT = "rejected"
    INVALID = "invalid"


class OverloadAction(StrEnum):
    REJECT = "Reject"
    DEFER = "Defer"
    DEGRADE = "Degrade"


# The shortest Retry-After the gateway sends: RFC 9110 delay-seconds are whole seconds.
MIN_RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True, slots=True)
class ClassContract:
    """One SLO class as the request path enforces it."""

    name: str
    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float | None
    priority: int
    overload_action: OverloadAction
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    session_limits: SessionLimits | None = None  # requests of this class open budgeted sessions
    ladder: Ladder | None = None  # the lesser contracts the class accepts, in order

    @property
    def floor_targets(self) -> FloorTargets:
        return FloorTargets(self.ttft_seconds, self.itl_seconds, self.e2e_seconds)


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What the gates obey: the classes, which gates run, the model's prices and limits.

    default_output_tokens: the output budget of a request that names no `max_tokens` and whose class
    sets none (also what its KV need and work are priced at).
    wait_p90_factor: the deadline gate prices the wait at this multiple of its mean prediction, the
    p90 upper estimate a decision that must be safe uses (§25; `WorkErrorProfile`'s default ratio):
    admitting at the mean would let half of the requests admitted near the limit miss.
    """

    classes: Mapping[str, ClassContract]
    default_class: str
    gates: tuple[Gate, ...]
    floor_model: FloorModel
    pricing: WorkPricing
    context_tokens: int
    max_defer_seconds: float = 30.0
    retry_budget_ratio: float = 0.2
    default_output_tokens: int = 256
    wait_p90_factor: float = 1.5

    def contract_for(self, class_name: str | None) -> ClassContract | None:
        return self.classes.get(class_name or self.default_class)


def admission_policy(
    spec: SloPolicySpec, floor_model: FloorModel, pricing: WorkPricing, context_tokens: int
) -> AdmissionPolicy:
    """The SLOPolicy's request-path fields compiled for the gates."""
    classes = {
        cls.name: ClassContract(
            name=cls.name,
            ttft_seconds=cls.ttft_seconds,
            itl_seconds=cls.itl_seconds,
            e2e_seconds=cls.e2e_seconds,
            priority=cls.priority,
            overload_action=OverloadAction(cls.overload_action),
            max_prompt_tokens=cls.max_prompt_tokens,
            max_output_tokens=cls.max_output_tokens,
            session_limits=SessionLimits.of(cls.session_budget) if cls.session_budget else None,
            ladder=Ladder.of(cls.degrade) if cls.degrade else None,
        )
        for cls in spec.classes
    }
    enabled = {gate.name: gate.enabled for gate in spec.admission.gates}
    return AdmissionPolicy(
        classes=classes,
        default_class=spec.admission.default_class or spec.classes[0].name,
        gates=tuple(gate for gate in ALL_GATES if enabled.get(gate.value, True)),
        floor_model=floor_model,
        pricing=pricing,
        context_tokens=context_tokens,
        max_defer_seconds=spec.admission.max_defer_seconds,
        retry_budget_ratio=spec.admission.retry_budget_ratio,
    )


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """One replica group as the gateway sees it at one instant.

    waiting_work_seconds: predicted work of the requests queued for it (or for the pool) not yet
    started; a new request waits behind it. kv_free_tokens: KV tokens not held by requests in flight.
    slot_wait_seconds: while every dispatch slot holds a request, how long until one frees
    (`slot_wait_seconds`); 0 while a slot is free.
    """

    name: str
    ready: bool
    draining: bool
    waiting_work_seconds: float
    running_work_seconds: float
    kv_capacity_tokens: int
    kv_free_tokens: int
    capacity_work_seconds_per_second: float
    slot_wait_seconds: float = 0.0

    @property
    def serving(self) -> bool:
        return self.ready and not self.draining


def slot_wait_seconds(
    in_flight_requests: int,
    max_in_flight: int,
    running_work_seconds: float,
    capacity_work_seconds_per_second: float,
) -> float:
    """Until a full group frees a dispatch slot: the mean in-flight request's work at the group's rate.

    N requests in flight share the group's rate, each at 1/N of it; the first of them to finish
    has, on average, about 1/N of a mean request's work left, so the wait is about one mean
    request's work at the whole rate. 0 while a slot is free; unbounded when nothing is served.
    """
    if in_flight_requests < max_in_flight or in_flight_requests <= 0:
        return 0.0
    if capacity_work_seconds_per_second <= 0:
        return math.inf
    return running_work_seconds / in_flight_requests / capacity_work_seconds_per_second


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What the gates know of a request: its class, tenant and size, before it is sent anywhere.

    requested_output_tokens: the client's `max_tokens`; None when it named none.
    """

    tenant: str
    class_name: str | None
    prompt_tokens: int
    requested_output_tokens: int | None
    arrival_time: float
    is_retry: bool = False


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The outcome of the gates for one request, and everything the response needs.

    output_tokens: the output budget the request is served with (lowered when degraded).
    best_effort: served outside its SLO contract (degraded infeasible work): never counted as a miss.
    hold_seconds: how long a deferred request may be held before it is answered 503.
    retry_after_seconds: the Retry-After of a 429 or 503.
    infeasible: its zero-load floor already misses the class's targets (counted apart).
    deadline: the deadline gate's prediction of an admitted request (None when the gate is off).
    """

    outcome: Outcome
    reason: AdmissionReason
    message: str
    class_name: str | None = None
    gate: Gate | None = None
    http_status: int = 200
    output_tokens: int = 0
    best_effort: bool = False
    hold_seconds: float = 0.0
    retry_after_seconds: int | None = None
    infeasible: bool = False
    budget_tokens: float = 0.0
    deadline: DeadlineCheck | None = None

    @property
    def proceeds(self) -> bool:
        """Admitted, degraded or deferred: the request goes on to the queue (deferred ones wait)."""
        return self.outcome in (Outcome.ADMIT, Outcome.DEGRADE, Outcome.DEFER)


def _invalid(reason: AdmissionReason, message: str, class_name: str | None = None) -> AdmissionDecision:
    return AdmissionDecision(Outcome.INVALID, reason, message, class_name, Gate.CONTRACT, http_status=400)


def retry_after_seconds(seconds: float) -> int:
    """Whole seconds, rounded up, at least one: a client that retries sooner would be refused again."""
    if not math.isfinite(seconds):
        return MIN_RETRY_AFTER_SECONDS
    return max(MIN_RETRY_AFTER_SECONDS, math.ceil(seconds))


def check_contract(
    policy: AdmissionPolicy, request: RequestShape
) -> tuple[ClassContract, int] | AdmissionDecision:
    """The class, and the output budget the request asks for; or why it breaks the contract (400)."""
    contract = policy.contract_for(request.class_name)
    if contract is None:
        known = ", ".join(sorted(policy.classes))
        return _invalid(
            AdmissionReason.UNKNOWN_CLASS,
            f"unknown SLO class {request.class_name!r} (header X-Goodput-Class): known classes are {known}",
        )
    name = contract.name
    if contract.max_prompt_tokens is not None and request.prompt_tokens > contract.max_prompt_tokens:
        return _invalid(
            AdmissionReason.PROMPT_OVER_CLASS_LIMIT,
            f"prompt of {request.prompt_tokens} tokens exceeds class {name!r}'s maxPromptTokens "
            f"({contract.max_prompt_tokens})",
            name,
        )
    requested = request.requested_output_tokens
    if (
        requested is not None
        and contract.max_output_tokens is not None
        and requested > contract.max_output_tokens
    ):
        return _invalid(
            AdmissionReason.OUTPUT_OVER_CLASS_LIMIT,
            f"max_tokens={requested} exceeds class {name!r}'s maxOutputTokens ({contract.max_output_tokens})",
            name,
        )
    room = policy.context_tokens - request.prompt_tokens
    if room < 1:
        return _invalid(
            AdmissionReason.BEYOND_CONTEXT,
            f"prompt of {request.prompt_tokens} tokens leaves no room in the model's context of "
            f"{policy.context_tokens} tokens",
            name,
        )
    if requested is None:
        default = contract.max_output_tokens or policy.default_output_tokens
        return contract, min(default, room)
    if requested > room:
        return _invalid(
            AdmissionReason.BEYOND_CONTEXT,
            f"prompt of {request.prompt_tokens} tokens plus max_tokens={requested} exceeds the model's "
            f"context of {policy.context_tokens} tokens",
            name,
        )
    return contract, requested


def longest_output_within_e2e(policy: AdmissionPolicy, contract: ClassContract, prompt_tokens: int) -> int:
    """The largest output budget whose zero-load completion fits the class's end-to-end target."""
    if contract.e2e_seconds is None:
        return policy.context_tokens
    floors = request_floors(policy.floor_model, prompt_tokens, 1)
    spare = contract.e2e_seconds - floors.ttft_seconds
    if spare < 0 or floors.itl_seconds <= 0:
        return 0
    return 1 + int(spare / floors.itl_seconds)


@dataclass(frozen=True, slots=True)
class Overload:
    """Why a gate failed under load, for the class's overload action to answer."""

    gate: Gate
    reason: AdmissionReason
    message: str
    retry_after_seconds: float
    fitting_output_tokens: int | None = None
    defer_helps: bool = True


def apply_overload_action(
    policy: AdmissionPolicy,
    contract: ClassContract,
    output_tokens: int,
    overload: Overload,
    slack_seconds: float,
) -> AdmissionDecision:
    """The class's overload action for a failed gate.

    Defer holds the request for at most `max_defer_seconds` and never longer than its slack (the time
    left before holding alone loses its deadline); when holding cannot help, Defer answers as Reject.
    Degrade serves a smaller request when a smaller `max_tokens` passes the gate, and otherwise
    serves it best effort, outside its SLO contract (marked, and never counted as a miss).
    """
    base = AdmissionDecision(
        Outcome.REJECT,
        overload.reason,
        overload.message,
        contract.name,
        overload.gate,
        http_status=429,
        output_tokens=output_tokens,
        retry_after_seconds=retry_after_seconds(overload.retry_after_seconds),
    )
    if contract.overload_action is OverloadAction.DEGRADE:
        fitting = overload.fitting_output_tokens
        if fitting is not None and 1 <= fitting < output_tokens:
            return replace(
                base,
                outcome=Outcome.DEGRADE,
                http_status=200,
                output_tokens=fitting,
                retry_after_seconds=None,
                message=f"{overload.message}; max_tokens lowered from {output_tokens} to {fitting}",
            )
        return replace(
            base,
            outcome=Outcome.DEGRADE,
            http_status=200,
            best_effort=True,
            retry_after_seconds=None,
            message=f"{overload.message}; served best effort, outside class {contract.name!r}'s SLO",
        )
    if contract.overload_action is OverloadAction.DEFER and overload.defer_helps:
        hold = min(policy.max_defer_seconds, slack_seconds)
        if hold > 0:
            return replace(
                base,
                outcome=Outcome.DEFER,
                http_status=200,
                hold_seconds=hold,
                retry_after_seconds=None,
                message=f"{overload.message}; held up to {hold:.1f}s",
            )
    return base


def contract_feasibility(
    policy: AdmissionPolicy, contract: ClassContract, request: RequestShape, output_tokens: int
) -> Overload | None:
    """The feasibility half of the contract gate: is the zero-load floor inside the targets?"""
    floors = request_floors(policy.floor_model, request.prompt_tokens, output_tokens)
    unmet = unmet_targets(floors, contract.floor_targets)
    if not unmet:
        return None
    fitting = (
        longest_output_within_e2e(policy, contract, request.prompt_tokens) if unmet == ("e2e",) else None
    )
    return Overload(
        Gate.CONTRACT,
        AdmissionReason.INFEASIBLE,
        f"infeasible for class {contract.name!r}: zero-load floors (TTFT {floors.ttft_seconds:.3f}s, "
        f"ITL {floors.itl_seconds:.4f}s, E2E {floors.e2e_seconds:.2f}s) miss its {', '.join(unmet)} "
        "target on any number of groups",
        # Waiting never lowers a floor; the Retry-After only spaces out a client that retries anyway.
        retry_after_seconds=contract.ttft_seconds,
        fitting_output_tokens=fitting,
        defer_helps=False,
    )


def check_memory(policy: AdmissionPolicy, groups: Sequence[GroupLoad], need_tokens: int) -> Overload | None:
    """The KV need fits the headroom of some serving group now (or it is told when it will)."""
    serving = [group for group in groups if group.serving]
    if any(group.kv_free_tokens >= need_tokens for group in serving):
        return None
    most_free = max((group.kv_free_tokens for group in serving), default=0)
    drain = min(
        (
            group.running_work_seconds / max(group.capacity_work_seconds_per_second, 1e-9)
            for group in serving
            if group.kv_capacity_tokens >= need_tokens
        ),
        default=math.inf,
    )
    prompt_share = need_tokens - most_free
    return Overload(
        Gate.MEMORY,
        AdmissionReason.KV_HEADROOM,
        f"KV need of {need_tokens} tokens exceeds the free KV of every serving group (most free: "
        f"{most_free}); short by {prompt_share} tokens",
        retry_after_seconds=drain,
        fitting_output_tokens=None,
    )


@dataclass(frozen=True, slots=True)
class DeadlineCheck:
    """The deadline gate's figures on the best group.

    waited_seconds: since the request arrived. ahead_seconds: the predicted wait and service from
    now, as the figures say (the queue's work over capacity, the slot wait, the zero-load floor).
    ttft_correction: the measured error the gateway applies to `ahead_seconds`
    (`calibration.TtftCalibration`); 1.0 when none was measured.
    """

    waited_seconds: float
    ahead_seconds: float
    group: str | None
    ttft_correction: float = 1.0

    @property
    def predicted_ttft_seconds(self) -> float:
        return self.waited_seconds + self.ttft_correction * self.ahead_seconds


def predicted_ttft(  # noqa: PLR0917 (the gate's whole view, and the correction it applies)
    policy: AdmissionPolicy,
    groups: Sequence[GroupLoad],
    prompt_tokens: int,
    arrival_time: float,
    now: float,
    ttft_correction: float = 1.0,
) -> DeadlineCheck:
    """Time already waited, plus the least predicted wait over the serving groups (the queued work
    ahead, and the wait for a slot on a full group), plus the request's prefill and first decode
    step on an otherwise idle group; the wait and service scaled by the measured `ttft_correction`
    (time already waited is known, not predicted)."""
    floor = policy.floor_model
    service = (
        floor.route_seconds
        + prefill_floor_seconds(floor, prompt_tokens)
        + floor.step_model.decode_step_seconds(1, prompt_tokens)
    )
    best_wait, best_group = math.inf, None
    for group in groups:
        if not group.serving:
            continue
        wait = group.slot_wait_seconds + policy.wait_p90_factor * predicted_queue_wait_seconds(
            group.waiting_work_seconds, 1, group.capacity_work_seconds_per_second
        )
        if wait < best_wait:
            best_wait, best_group = wait, group.name
    waited = max(0.0, now - arrival_time)
    return DeadlineCheck(waited, best_wait + service, best_group, ttft_correction)


def check_deadline(  # noqa: PLR0917 (the gate's whole view, and the correction it applies)
    policy: AdmissionPolicy,
    contract: ClassContract,
    groups: Sequence[GroupLoad],
    request: RequestShape,
    now: float,
    ttft_correction: float = 1.0,
) -> tuple[Overload | None, float]:
    """Predicted TTFT within the target; the second value is the slack a deferral may spend."""
    check = predicted_ttft(policy, groups, request.prompt_tokens, request.arrival_time, now, ttft_correction)
    return deadline_verdict(contract, groups, request, check, now)


def deadline_verdict(
    contract: ClassContract,
    groups: Sequence[GroupLoad],
    request: RequestShape,
    check: DeadlineCheck,
    now: float,
) -> tuple[Overload | None, float]:
    """The deadline gate on a prediction made: None and the slack left when it fits the target, else
    the overload (its message says the correction when one applies) and the slack a deferral may
    spend."""
    budget = contract.ttft_seconds
    predicted = check.predicted_ttft_seconds
    if predicted <= budget:
        return None, budget - predicted
    # A deferred request stays useful until its completion deadline, or its TTFT target when none.
    horizon = contract.e2e_seconds if contract.e2e_seconds is not None else contract.ttft_seconds
    slack = request.arrival_time + horizon - now
    serving = [group for group in groups if group.serving]
    pooled = sum(group.capacity_work_seconds_per_second for group in serving)
    excess_seconds = predicted - budget
    corrected = (
        f" (the wait and service corrected x{check.ttft_correction:.2f} for the engines' measured pace)"
        if check.ttft_correction != 1.0
        else ""
    )
    return (
        Overload(
            Gate.DEADLINE,
            AdmissionReason.DEADLINE,
            f"predicted TTFT {predicted:.2f}s{corrected} exceeds class {contract.name!r}'s "
            f"target of {budget:g}s",
            # The queue needs this long to drain enough for the request to fit its budget.
            retry_after_seconds=excess_seconds if pooled > 0 else math.inf,
        ),
        slack,
    )


def admit(
    policy: AdmissionPolicy,
    request: RequestShape,
    groups: Sequence[GroupLoad],
    now: float,
    *,
    tenant_budget: TokenBucket | None = None,
    retry_budget: RetryBudget | None = None,
    ttft_correction: float = 1.0,
) -> AdmissionDecision:
    """Run the gates in order on one request; the first that fails decides its outcome.

    The contract's class and context limits are always checked; the policy's `gates` enable the
    feasibility half of Contract and the three others. `budget_tokens` of the decision is what the
    tenant's bucket should be charged when the request proceeds. `ttft_correction` scales the
    deadline gate's predicted wait and service (`calibration.TtftCalibration`); an admitted
    request's decision keeps the gate's prediction, to be compared with the TTFT it then sees.
    """
    checked = check_contract(policy, request)
    if isinstance(checked, AdmissionDecision):
        return checked
    contract, output_tokens = checked
    if retry_budget is not None and request.is_retry and not retry_budget.allows_retry():
        return AdmissionDecision(
            Outcome.REJECT,
            AdmissionReason.RETRY_BUDGET,
            f"tenant {request.tenant!r} spent its retry budget ({policy.retry_budget_ratio:g} retries per "
            "first attempt)",
            contract.name,
            http_status=429,
            output_tokens=output_tokens,
            retry_after_seconds=retry_after_seconds(contract.ttft_seconds),
        )
    gates = policy.gates
    if Gate.CONTRACT in gates:
        infeasible = contract_feasibility(policy, contract, request, output_tokens)
        if infeasible is not None:
            decision = apply_overload_action(policy, contract, output_tokens, infeasible, 0.0)
            return replace(decision, infeasible=True)
    if not any(group.serving for group in groups):
        return _no_ready_group(policy, contract, request, output_tokens, now)
    overload, slack, deadline = _load_gates(
        policy, contract, groups, request, output_tokens, now, ttft_correction
    )
    if overload is not None:
        return apply_overload_action(policy, contract, output_tokens, overload, slack)
    budget_tokens = float(request.prompt_tokens + output_tokens)
    if Gate.BUDGET in gates and tenant_budget is not None:
        refused = check_budget(tenant_budget, request.tenant, budget_tokens, now)
        if refused is not None:
            return replace(refused, class_name=contract.name, output_tokens=output_tokens)
    return AdmissionDecision(
        Outcome.ADMIT,
        AdmissionReason.ADMITTED,
        "admitted",
        contract.name,
        output_tokens=output_tokens,
        budget_tokens=budget_tokens,
        deadline=deadline,
    )


def check_budget(bucket: TokenBucket, tenant: str, tokens: float, now: float) -> AdmissionDecision | None:
    """The budget gate: a 429 with the time the bucket needs to hold `tokens`, or None when it does."""
    level = bucket.level_at(now)
    if level >= tokens:
        return None
    return AdmissionDecision(
        Outcome.REJECT,
        AdmissionReason.TENANT_BUDGET,
        f"tenant {tenant!r} has {level:.0f} of the {tokens:.0f} tokens this request needs left in its "
        f"budget ({bucket.tokens_per_second * 60:.0f} tokens per minute)",
        gate=Gate.BUDGET,
        http_status=429,
        retry_after_seconds=retry_after_seconds(bucket.seconds_until(tokens, now)),
    )


def _load_gates(  # noqa: PLR0917 (the load gates' whole view, in the order `admit` holds it)
    policy: AdmissionPolicy,
    contract: ClassContract,
    groups: Sequence[GroupLoad],
    request: RequestShape,
    output_tokens: int,
    now: float,
    ttft_correction: float,
) -> tuple[Overload | None, float, DeadlineCheck | None]:
    """The memory and deadline gates in the policy's order (contract ran first; budget runs last,
    after every load gate): the first overload and its slack, and the deadline gate's prediction."""
    deadline: DeadlineCheck | None = None
    for gate in policy.gates:
        overload, slack = None, 0.0
        if gate is Gate.MEMORY:
            overload, slack = _check_memory_gate(policy, groups, request.prompt_tokens, output_tokens)
        elif gate is Gate.DEADLINE:
            deadline = predicted_ttft(
                policy, groups, request.prompt_tokens, request.arrival_time, now, ttft_correction
            )
            overload, slack = deadline_verdict(contract, groups, request, deadline, now)
        if overload is not None:
            return overload, slack, deadline
    return None, 0.0, deadline


def _check_memory_gate(
    policy: AdmissionPolicy, groups: Sequence[GroupLoad], prompt_tokens: int, output_tokens: int
) -> tuple[Overload | None, float]:
    """The memory gate: a need no group could ever hold, or one no group has free now."""
    need = prompt_tokens + output_tokens
    largest = max((group.kv_capacity_tokens for group in groups if group.serving), default=0)
    if need > largest:
        fitting = largest - prompt_tokens
        overload = Overload(
            Gate.MEMORY,
            AdmissionReason.KV_NEVER_FITS,
            f"KV need of {need} tokens exceeds the KV capacity of every group ({largest})",
            retry_after_seconds=math.inf,
            fitting_output_tokens=fitting if fitting >= 1 else None,
            defer_helps=False,
        )
        return overload, 0.0
    return check_memory(policy, groups, need), policy.max_defer_seconds


def _no_ready_group(
    policy: AdmissionPolicy, contract: ClassContract, request: RequestShape, output_tokens: int, now: float
) -> AdmissionDecision:
    """No serving group: hold the request while a group may still come up in time (scale from zero
    wakes on the held queue), else 503 with Retry-After."""
    horizon = contract.e2e_seconds if contract.e2e_seconds is not None else policy.max_defer_seconds
    hold = min(policy.max_defer_seconds, request.arrival_time + horizon - now)
    if hold > 0:
        return AdmissionDecision(
            Outcome.DEFER,
            AdmissionReason.NO_READY_GROUP,
            f"no group is ready; held up to {hold:.1f}s for one",
            contract.name,
            None,
            output_tokens=output_tokens,
            hold_seconds=hold,
        )
    return AdmissionDecision(
        Outcome.REJECT,
        AdmissionReason.NO_READY_GROUP,
        "no group is ready to serve this model",
        contract.name,
        None,
        http_status=503,
        output_tokens=output_tokens,
        retry_after_seconds=retry_after_seconds(policy.max_defer_seconds),
    )


# --- Budgets ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """A tenant's token budget: refilled continuously, holding at most one burst."""

    tokens_per_second: float
    burst_tokens: float
    level_tokens: float
    updated_at: float

    @classmethod
    def full(cls, tokens_per_minute: float, now: float) -> TokenBucket:
        return cls(tokens_per_minute / 60.0, tokens_per_minute, tokens_per_minute, now)

    def level_at(self, now: float) -> float:
        elapsed = max(0.0, now - self.updated_at)
        return min(self.burst_tokens, self.level_tokens + elapsed * self.tokens_per_second)

    def spend(self, tokens: float, now: float) -> TokenBucket:
        """The bucket after spending `tokens` (it may go negative: a refund can bring it back)."""
        return replace(self, level_tokens=self.level_at(now) - tokens, updated_at=now)

    def refund(self, tokens: float, now: float) -> TokenBucket:
        """Give back what a request reserved but did not use (output it never generated)."""
        return self.spend(-tokens, now)

    def seconds_until(self, tokens: float, now: float) -> float:
        if tokens > self.burst_tokens or self.tokens_per_second <= 0:
            return math.inf
        return max(0.0, (tokens - self.level_at(now)) / self.tokens_per_second)


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """Retries a tenant may send: each first attempt earns `ratio` tokens, each retry spends one; the
    balance is capped so a quiet period cannot bank a storm (as gRPC's and Finagle's retry budgets)."""

    ratio: float
    balance: float = 0.0
    cap: float = 10.0

    def allows_retry(self) -> bool:
        return self.balance >= 1.0

    def after(self, is_retry: bool) -> RetryBudget:
        if is_retry:
            return replace(self, balance=max(0.0, self.balance - 1.0))
        return replace(self, balance=min(self.cap, self.balance + self.ratio))


# --- Idempotency ------------------------------------------------------------------------------------


class KeyState(StrEnum):
    NEW = "New"
    IN_FLIGHT = "InFlight"
    COMPLETED = "Completed"


@dataclass(frozen=True, slots=True)
class KeyEntry:
    tenant: str
    state: KeyState
    seen_at: float


class IdempotencyLedger:
    """Idempotency keys of recent requests, per tenant, bounded in size and age.

    A key seen while its first request is in flight or recently completed is a duplicate: the gateway
    answers it from the first request instead of sending the work to an engine again. Pure state: the
    caller passes `now`.
    """

    def __init__(self, ttl_seconds: float = 600.0, max_keys: int = 100_000) -> None:
        if ttl_seconds <= 0 or max_keys < 1:
            raise ValueError("ttl_seconds and max_keys must be positive")
        self.ttl_seconds = ttl_seconds
        self.max_keys = max_keys
        self._entries: OrderedDict[tuple[str, str], KeyEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def claim(self, tenant: str, key: str, now: float) -> KeyState:
        """NEW when the caller now owns the key (and must `complete` or `release` it); otherwise the
        state of the earlier request it duplicates."""
        self._expire(now)
        entry = self._entries.get((tenant, key))
        if entry is not None:
            return entry.state
        self._entries[(tenant, key)] = KeyEntry(tenant, KeyState.IN_FLIGHT, now)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)
        return KeyState.NEW

    def complete(self, tenant: str, key: str, now: float) -> None:
        if (tenant, key) in self._entries:
            self._entries[(tenant, key)] = KeyEntry(tenant, KeyState.COMPLETED, now)
            self._entries.move_to_end((tenant, key))

    def release(self, tenant: str, key: str) -> None:
        """Forget a key whose request was refused or failed: a retry with it is a new attempt."""
        self._entries.pop((tenant, key), None)

    def _expire(self, now: float) -> None:
        while self._entries:
            first_key, first = next(iter(self._entries.items()))
            if now - first.seen_at <= self.ttl_seconds:
                break
            del self._entries[first_key]


# --- Measured drain rate ----------------------------------------------------------------------------


class DrainRateMeter:
    """The work rate at which the gateway's queue actually drains while it is backlogged.

    The deadline gate predicts a newcomer's wait as the work ahead of it over the groups' capacity.
    The model's C is right for the mix it was calibrated at; when the live mix holds seats longer
    (longer outputs, slower steps), dispatches come slower than C promises and the gate would admit
    requests that then miss. So while requests wait (every dispatch then happens as soon as a seat
    frees, and their pace is the true drain rate) the meter measures work dispatched per second over
    the last `max_samples` dispatches; an idle queue resets it, since idle time says nothing of it.
    """

    def __init__(self, max_samples: int = 64, min_samples: int = 16) -> None:
        if min_samples < 2 or max_samples < min_samples:
            raise ValueError("need 2 <= min_samples <= max_samples")
        self.max_samples = max_samples
        self.min_samples = min_samples
        self._samples: list[tuple[float, float]] = []
        self._work = 0.0

    def record(self, now: float, work_seconds: float) -> None:
        """One dispatch made while other requests still waited."""
        self._samples.append((now, work_seconds))
        self._work += work_seconds
        if len(self._samples) > self.max_samples:
            _, dropped = self._samples.pop(0)
            self._work -= dropped

    def reset(self) -> None:
        self._samples.clear()
        self._work = 0.0

    def work_seconds_per_second(self) -> float | None:
        """Pooled drain rate; None until enough saturated dispatches were seen."""
        if len(self._samples) < self.min_samples:
            return None
        span = self._samples[-1][0] - self._samples[0][0]
        if span <= 0:
            return None
        # The first sample's work was dispatched at the window's start: the rate is over the rest.
        return (self._work - self._samples[0][1]) / span
