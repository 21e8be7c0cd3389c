"""The baselines against their documented formulas: HPA's replica calculation, tolerance,
stabilisation and rate limits; KEDA's AverageValue over groups; Knative KPA's stable and panic modes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from goodput.controllers.autoscale.model import (
    Recommendation,
    ScaleEvent,
    ScalingRules,
    StepPolicy,
    StepPolicyType,
)
from goodput.simulator.baselines import (
    BASELINE_SETTINGS,
    HPA_TOLERANCE,
    CronWindow,
    FixedFleet,
    HpaBehavior,
    HpaGpuUtilization,
    HpaRunningRequests,
    HpaState,
    KedaCronQueue,
    KedaQueue,
    KedaWaitingRequests,
    KnativeKpa,
    KpaSpec,
    KpaState,
    baseline_policy,
    cron_desired_replicas,
    external_average_value_replicas,
    hourly_cron_windows,
    kpa_decide,
    normalize,
    parse_baseline_settings,
    parse_cron,
    plain_metric_replicas,
    reconcile_replicas,
)
from goodput.simulator.fleet_policy import FleetObservation
from goodput.simulator.metrics import (
    TTFT_BUCKETS_SECONDS,
    FleetSample,
    GroupScrape,
    HistogramAccumulator,
    MetricsView,
)

# ----------------------------------------------------------------------------- HPA replica calculation


@dataclass(frozen=True)
class PlainCase:
    name: str
    ready_values: tuple[float, ...]
    unready: int
    missing: int
    current: int
    target: float
    expected: int


PLAIN_CASES = [
    PlainCase("inside-tolerance-keeps-current", (0.85, 0.85), 0, 0, 2, 0.8, 2),
    PlainCase("scale-up-to-ceil-of-ratio-times-ready", (1.0, 1.0, 1.0), 0, 0, 3, 0.5, 6),
    PlainCase("scale-down-to-ceil-of-ratio-times-ready", (0.2, 0.2, 0.2, 0.2), 0, 0, 4, 0.8, 1),
    PlainCase("unready-counted-idle-can-cancel-a-scale-up", (1.0, 1.0), 2, 0, 4, 0.8, 4),
    PlainCase("unready-counted-idle-damps-a-scale-up", (1.0, 1.0), 1, 0, 3, 0.5, 4),
    PlainCase("missing-count-as-target-on-scale-down", (0.2, 0.2), 0, 2, 4, 0.8, 3),
    PlainCase("missing-count-as-zero-on-scale-up", (1.0, 1.0), 0, 2, 4, 0.5, 4),
    PlainCase("no-metrics-keeps-current", (), 0, 3, 3, 0.8, 3),
]


@pytest.mark.parametrize("case", PLAIN_CASES, ids=[c.name for c in PLAIN_CASES])
def test_hpa_plain_metric_replicas(case: PlainCase) -> None:
    assert (
        plain_metric_replicas(
            case.ready_values,
            unready_count=case.unready,
            missing_count=case.missing,
            current_replicas=case.current,
            target=case.target,
            tolerance=0.1,
        )
        == case.expected
    )


@pytest.mark.parametrize(
    ("total", "status_replicas", "expected"),
    [
        pytest.param(30.0, 3, 6, id="ceil-of-total-over-target"),
        pytest.param(16.0, 3, 3, id="inside-tolerance-keeps-ready-count"),
        pytest.param(0.0, 4, 0, id="no-backlog-asks-for-none"),
    ],
)
def test_external_average_value(total: float, status_replicas: int, expected: int) -> None:
    assert external_average_value_replicas(total, status_replicas, 5.0, 0.1) == expected


# ----------------------------------------------------------------------------- HPA behaviour
# Each case cites the rule of the upstream HorizontalPodAutoscaler it checks (Kubernetes docs,
# "Horizontal Pod Autoscaling", sections "Algorithm details" and "Configurable scaling behavior";
# pkg/controller/podautoscaler/horizontal.go).

NOW = 1000.0


def seen(*samples: tuple[float, int]) -> tuple[Recommendation, ...]:
    return tuple(Recommendation(at, groups) for at, groups in samples)


@dataclass(frozen=True)
class BehaviorCase:
    name: str
    rule: str
    recommended: int
    current: int
    state: HpaState
    expected: int
    reason: str
    max_replicas: int = 16
    min_replicas: int = 1


BEHAVIOR_CASES = [
    BehaviorCase(
        "scale-down-holds-the-highest-recommendation-of-300s",
        "scaleDown.stabilizationWindowSeconds defaults to 300: the highest recommendation inside it wins",
        2,
        5,
        HpaState(seen((NOW - 200, 5), (NOW - 100, 3))),
        5,
        "ScaleDownStabilized",
    ),
    BehaviorCase(
        "scale-down-to-the-highest-inside-the-window",
        "recommendations older than the 300 s window are forgotten",
        2,
        5,
        HpaState(seen((NOW - 400, 5), (NOW - 100, 3))),
        3,
        "ScaleDownStabilized",
    ),
    BehaviorCase(
        "scale-down-by-100-percent-at-once",
        "scaleDown default policy: 100 % of the replicas per 15 s",
        1,
        5,
        HpaState(seen((NOW - 400, 5))),
        1,
        "DesiredWithinRange",
    ),
    BehaviorCase(
        "scale-up-is-immediate",
        "scaleUp.stabilizationWindowSeconds defaults to 0",
        6,
        2,
        HpaState(seen((NOW - 100, 2))),
        6,
        "DesiredWithinRange",
    ),
    BehaviorCase(
        "scale-up-by-4-pods-when-more-than-100-percent",
        "scaleUp default policies: 100 % or 4 pods per 15 s, selectPolicy Max (1 + 4 > 1 x 2)",
        10,
        1,
        HpaState(seen((NOW - 100, 1))),
        5,
        "ScaleUpLimit",
    ),
    BehaviorCase(
        "scale-up-by-100-percent-when-more-than-4-pods",
        "scaleUp default policies: 100 % or 4 pods per 15 s, selectPolicy Max (6 x 2 > 6 + 4)",
        20,
        6,
        HpaState(seen((NOW - 100, 6))),
        12,
        "ScaleUpLimit",
    ),
    BehaviorCase(
        "scale-up-budget-of-the-period-already-spent",
        "a policy counts from the replicas at the start of its period (5 - 4 added = 1: at most 5)",
        12,
        5,
        HpaState(seen((NOW - 100, 5)), scale_up_events=(ScaleEvent(NOW - 5, 4),)),
        5,
        "ScaleUpLimit",
    ),
    BehaviorCase(
        "scale-up-budget-renews-after-the-period",
        "only scale events inside the policy's periodSeconds (15 s) count",
        12,
        5,
        HpaState(seen((NOW - 100, 5)), scale_up_events=(ScaleEvent(NOW - 20, 4),)),
        10,
        "ScaleUpLimit",
    ),
    BehaviorCase(
        "first-sync-seeds-the-window-with-the-current-count",
        "a new HPA starts its scale-down window with the current count",
        1,
        4,
        HpaState(),
        4,
        "ScaleDownStabilized",
    ),
    BehaviorCase(
        "max-below-the-step-limit-is-too-many-replicas",
        "the step limit (4 + 4 = 8) is not below maxReplicas 8: the reason is TooManyReplicas",
        20,
        4,
        HpaState(seen((NOW - 100, 4))),
        8,
        "TooManyReplicas",
        max_replicas=8,
    ),
    BehaviorCase(
        "from-zero-no-scaling",
        "a target scaled to zero replicas with minReplicas > 0 is not autoscaled (ScalingDisabled)",
        5,
        0,
        HpaState(),
        0,
        "ScalingDisabled",
    ),
    BehaviorCase(
        "above-max-goes-to-max-without-limits",
        "currentReplicas > maxReplicas: desired is maxReplicas, no stabilisation or step limit",
        9,
        12,
        HpaState(seen((NOW - 10, 12))),
        4,
        "TooManyReplicas",
        max_replicas=4,
    ),
    BehaviorCase(
        "below-min-goes-to-min-without-limits",
        "currentReplicas < minReplicas: desired is minReplicas, no step limit",
        1,
        1,
        HpaState(seen((NOW - 10, 1))),
        9,
        "TooFewReplicas",
        min_replicas=9,
    ),
]


@pytest.mark.parametrize("case", BEHAVIOR_CASES, ids=[c.name for c in BEHAVIOR_CASES])
def test_hpa_behavior(case: BehaviorCase) -> None:
    desired, reason, state = reconcile_replicas(
        case.recommended,
        case.current,
        min_replicas=case.min_replicas,
        max_replicas=case.max_replicas,
        behavior=HpaBehavior(),
        state=case.state,
        now=NOW,
    )
    assert (desired, reason) == (case.expected, case.reason), case.rule
    if desired > case.current:
        assert state.scale_up_events[-1] == ScaleEvent(NOW, desired - case.current)
    elif desired < case.current:
        assert state.scale_down_events[-1] == ScaleEvent(NOW, case.current - desired)


def test_hpa_remembers_the_unstabilised_recommendation() -> None:
    """The stabilisation window holds what the metric asked for, not what was applied."""
    _, _, state = normalize(
        2, 5, min_replicas=1, max_replicas=16, behavior=HpaBehavior(), state=HpaState(), now=NOW
    )
    assert state.recommendations == seen((NOW, 5), (NOW, 2))


def test_hpa_scale_down_rate_policy_of_one_pod_per_minute() -> None:
    one_per_minute = ScalingRules(
        tolerance=HPA_TOLERANCE,
        stabilization_window_seconds=0.0,
        policies=(StepPolicy(StepPolicyType.GROUPS, 1, 60.0),),
    )
    behavior = replace(HpaBehavior(), scale_down=one_per_minute)
    desired, reason, state = normalize(
        1, 6, min_replicas=1, max_replicas=10, behavior=behavior, state=HpaState(), now=NOW
    )
    assert (desired, reason) == (5, "ScaleDownLimit")
    desired, _, _ = normalize(
        1, 5, min_replicas=1, max_replicas=10, behavior=behavior, state=state, now=NOW + 30
    )
    assert desired == 5  # one pod already removed within the last 60 s


def test_hpa_tolerance_is_one_value() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        HpaBehavior(scale_down=replace(HpaBehavior().scale_down, tolerance=0.2))


# ----------------------------------------------------------------------------- KPA


@dataclass(frozen=True)
class KpaCase:
    name: str
    stable: float
    panic: float
    ready: int
    state: KpaState
    expected: int
    mode: str


KPA_CASES = [
    KpaCase("stable-mode-sizes-for-the-stable-window", 140.0, 150.0, 2, KpaState(), 2, "stable"),
    KpaCase(
        "panic-when-the-panic-window-asks-for-double-the-ready-groups",
        100.0,
        300.0,
        2,
        KpaState(),
        5,
        "panic",
    ),
    KpaCase("no-scale-down-while-panicking", 70.0, 70.0, 5, KpaState(NOW - 10, 5), 5, "panic"),
    KpaCase(
        "leave-panic-one-stable-window-after-the-last-surge",
        70.0,
        70.0,
        5,
        KpaState(NOW - 61, 5),
        2,
        "stable",
    ),
    KpaCase("scale-down-at-most-halves-the-ready-groups", 0.0, 0.0, 8, KpaState(), 4, "stable"),
]


@pytest.mark.parametrize("case", KPA_CASES, ids=[c.name for c in KPA_CASES])
def test_kpa_decide(case: KpaCase) -> None:
    desired, mode, state = kpa_decide(
        case.stable, case.panic, case.ready, spec=KpaSpec(target_per_group=70.0), state=case.state, now=NOW
    )
    assert (desired, mode) == (case.expected, case.mode)
    assert (state.panic_since is not None) == (mode == "panic")


# ----------------------------------------------------------------------------- the policy shells


def scraped(
    name: str,
    *,
    time: float = 0.0,
    waiting: int = 0,
    running: int = 0,
    busy: float = 0.0,
    in_flight: float = 0.0,
    serving: bool = True,
) -> GroupScrape:
    empty = HistogramAccumulator(TTFT_BUCKETS_SECONDS).snapshot()
    return GroupScrape(
        group=name,
        serving=serving,
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage_perc=0.0,
        kv_cache_size_tokens=1000,
        prompt_tokens_total=0,
        generation_tokens_total=0,
        prefix_cache_queries_total=0,
        prefix_cache_hits_total=0,
        num_preemptions_total=0,
        request_success_total=0,
        request_prompt_tokens_sum=0,
        request_generation_tokens_sum=0,
        gpu_busy_seconds_total=busy,
        in_flight_seconds_total=in_flight,
        waiting_prompt_tokens=0,
        time_to_first_token_seconds=empty,
        inter_token_latency_seconds=empty,
        request_queue_time_seconds=empty,
        e2e_request_latency_seconds=empty,
    )


def observe(
    samples: list[FleetSample], *, now: float, desired: int, ready: int, starting: int = 0
) -> FleetObservation:
    return FleetObservation(
        now=now,
        desired_groups=desired,
        placing_groups=0,
        provisioning_groups=starting,
        ready_groups=ready,
        draining_groups=0,
        min_groups=1,
        max_groups=16,
        metrics=MetricsView(now, tuple(samples)),
    )


def test_hpa_shell_reads_gpu_utilisation_as_the_busy_fraction_over_its_window() -> None:
    samples = [FleetSample(t, (scraped("a", busy=t), scraped("b", busy=t))) for t in (0.0, 30.0, 60.0)]
    policy = HpaGpuUtilization(target_utilization=0.8)
    recommendation = policy.recommend(observe(samples, now=60.0, desired=2, ready=2))
    assert recommendation.detail["gpu_utilization"] == pytest.approx(1.0)
    assert recommendation.desired_groups == 3  # ceil(2 × 1.0 / 0.8)


def test_keda_shell_averages_the_waiting_requests_over_ready_groups() -> None:
    samples = [FleetSample(0.0, (scraped("a", waiting=10), scraped("b", waiting=20)))]
    policy = KedaWaitingRequests(target_waiting_per_group=5.0)
    recommendation = policy.recommend(observe(samples, now=15.0, desired=2, ready=2))
    assert recommendation.detail["recommended"] == 6
    assert recommendation.desired_groups == 6


def test_kpa_shell_averages_concurrency_over_its_windows_and_keeps_drained_groups_history() -> None:
    # 2 serving groups at 50 in flight each for 60 s; group b is draining in the last sample
    samples = [
        FleetSample(
            float(t),
            (
                scraped("a", time=t, in_flight=50.0 * t),
                scraped("b", time=t, in_flight=50.0 * t, serving=t < 60),
            ),
        )
        for t in range(0, 61)
    ]
    policy = KnativeKpa(KpaSpec(target_per_group=20.0))
    recommendation = policy.recommend(observe(samples, now=60.0, desired=2, ready=1))
    # 59 intervals with 100 in flight and the last with 50 (b no longer serving): stable ≈ 99
    assert recommendation.detail["stable_concurrency"] == pytest.approx((59 * 100 + 50) / 60)
    assert recommendation.detail["mode"] == "panic"  # 6-s window: ceil(≈91.7/20)=5 ≥ 2 × 1 ready
    assert recommendation.desired_groups == 5


# ----------------------------------------------------------------------------- HPA on running requests


@dataclass(frozen=True)
class RunningCase:
    name: str
    running: tuple[int, ...]
    desired: int
    starting: int
    target: float
    expected: int


RUNNING_CASES = [
    # the Pods metric's AverageValue: desired = ceil(ready × mean / target)
    RunningCase("scale-up-to-ceil-of-mean-over-target", (60, 60), 2, 0, 40.0, 3),
    RunningCase("inside-tolerance-keeps-current", (42, 42), 2, 0, 40.0, 2),
    RunningCase("scale-down-after-the-first-sync-is-stabilised", (5, 5, 5, 5), 4, 0, 40.0, 4),
    # a starting group counts as 0 on a scale-up: (60 + 60 + 0) / 3 = 40 is the target
    RunningCase("a-starting-group-cancels-a-scale-up", (60, 60), 3, 1, 40.0, 3),
]


@pytest.mark.parametrize("case", RUNNING_CASES, ids=[c.name for c in RUNNING_CASES])
def test_hpa_on_running_requests_per_group(case: RunningCase) -> None:
    groups = tuple(scraped(f"g{i}", running=value) for i, value in enumerate(case.running))
    policy = HpaRunningRequests(target_running_per_group=case.target)
    answer = policy.recommend(
        observe(
            [FleetSample(0.0, groups)],
            now=15.0,
            desired=case.desired,
            ready=len(case.running),
            starting=case.starting,
        )
    )
    assert answer.desired_groups == case.expected


def test_hpa_on_running_requests_scales_in_once_its_window_has_passed() -> None:
    policy = HpaRunningRequests(target_running_per_group=40.0)
    quiet = [FleetSample(0.0, tuple(scraped(f"g{i}", running=5) for i in range(4)))]
    assert policy.recommend(observe(quiet, now=0.0, desired=4, ready=4)).desired_groups == 4
    # 300 s later every recommendation in the window asked for 1: ceil(4 × 5 / 40) = 1
    later = policy.recommend(observe(quiet, now=301.0, desired=4, ready=4))
    assert later.desired_groups == 1


# ---------------------------------------------------------------------- KEDA on the queue, and its cron


def test_keda_queue_counts_waiting_and_running_over_ready_groups() -> None:
    samples = [FleetSample(0.0, (scraped("a", waiting=10, running=50), scraped("b", waiting=20, running=50)))]
    answer = KedaQueue(target_queue_per_group=30.0).recommend(observe(samples, now=15.0, desired=2, ready=2))
    assert answer.detail["queue"] == 130.0
    assert answer.desired_groups == 5  # ceil(130 / 30)


@dataclass(frozen=True)
class CronCase:
    name: str
    windows: tuple[CronWindow, ...]
    second_of_day: float
    expected: int


NIGHT_AND_DAY = (CronWindow(8 * 3600.0, 20 * 3600.0, 4), CronWindow(22 * 3600.0, 2 * 3600.0, 2))
CRON_CASES = [
    CronCase("inside-a-window-its-desired-replicas", NIGHT_AND_DAY, 9 * 3600.0, 4),
    CronCase("outside-every-window-one-replica", NIGHT_AND_DAY, 21 * 3600.0, 1),
    CronCase("a-window-past-midnight-before-it", NIGHT_AND_DAY, 23 * 3600.0, 2),
    CronCase("a-window-past-midnight-after-it", NIGHT_AND_DAY, 1 * 3600.0, 2),
    CronCase("the-end-is-exclusive", NIGHT_AND_DAY, 20 * 3600.0, 1),
    CronCase(
        "overlapping-windows-take-the-largest", (*NIGHT_AND_DAY, CronWindow(0.0, 86400.0, 3)), 9 * 3600.0, 4
    ),
]


@pytest.mark.parametrize("case", CRON_CASES, ids=[c.name for c in CRON_CASES])
def test_cron_triggers_together(case: CronCase) -> None:
    assert cron_desired_replicas(case.windows, case.second_of_day) == case.expected


def test_keda_cron_queue_takes_the_larger_of_its_floor_and_its_queue() -> None:
    windows = (CronWindow(0.0, 3600.0, 5),)
    samples = [FleetSample(0.0, (scraped("a", running=10), scraped("b", running=10)))]
    policy = KedaCronQueue(target_queue_per_group=30.0, cron_windows=windows)
    in_window = policy.recommend(observe(samples, now=15.0, desired=2, ready=2))
    assert in_window.desired_groups == 5  # the floor: the queue alone asks for ceil(20 / 30) = 1
    busy = [FleetSample(0.0, (scraped("a", running=100), scraped("b", running=110)))]
    assert policy.recommend(observe(busy, now=30.0, desired=5, ready=5)).desired_groups == 7
    # the day offset places t = 0 at 23:00: t = 15 s is outside the window, the floor is 1
    late = KedaCronQueue(target_queue_per_group=30.0, cron_windows=windows, day_offset_seconds=23 * 3600.0)
    assert late.recommend(observe(samples, now=15.0, desired=2, ready=2)).detail["cron_floor"] == 1.0


def test_keda_cron_queue_without_a_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one cron window"):
        KedaCronQueue(target_queue_per_group=30.0)


def test_an_hourly_schedule_has_a_trigger_per_hour_even_where_the_floor_is_one() -> None:
    floors = (1,) * 8 + (3,) * 12 + (2,) * 4
    windows = hourly_cron_windows(floors)
    assert len(windows) == 24
    assert [cron_desired_replicas(windows, hour * 3600.0 + 1800.0) for hour in range(24)] == list(floors)
    # a day that never needed more than one group still makes a KedaCronQueue
    assert KedaCronQueue(30.0, cron_windows=hourly_cron_windows((1,) * 24)).cron_windows
    with pytest.raises(ValueError, match="24 floors"):
        hourly_cron_windows((1, 2))


# ----------------------------------------------------------------------------- settings by name


def test_every_baseline_setting_is_taken_by_name() -> None:
    settings = parse_baseline_settings(
        "keda-cron-queue",
        ["target=40", "cron=8-20:4/22-2:2", "scale-down-stabilization-seconds=120"],
    )
    policy = baseline_policy("keda-cron-queue", settings, fixed_groups=3)
    assert isinstance(policy, KedaCronQueue)
    assert policy.target_queue_per_group == 40.0
    assert policy.cron_windows == NIGHT_AND_DAY
    assert policy.behavior.scale_down.stabilization_window_seconds == 120.0
    fixed = baseline_policy("fixed", parse_baseline_settings("fixed", ["groups=6"]), fixed_groups=3)
    assert isinstance(fixed, FixedFleet) and fixed.groups == 6
    assert isinstance(baseline_policy("fixed", {}, fixed_groups=3), FixedFleet)
    for name in BASELINE_SETTINGS:
        if name != "keda-cron-queue":
            assert baseline_policy(name, {}, fixed_groups=3).describe()


@dataclass(frozen=True)
class BadSettingCase:
    name: str
    baseline: str
    pairs: tuple[str, ...]
    message: str


BAD_SETTING_CASES = [
    BadSettingCase(
        "unknown-knob-named", "keda-queue", ("targt=4",), "has no setting 'targt'; its settings: target"
    ),
    BadSettingCase("not-key-value", "kpa", ("target",), "expected KEY=VALUE"),
    BadSettingCase("unknown-baseline", "keda-queues", (), "unknown baseline 'keda-queues'"),
    BadSettingCase("cron-required", "keda-cron-queue", ("target=4",), "needs --baseline-setting cron"),
]


@pytest.mark.parametrize("case", BAD_SETTING_CASES, ids=[c.name for c in BAD_SETTING_CASES])
def test_a_bad_setting_is_an_error_naming_it(case: BadSettingCase) -> None:
    with pytest.raises(ValueError, match=case.message):
        parse_baseline_settings(case.baseline, list(case.pairs))


@pytest.mark.parametrize(
    ("baseline", "pair", "message"),
    [
        ("hpa-running", "target=many", "target: 'many' is not a number"),
        ("hpa-running", "target=0", "target: must be positive"),
        ("fixed", "groups=2.5", "groups: must be a whole number"),
        ("keda-cron-queue", "cron=8-20", "'8-20' is not START-END:GROUPS"),
        ("keda-cron-queue", "cron=8-25:2", "end_second_of_day must be in"),
        ("keda-cron-queue", "cron=8-20:0", "desired_replicas must be at least 1"),
    ],
)
def test_a_bad_value_is_an_error_naming_its_setting(baseline: str, pair: str, message: str) -> None:
    settings = parse_baseline_settings(baseline, [pair])
    with pytest.raises(ValueError, match=message):
        baseline_policy(baseline, settings, fixed_groups=3)


def test_cron_text_reads_hours() -> None:
    assert parse_cron("8-20:4/22-2:2") == NIGHT_AND_DAY
