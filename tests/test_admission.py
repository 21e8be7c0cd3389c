"""Admission gates of the request path (goodput.controllers.requests.admission)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.api.reasons import AdmissionReason
from goodput.api.slopolicy import SloPolicySpec
from goodput.controllers.requests.admission import (
    AdmissionPolicy,
    ClassContract,
    Gate,
    GroupLoad,
    IdempotencyLedger,
    KeyState,
    Outcome,
    OverloadAction,
    RequestShape,
    RetryBudget,
    TokenBucket,
    admission_policy,
    admit,
    predicted_ttft,
    retry_after_seconds,
    slot_wait_seconds,
)
from goodput.estimators.feasibility import FloorModel, longest_feasible_prompt_tokens
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel
from goodput.estimators.work import WorkPricing

H100_8B = StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G)
FLOOR = FloorModel(H100_8B, chunk_tokens=2048)
PRICING = WorkPricing.from_step_model(H100_8B)


def contract(
    name: str = "chat", action: OverloadAction = OverloadAction.REJECT, **fields: object
) -> ClassContract:
    values: dict[str, object] = {
        "name": name,
        "ttft_seconds": 1.0,
        "itl_seconds": 0.05,
        "e2e_seconds": None,
        "priority": 0,
        "overload_action": action,
    }
    values.update(fields)
    return ClassContract(**values)  # type: ignore[arg-type]


def policy(*classes: ClassContract, gates: tuple[Gate, ...] = tuple(Gate)) -> AdmissionPolicy:
    chosen = classes or (contract(),)
    return AdmissionPolicy(
        classes={cls.name: cls for cls in chosen},
        default_class=chosen[0].name,
        gates=gates,
        floor_model=FLOOR,
        pricing=PRICING,
        context_tokens=32768,
        max_defer_seconds=20.0,
    )


def group(name: str = "g1", **fields: object) -> GroupLoad:
    values: dict[str, object] = {
        "name": name,
        "ready": True,
        "draining": False,
        "waiting_work_seconds": 0.0,
        "running_work_seconds": 0.0,
        "kv_capacity_tokens": 100_000,
        "kv_free_tokens": 100_000,
        "capacity_work_seconds_per_second": 1.0,
    }
    values.update(fields)
    return GroupLoad(**values)  # type: ignore[arg-type]


def request(prompt: int = 500, output: int | None = 100, **fields: object) -> RequestShape:
    values: dict[str, object] = {
        "tenant": "acme",
        "class_name": None,
        "prompt_tokens": prompt,
        "requested_output_tokens": output,
        "arrival_time": 100.0,
    }
    values.update(fields)
    return RequestShape(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    request: RequestShape
    groups: tuple[GroupLoad, ...]
    policy: AdmissionPolicy
    outcome: Outcome
    reason: AdmissionReason
    status: int
    output_tokens: int | None = None


# A prompt whose zero-load TTFT floor alone misses a 1 s target on this hardware.
TOO_LONG_FOR_1S = longest_feasible_prompt_tokens(FLOOR, 1.0) + 1
DEGRADE = contract(action=OverloadAction.DEGRADE)
DEFER = contract(action=OverloadAction.DEFER, e2e_seconds=60.0)
LIMITED = contract(max_prompt_tokens=1000, max_output_tokens=200)
# 30 work-seconds queued on a group that serves one work-second per second: a 30 s wait.
BUSY = group(waiting_work_seconds=30.0)

CASES = [
    Case(
        "idle fleet admits",
        request(),
        (group(),),
        policy(),
        Outcome.ADMIT,
        AdmissionReason.ADMITTED,
        200,
        100,
    ),
    Case(
        "unknown class is a 400",
        request(class_name="gold"),
        (group(),),
        policy(),
        Outcome.INVALID,
        AdmissionReason.UNKNOWN_CLASS,
        400,
    ),
    Case(
        "prompt over the class limit is a 400",
        request(prompt=1001),
        (group(),),
        policy(LIMITED),
        Outcome.INVALID,
        AdmissionReason.PROMPT_OVER_CLASS_LIMIT,
        400,
    ),
    Case(
        "max_tokens over the class limit is a 400",
        request(output=201),
        (group(),),
        policy(LIMITED),
        Outcome.INVALID,
        AdmissionReason.OUTPUT_OVER_CLASS_LIMIT,
        400,
    ),
    Case(
        "no max_tokens takes the class limit",
        request(output=None),
        (group(),),
        policy(LIMITED),
        Outcome.ADMIT,
        AdmissionReason.ADMITTED,
        200,
        200,
    ),
    Case(
        "prompt plus max_tokens beyond the context is a 400",
        request(prompt=32000, output=1000),
        (group(),),
        policy(),
        Outcome.INVALID,
        AdmissionReason.BEYOND_CONTEXT,
        400,
    ),
    Case(
        "infeasible prompt rejected at once even on an idle fleet",
        request(prompt=TOO_LONG_FOR_1S, output=10),
        (group(),),
        policy(),
        Outcome.REJECT,
        AdmissionReason.INFEASIBLE,
        429,
    ),
    Case(
        "infeasible with Degrade is served best effort",
        request(prompt=TOO_LONG_FOR_1S, output=10),
        (group(),),
        policy(DEGRADE),
        Outcome.DEGRADE,
        AdmissionReason.INFEASIBLE,
        200,
        10,
    ),
    Case(
        "infeasible with Defer is rejected: waiting never lowers a floor",
        request(prompt=TOO_LONG_FOR_1S, output=10),
        (group(),),
        policy(DEFER),
        Outcome.REJECT,
        AdmissionReason.INFEASIBLE,
        429,
    ),
    Case(
        "no ready group holds the request",
        request(),
        (group(ready=False),),
        policy(),
        Outcome.DEFER,
        AdmissionReason.NO_READY_GROUP,
        200,
    ),
    Case(
        "a draining group is no capacity",
        request(),
        (group(draining=True),),
        policy(),
        Outcome.DEFER,
        AdmissionReason.NO_READY_GROUP,
        200,
    ),
    Case(
        "KV need over every group's free KV is rejected",
        request(prompt=500, output=600),
        (group(kv_free_tokens=1000, running_work_seconds=5.0),),
        policy(),
        Outcome.REJECT,
        AdmissionReason.KV_HEADROOM,
        429,
    ),
    Case(
        "KV need over every group's capacity degrades to what fits",
        request(prompt=500, output=600),
        (group(kv_capacity_tokens=1000, kv_free_tokens=1000),),
        policy(DEGRADE),
        Outcome.DEGRADE,
        AdmissionReason.KV_NEVER_FITS,
        200,
        500,
    ),
    Case(
        "long queue misses the deadline: reject",
        request(),
        (BUSY,),
        policy(),
        Outcome.REJECT,
        AdmissionReason.DEADLINE,
        429,
    ),
    Case(
        "long queue misses the deadline: Defer holds while the e2e deadline allows",
        request(),
        (BUSY,),
        policy(DEFER),
        Outcome.DEFER,
        AdmissionReason.DEADLINE,
        200,
    ),
    Case(
        "one idle group among busy ones is enough",
        request(),
        (BUSY, group("g2")),
        policy(),
        Outcome.ADMIT,
        AdmissionReason.ADMITTED,
        200,
    ),
    Case(
        "disabled deadline gate admits into a long queue",
        request(),
        (BUSY,),
        policy(gates=(Gate.CONTRACT, Gate.MEMORY, Gate.BUDGET)),
        Outcome.ADMIT,
        AdmissionReason.ADMITTED,
        200,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_gates(case: Case) -> None:
    decision = admit(case.policy, case.request, case.groups, now=100.0)
    assert (decision.outcome, decision.reason, decision.http_status) == (
        case.outcome,
        case.reason,
        case.status,
    )
    if case.output_tokens is not None:
        assert decision.output_tokens == case.output_tokens
    if decision.http_status in (429, 503):
        assert decision.retry_after_seconds is not None and decision.retry_after_seconds >= 1


def test_infeasible_is_marked_and_never_held() -> None:
    decision = admit(policy(), request(prompt=TOO_LONG_FOR_1S, output=10), (group(),), now=100.0)
    assert decision.infeasible and decision.gate is Gate.CONTRACT and decision.hold_seconds == 0


def test_e2e_infeasible_degrade_lowers_max_tokens_to_what_fits() -> None:
    tight = contract(action=OverloadAction.DEGRADE, e2e_seconds=2.0)
    decision = admit(policy(tight), request(prompt=500, output=2000), (group(),), now=100.0)
    assert decision.outcome is Outcome.DEGRADE and not decision.best_effort
    assert 1 <= decision.output_tokens < 2000
    # The lowered budget passes the gates on its own.
    again = admit(policy(tight), request(prompt=500, output=decision.output_tokens), (group(),), now=100.0)
    assert again.outcome is Outcome.ADMIT


def test_retry_after_grows_with_the_queue() -> None:
    shorter = admit(policy(), request(), (group(waiting_work_seconds=10.0),), now=100.0)
    longer = admit(policy(), request(), (group(waiting_work_seconds=60.0),), now=100.0)
    assert shorter.retry_after_seconds is not None and longer.retry_after_seconds is not None
    assert longer.retry_after_seconds > shorter.retry_after_seconds >= 9


def test_defer_never_holds_past_the_deadline() -> None:
    late = request(arrival_time=50.0)  # 50 s already spent of a 60 s completion deadline
    decision = admit(policy(DEFER), late, (BUSY,), now=100.0)
    assert decision.outcome is Outcome.DEFER
    assert decision.hold_seconds == pytest.approx(10.0)
    lost = admit(policy(DEFER), request(arrival_time=30.0), (BUSY,), now=100.0)
    assert lost.outcome is Outcome.REJECT


def test_no_ready_group_past_the_hold_is_503() -> None:
    decision = admit(policy(), request(arrival_time=70.0), (group(ready=False),), now=100.0)
    assert (decision.outcome, decision.http_status) == (Outcome.REJECT, 503)
    assert decision.retry_after_seconds == 20


def test_tenant_budget_rejects_with_time_to_refill() -> None:
    bucket = TokenBucket.full(600, now=0.0).spend(600, now=0.0)  # empty, 10 tokens a second
    decision = admit(policy(), request(prompt=50, output=50), (group(),), now=5.0, tenant_budget=bucket)
    assert (decision.outcome, decision.reason, decision.http_status) == (
        Outcome.REJECT,
        AdmissionReason.TENANT_BUDGET,
        429,
    )
    assert decision.retry_after_seconds == 5  # 50 tokens there, 100 needed, 10 a second
    later = admit(policy(), request(prompt=50, output=50), (group(),), now=10.0, tenant_budget=bucket)
    assert later.outcome is Outcome.ADMIT and later.budget_tokens == 100


def test_retry_budget_bounds_a_storm() -> None:
    budget = RetryBudget(ratio=0.5)
    for _ in range(4):
        budget = budget.after(is_retry=False)
    allowed = 0
    for _ in range(10):
        decision = admit(policy(), request(is_retry=True), (group(),), now=100.0, retry_budget=budget)
        if decision.outcome is Outcome.ADMIT:
            allowed += 1
            budget = budget.after(is_retry=True)
        else:
            assert decision.reason is AdmissionReason.RETRY_BUDGET
    assert allowed == 2


def test_idempotency_collapses_duplicates_and_forgets_failures() -> None:
    ledger = IdempotencyLedger(ttl_seconds=60)
    assert ledger.claim("acme", "k1", now=0.0) is KeyState.NEW
    assert ledger.claim("acme", "k1", now=1.0) is KeyState.IN_FLIGHT
    assert ledger.claim("other", "k1", now=1.0) is KeyState.NEW  # keys are per tenant
    ledger.complete("acme", "k1", now=2.0)
    assert ledger.claim("acme", "k1", now=3.0) is KeyState.COMPLETED
    assert ledger.claim("acme", "k1", now=70.0) is KeyState.NEW  # expired
    ledger.release("acme", "k1")
    assert ledger.claim("acme", "k1", now=71.0) is KeyState.NEW


def test_idempotency_ledger_is_bounded() -> None:
    ledger = IdempotencyLedger(ttl_seconds=600, max_keys=3)
    for index in range(10):
        ledger.claim("acme", f"k{index}", now=float(index))
    assert len(ledger) == 3


def test_policy_from_the_slopolicy() -> None:
    spec = SloPolicySpec.model_validate(
        {
            "revision": "r1",
            "classes": [
                {"name": "batch", "ttftSeconds": 30, "itlSeconds": 0.2, "overloadAction": "Defer"},
                {"name": "chat", "ttftSeconds": 1, "itlSeconds": 0.05, "maxPromptTokens": 4000},
            ],
            "admission": {"defaultClass": "chat", "gates": [{"name": "Budget", "enabled": False}]},
        }
    )
    compiled = admission_policy(spec, FLOOR, PRICING, context_tokens=8192)
    assert compiled.default_class == "chat"
    assert compiled.gates == (Gate.CONTRACT, Gate.MEMORY, Gate.DEADLINE)
    assert compiled.classes["chat"].max_prompt_tokens == 4000
    assert compiled.classes["batch"].overload_action is OverloadAction.DEFER


def test_default_class_must_exist() -> None:
    with pytest.raises(ValueError, match="defaultClass"):
        SloPolicySpec.model_validate(
            {
                "revision": "r1",
                "classes": [{"name": "chat", "ttftSeconds": 1, "itlSeconds": 0.05}],
                "admission": {"defaultClass": "gold"},
            }
        )


@given(
    waiting=st.floats(0, 1000),
    prompt=st.integers(1, 4000),
    output=st.integers(1, 4000),
)
def test_admitted_requests_are_predicted_to_meet_their_ttft(waiting: float, prompt: int, output: int) -> None:
    """Property: with the deadline gate on, nothing is admitted whose predicted TTFT misses."""
    decision = admit(policy(), request(prompt, output), (group(waiting_work_seconds=waiting),), now=100.0)
    if decision.outcome is Outcome.ADMIT:
        assert waiting <= 1.0
    assert decision.outcome in (Outcome.ADMIT, Outcome.REJECT)


@pytest.mark.parametrize(
    ("in_flight", "limit", "running_work", "capacity", "expected"),
    [
        pytest.param(3, 4, 12.0, 2.0, 0.0, id="a-free-slot-means-no-wait"),
        pytest.param(0, 0, 0.0, 2.0, 0.0, id="nothing-in-flight"),
        pytest.param(4, 4, 12.0, 2.0, 1.5, id="full-waits-one-mean-request-at-the-groups-rate"),
        pytest.param(8, 4, 12.0, 2.0, 0.75, id="over-the-limit-counts-as-full"),
        pytest.param(4, 4, 12.0, 0.0, math.inf, id="a-group-that-serves-nothing-never-frees-one"),
    ],
)
def test_a_full_group_frees_a_slot_after_about_one_mean_requests_work(
    in_flight: int, limit: int, running_work: float, capacity: float, expected: float
) -> None:
    assert slot_wait_seconds(in_flight, limit, running_work, capacity) == expected


def test_a_full_group_with_nothing_queued_still_makes_a_request_wait_for_a_slot() -> None:
    """Every slot busy, the queue empty: the request waits for a slot before its prefill, and the
    gate counts that wait (without it the request would be admitted and miss its target)."""
    full = group(slot_wait_seconds=1.5)
    assert admit(policy(), request(), (group(),), now=100.0).outcome is Outcome.ADMIT
    decision = admit(policy(), request(), (full,), now=100.0)
    assert (decision.outcome, decision.reason) == (Outcome.REJECT, AdmissionReason.DEADLINE)


@given(level=st.floats(0, 1000), spent=st.floats(0, 1000), later=st.floats(0, 600))
def test_token_bucket_never_exceeds_its_burst(level: float, spent: float, later: float) -> None:
    bucket = replace(TokenBucket.full(600, now=0.0), level_tokens=level).spend(spent, now=0.0)
    assert bucket.level_at(later) <= 600
    assert bucket.level_at(later) >= bucket.level_at(0.0)


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert [retry_after_seconds(x) for x in (0.0, 0.2, 1.0, 1.01, math.inf)] == [1, 1, 1, 2, 1]


def test_drain_meter_measures_the_pace_of_saturated_dispatches() -> None:
    from goodput.controllers.requests.admission import DrainRateMeter

    meter = DrainRateMeter(max_samples=8, min_samples=4)
    for step in range(3):
        meter.record(step * 0.5, 0.1)
    assert meter.work_seconds_per_second() is None  # too few samples
    for step in range(3, 20):
        meter.record(step * 0.5, 0.1)
    assert meter.work_seconds_per_second() == pytest.approx(0.2)  # 0.1 work-second every 0.5 s
    meter.reset()
    assert meter.work_seconds_per_second() is None


# --- the measured correction ----------------------------------------------------------------------


def test_the_deadline_gate_scales_its_predicted_wait_and_service_by_the_measured_correction() -> None:
    """0.4 s of queued work (0.6 s at the p90 price) fits a 1 s target as the figures say; twice as slow
    as measured, it does not, and the refusal says the correction."""
    loads = (group(waiting_work_seconds=0.4),)
    as_figured = admit(policy(), request(), loads, now=100.0)
    assert as_figured.outcome is Outcome.ADMIT
    assert as_figured.deadline is not None and as_figured.deadline.ttft_correction == 1.0
    corrected = admit(policy(), request(), loads, now=100.0, ttft_correction=2.0)
    assert (corrected.outcome, corrected.reason) == (Outcome.REJECT, AdmissionReason.DEADLINE)
    assert "corrected x2.00" in corrected.message
    refused_as_figured = admit(policy(), request(), (group(waiting_work_seconds=5.0),), now=100.0)
    assert refused_as_figured.reason is AdmissionReason.DEADLINE
    assert "corrected" not in refused_as_figured.message


def test_time_already_waited_is_not_scaled() -> None:
    """The correction is of the prediction; the time the request has already waited is known."""
    waited = request(arrival_time=99.5)
    check = predicted_ttft(
        policy(), (group(waiting_work_seconds=0.1),), 500, 99.5, 100.0, ttft_correction=3.0
    )
    assert check.waited_seconds == 0.5
    assert check.predicted_ttft_seconds == pytest.approx(0.5 + 3.0 * check.ahead_seconds)
    decision = admit(policy(), waited, (group(),), now=100.0, ttft_correction=3.0)
    assert decision.deadline is not None
    assert decision.deadline.predicted_ttft_seconds == pytest.approx(
        0.5 + 3.0 * decision.deadline.ahead_seconds
    )


@given(
    waiting=st.floats(0, 5),
    lower=st.floats(0.5, 4.0),
    higher=st.floats(0.5, 4.0),
)
def test_a_larger_correction_never_admits_what_a_smaller_one_refused(
    waiting: float, lower: float, higher: float
) -> None:
    lower, higher = sorted((lower, higher))
    loads = (group(waiting_work_seconds=waiting),)
    strict = admit(policy(), request(), loads, now=100.0, ttft_correction=higher)
    lenient = admit(policy(), request(), loads, now=100.0, ttft_correction=lower)
    if strict.outcome is Outcome.ADMIT:
        assert lenient.outcome is Outcome.ADMIT
        assert strict.deadline is not None and strict.deadline.predicted_ttft_seconds <= 1.0
