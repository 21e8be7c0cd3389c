"""Baseline scaling policies, implemented from their documented algorithms (anchors §3.10).

- Kubernetes HPA (`pkg/controller/podautoscaler`): desired = ceil(ready · usage/target) with a 0.1
  tolerance band, unready groups counted as idle on scale-up, missing metrics counted
  conservatively, a 300 s scale-down stabilisation window taking the highest recommendation,
  immediate scale-up, and the default rate policies (up: max(+100 %, +4) per 15 s; down: −100 % per
  15 s). A target at zero replicas is not scaled (minReplicas > 0), one outside [min, max] is set to
  the bound without limits. Synced every 15 s. The stabilisation and step policies are the
  controllers' (`controllers.autoscale.behavior`), the same functions goodput's decision calls.
- HPA on `vllm:num_requests_running` (`HpaRunningRequests`): a Pods metric with an AverageValue
  target per group (the gauge each group's leader exports, as a Prometheus adapter serves it), the
  same replica calculation, tolerance and behaviour as above. The GPU-utilisation HPA
  (`HpaGpuUtilization`) is kept for comparison and labelled as such: a busy fraction reads about 1.0
  at any real load, so its target either pegs `maxReplicas` or never moves.
- KEDA: a ScaledObject on `sum(vllm:num_requests_waiting)` is an HPA External metric with an
  AverageValue target: desired = ceil(total / target) against `status.replicas` (ready groups),
  same tolerance and behaviour; KEDA itself, not the HPA, scales a target from zero on activation.
  KEDA's `pollingInterval` (30 s) drives activation and
  `cooldownPeriod` (300 s) only the step to zero (it never delays N → N−1, the HPA window does).
  `KedaQueue` is the same ScaledObject on `sum(waiting + running)`, the queue a team would scale on;
  `KedaCronQueue` adds KEDA's cron trigger: `desiredReplicas` inside each window of the day (one
  replica outside), an External metric of AverageValue 1; the HPA computes one recommendation per
  trigger and takes the largest.
- Knative KPA (`pkg/autoscaler/scaling/autoscaler.go`): concurrency averaged over a 60 s stable and
  a 6 s panic window, desired = ceil(average / target per group) bounded by the max scale-up rate
  (1000) and scale-down rate (2); panic when the panic-window proposal is ≥ 200 % of ready, never
  scaling down while panicking, leaving panic one stable window after the last over-threshold tick.
- A fixed fleet.

Each algorithm is a pure function of plain values and a frozen state; the classes are thin shells
that read the observation and thread the state through.

Where the simulation departs from the documented controllers (checked against the HPA algorithm
details, KEDA's Prometheus scaler and Knative's autoscaler documentation):

- The unit is a replica *group* (the ModelGroup's `/scale` subresource), not a pod; a group's GPU
  utilisation is the mean over its GPUs, as an HPA Pods metric averaged over the group's pods would be.
- HPA treats not-yet-ready pods as unready (0 on a scale-up) only for CPU; for a Pods metric such as
  DCGM's GPU utilisation, a starting pod with a GPU already reports (near 0) and counts as ready. Here
  starting groups count as 0 on a scale-up and are left out on a scale-down, which for a scale-down is
  slightly less eager than the real controller.
- The metric is a fraction (0-1) where DCGM exports 0-100; the target is scaled alike.
- KEDA's `status.replicas` is the ModelGroup's ready groups; `activationThreshold` is 0 (the default)
  and the fleet never scales to zero (minReplicas >= 1), so `cooldownPeriod` never acts.
- KPA's concurrency is vLLM's running + waiting requests per group (what queue-proxy would count in
  front of it); there is no activator and no scale-to-zero.
- In the fair benchmark (`simulator.fair_bench`) each target (HPA utilisation, KEDA waiting per group,
  KPA concurrency per group) is swept on a training window; none is derived from goodput's envelope.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from goodput.api import vllm_names
from goodput.api.reasons import Reason
from goodput.controllers.autoscale.behavior import clamp, limit_rate, stabilize
from goodput.controllers.autoscale.forecast import DAY_SECONDS
from goodput.controllers.autoscale.model import (
    Recommendation,
    ScaleEvent,
    ScalingRules,
    SelectPolicy,
    StepPolicy,
    StepPolicyType,
)
from goodput.simulator.fleet_policy import FleetObservation, FleetPolicy, PolicyAnswer
from goodput.simulator.metrics import FleetSample, MetricsView

# ---------------------------------------------------------------------------------------------- HPA

HPA_TOLERANCE = 0.1
"""kube-controller-manager's `--horizontal-pod-autoscaler-tolerance` default."""


def _hpa_default_scale_up() -> ScalingRules:
    """autoscaling/v2's default `behavior.scaleUp`: no stabilisation window, and per 15 s at most
    100 % more or 4 more replicas, whichever allows more (selectPolicy Max)."""
    return ScalingRules(
        tolerance=HPA_TOLERANCE,
        stabilization_window_seconds=0.0,
        policies=(
            StepPolicy(StepPolicyType.PERCENT, 100, 15.0),
            StepPolicy(StepPolicyType.GROUPS, 4, 15.0),
        ),
        select_policy=SelectPolicy.MAX,
    )


def _hpa_default_scale_down() -> ScalingRules:
    """autoscaling/v2's default `behavior.scaleDown`: a 300 s stabilisation window, then up to
    100 % of the replicas per 15 s."""
    return ScalingRules(
        tolerance=HPA_TOLERANCE,
        stabilization_window_seconds=300.0,
        policies=(StepPolicy(StepPolicyType.PERCENT, 100, 15.0),),
        select_policy=SelectPolicy.MAX,
    )


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    """An HPA's `behavior`, in the controllers' `ScalingRules` (the one step limiter's input).

    The HPA's tolerance is one controller-manager flag for both directions, so both rules carry the
    same tolerance.
    """

    scale_up: ScalingRules = field(default_factory=_hpa_default_scale_up)
    scale_down: ScalingRules = field(default_factory=_hpa_default_scale_down)

    def __post_init__(self) -> None:
        if self.scale_up.tolerance != self.scale_down.tolerance:
            raise ValueError("the HPA's tolerance is one value: scale_up and scale_down must agree")

    @property
    def tolerance(self) -> float:
        return self.scale_up.tolerance

    def longest_memory_seconds(self) -> float:
        """How far back a recommendation or a scale event can still matter."""
        policies = self.scale_up.policies + self.scale_down.policies
        return max(
            self.scale_up.stabilization_window_seconds,
            self.scale_down.stabilization_window_seconds,
            *(policy.period_seconds for policy in policies),
        )


@dataclass(frozen=True, slots=True)
class HpaState:
    """The controller's memory: unstabilised recommendations and applied scale events, timestamped."""

    recommendations: tuple[Recommendation, ...] = ()
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()


def within_tolerance(usage_ratio: float, tolerance: float) -> bool:
    return 1.0 - tolerance <= usage_ratio <= 1.0 + tolerance


def plain_metric_replicas(
    ready_values: tuple[float, ...],
    *,
    unready_count: int,
    missing_count: int,
    current_replicas: int,
    target: float,
    tolerance: float,
) -> int:
    """HPA's `calcPlainMetricReplicas` for a per-pod metric with an average target.

    ready_values: the metric of each ready pod (group) with a sample; unready_count: pods still
    starting (treated as 0 on a scale-up); missing_count: ready pods without a sample yet (treated as
    the target on a scale-down and 0 on a scale-up). The direction is never flipped by the
    adjustment, and a result inside the tolerance band keeps the current count.
    """
    if not ready_values:
        return current_replicas
    usage_ratio = sum(ready_values) / len(ready_values) / target
    scale_up_with_unready = unready_count > 0 and usage_ratio > 1.0
    if not scale_up_with_unready and missing_count == 0:
        if within_tolerance(usage_ratio, tolerance):
            return current_replicas
        return math.ceil(usage_ratio * len(ready_values))
    values = list(ready_values)
    if missing_count:
        values.extend([target if usage_ratio < 1.0 else 0.0] * missing_count)
    if scale_up_with_unready:
        values.extend([0.0] * unready_count)
    new_ratio = sum(values) / len(values) / target
    if (
        within_tolerance(new_ratio, tolerance)
        or (usage_ratio > 1.0 > new_ratio)
        or (usage_ratio < 1.0 < new_ratio)
    ):
        return current_replicas
    proposed = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and proposed > current_replicas) or (new_ratio > 1.0 and proposed < current_replicas):
        return current_replicas
    return proposed


def external_average_value_replicas(
    total: float, status_replicas: int, target_average: float, tolerance: float
) -> int:
    """HPA's `GetExternalPerPodMetricReplicas`: an External metric against an AverageValue target."""
    replicas = max(status_replicas, 0)
    if replicas == 0:
        return math.ceil(total / target_average)
    usage_ratio = total / (target_average * replicas)
    if within_tolerance(usage_ratio, tolerance):
        return replicas
    return math.ceil(total / target_average)


def reconcile_replicas(
    recommended: int,
    current: int,
    *,
    min_replicas: int,
    max_replicas: int,
    behavior: HpaBehavior,
    state: HpaState,
    now: float,
) -> tuple[int, str, HpaState]:
    """HPA's `reconcileAutoscaler` once the metric's recommendation is known.

    A target at zero replicas (with minReplicas > 0) is not scaled ("ScalingDisabled"); one outside
    [min, max] is set to the bound it crossed without stabilisation or step limits; otherwise the
    recommendation goes through `normalize`.
    """
    if current == 0 and min_replicas != 0:
        return current, Reason.SCALING_DISABLED, state
    if current > max_replicas or current < min_replicas:
        desired = min(max(current, min_replicas), max_replicas)
        reason = Reason.TOO_MANY_REPLICAS if current > max_replicas else Reason.TOO_FEW_REPLICAS
        return desired, reason, _record(state, behavior, current, desired, now)
    return normalize(
        recommended,
        current,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        behavior=behavior,
        state=state,
        now=now,
    )


def normalize(
    recommended: int,
    current: int,
    *,
    min_replicas: int,
    max_replicas: int,
    behavior: HpaBehavior,
    state: HpaState,
    now: float,
) -> tuple[int, str, HpaState]:
    """HPA's `normalizeDesiredReplicasWithBehaviors`: stabilise, then bound and rate-limit.

    On its first sync the controller seeds the recommendations with the current count
    (`maybeInitScaleDownStabilizationWindow`), so a fresh HPA never scales in before one window.
    The stabilisation and step limits are the controllers' (`controllers.autoscale.behavior`).
    Bounding before the step limit gives the HPA's reasons: "ScaleUpLimit" only when the step limit
    is below maxReplicas, "TooManyReplicas" otherwise (and alike downwards).
    """
    if not state.recommendations and behavior.scale_down.stabilization_window_seconds > 0:
        state = replace(state, recommendations=(Recommendation(now, current),))
    stabilized, stabilize_guard = stabilize(
        current,
        recommended,
        state.recommendations,
        scale_up=behavior.scale_up,
        scale_down=behavior.scale_down,
        now=now,
    )
    reason = str(stabilize_guard) if stabilize_guard is not None else Reason.DESIRED_WITHIN_RANGE
    desired = stabilized
    if stabilized != current:
        desired, bound_guard = clamp(stabilized, min_replicas, max_replicas)
        desired, limit_guard = limit_rate(
            current,
            desired,
            up_events=state.scale_up_events,
            down_events=state.scale_down_events,
            scale_up=behavior.scale_up,
            scale_down=behavior.scale_down,
            now=now,
            percent_floor_groups=0,
        )
        guard = limit_guard or bound_guard
        reason = str(guard) if guard is not None else reason
    horizon = now - behavior.longest_memory_seconds()
    recommendations = (
        *(sample for sample in state.recommendations if sample.at > horizon),
        Recommendation(now, recommended),
    )
    return (
        desired,
        reason,
        _record(replace(state, recommendations=recommendations), behavior, current, desired, now),
    )


def _record(state: HpaState, behavior: HpaBehavior, current: int, desired: int, now: float) -> HpaState:
    """`storeScaleEvent`: remember a change for the step policies' periods, forget expired ones."""
    horizon = now - behavior.longest_memory_seconds()
    ups = tuple(event for event in state.scale_up_events if event.at > horizon)
    downs = tuple(event for event in state.scale_down_events if event.at > horizon)
    if desired > current:
        ups = (*ups, ScaleEvent(now, desired - current))
    elif desired < current:
        downs = (*downs, ScaleEvent(now, current - desired))
    return replace(state, scale_up_events=ups, scale_down_events=downs)


def per_group_metric_step(
    values: tuple[float, ...],
    target: float,
    observation: FleetObservation,
    behavior: HpaBehavior,
    state: HpaState,
) -> tuple[int, str, int, HpaState]:
    """One HPA sync on a per-pod metric with an AverageValue/Utilization target (one value per ready
    group that reported): the plain-metric recommendation, then the behaviour's stabilisation and
    step limits. Returns (desired, reason, recommended, next state)."""
    recommended = plain_metric_replicas(
        values,
        unready_count=observation.starting_groups,
        missing_count=max(0, observation.ready_groups - len(values)),
        current_replicas=observation.desired_groups,
        target=target,
        tolerance=behavior.tolerance,
    )
    desired, reason, state = reconcile_replicas(
        recommended,
        observation.desired_groups,
        min_replicas=observation.min_groups,
        max_replicas=observation.max_groups,
        behavior=behavior,
        state=state,
        now=observation.now,
    )
    return desired, reason, recommended, state


def group_rates(view: MetricsView, counter: str, window_seconds: float) -> dict[str, float]:
    """Per serving group, a counter's rate over the trailing window (PromQL `rate(counter[window])`).

    A group first seen inside the window is rated from its first sample; one seen only in the
    latest sample has no rate yet (it counts as missing).
    """
    latest = view.latest
    if latest is None:
        return {}
    first_seen: dict[str, tuple[float, float]] = {}
    for sample in view.within(latest.time - window_seconds - 1e-9):
        if sample.time >= latest.time:
            break
        for metrics in sample.groups:
            if metrics.serving and metrics.group not in first_seen:
                first_seen[metrics.group] = (sample.time, float(getattr(metrics, counter)))
    rates: dict[str, float] = {}
    for metrics in latest.groups:
        if metrics.serving and metrics.group in first_seen:
            since, value = first_seen[metrics.group]
            rates[metrics.group] = (float(getattr(metrics, counter)) - value) / (latest.time - since)
    return rates


@dataclass
class HpaGpuUtilization:
    """HPA on DCGM GPU utilisation (a Pods metric with an AverageValue target), synced every 15 s."""

    target_utilization: float = 0.8
    metric_window_seconds: float = 60.0
    behavior: HpaBehavior = field(default_factory=HpaBehavior)
    interval_seconds: float = 15.0
    name: str = "hpa"
    state: HpaState = field(default_factory=HpaState)

    def describe(self) -> dict[str, float | str]:
        return {
            "metric": "DCGM_FI_DEV_GPU_UTIL (busy fraction)",
            "target": self.target_utilization,
            "window_seconds": self.metric_window_seconds,
            "tolerance": self.behavior.tolerance,
            "scale_down_stabilization_seconds": self.behavior.scale_down.stabilization_window_seconds,
            "sync_seconds": self.interval_seconds,
        }

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        current = observation.desired_groups
        if observation.metrics.latest is None:
            return PolicyAnswer(current, "hpa: no metrics yet")
        utilization = group_rates(observation.metrics, "gpu_busy_seconds_total", self.metric_window_seconds)
        values = tuple(min(1.0, value) for value in utilization.values())
        desired, reason, recommended, self.state = per_group_metric_step(
            values, self.target_utilization, observation, self.behavior, self.state
        )
        mean = sum(values) / len(values) if values else float("nan")
        return PolicyAnswer(
            desired,
            f"hpa {reason}: gpu utilisation {mean:.2f} vs target {self.target_utilization:.2f}",
            {"gpu_utilization": mean, "recommended": recommended},
        )


@dataclass
class KedaWaitingRequests:
    """KEDA ScaledObject on `sum(vllm:num_requests_waiting)`, AverageValue target per group."""

    target_waiting_per_group: float = 5.0
    polling_interval_seconds: float = 30.0
    cooldown_seconds: float = 300.0
    behavior: HpaBehavior = field(default_factory=HpaBehavior)
    interval_seconds: float = 15.0
    name: str = "keda"
    state: HpaState = field(default_factory=HpaState)
    _last_active: float = 0.0
    _last_poll: float = -math.inf
    _active: bool = True

    def describe(self) -> dict[str, float | str]:
        return {
            "metric": f"sum({vllm_names.NUM_REQUESTS_WAITING})",
            "target_average_value": self.target_waiting_per_group,
            "polling_interval_seconds": self.polling_interval_seconds,
            "cooldown_seconds": self.cooldown_seconds,
            "tolerance": self.behavior.tolerance,
            "scale_down_stabilization_seconds": self.behavior.scale_down.stabilization_window_seconds,
            "hpa_sync_seconds": self.interval_seconds,
        }

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        current = observation.desired_groups
        latest = observation.metrics.latest
        if latest is None:
            return PolicyAnswer(current, "keda: no metrics yet")
        waiting = float(sum(metrics.num_requests_waiting for metrics in latest.groups))
        now = observation.now
        if now - self._last_poll >= self.polling_interval_seconds:
            # the KEDA operator's poll: activation and the cooldown to zero
            self._last_poll = now
            if waiting > 0:
                self._active, self._last_active = True, now
            elif now - self._last_active >= self.cooldown_seconds:
                self._active = False
        if not self._active and observation.min_groups == 0:
            return PolicyAnswer(0, "keda: inactive past cooldownPeriod, scaling to zero")
        if current == 0:
            # KEDA's scale executor, not the HPA (which never scales from zero), activates a target
            groups = max(1, observation.min_groups)
            return PolicyAnswer(groups, f"keda: active, scaling from zero to {groups}")
        recommended = max(
            1,
            external_average_value_replicas(
                waiting, observation.ready_groups, self.target_waiting_per_group, self.behavior.tolerance
            ),
        )
        desired, reason, self.state = reconcile_replicas(
            recommended,
            current,
            min_replicas=max(1, observation.min_groups),
            max_replicas=observation.max_groups,
            behavior=self.behavior,
            state=self.state,
            now=now,
        )
        return PolicyAnswer(
            desired,
            f"keda {reason}: {waiting:.0f} waiting over "
            f"{observation.ready_groups} ready groups, target "
            f"{self.target_waiting_per_group:g} per group",
            {"waiting": waiting, "recommended": recommended},
        )


@dataclass
class HpaRunningRequests:
    """HPA on `vllm:num_requests_running` per group: a Pods metric with an AverageValue target.

    What a team that knows vLLM configures instead of GPU utilisation: the requests each group's
    engine is running, read from its latest scrape (a gauge, as a Prometheus adapter serves it),
    averaged over the ready groups and held against `target_running_per_group`. Running saturates at
    the engine's batch limit, so a target near that limit sees no queue behind it; the sweep finds
    the target a day needs.
    """

    target_running_per_group: float = 32.0
    behavior: HpaBehavior = field(default_factory=HpaBehavior)
    interval_seconds: float = 15.0
    name: str = "hpa-running"
    state: HpaState = field(default_factory=HpaState)

    def describe(self) -> dict[str, float | str]:
        return {
            "metric": f"{vllm_names.NUM_REQUESTS_RUNNING} (Pods metric, per group)",
            "target_average_value": self.target_running_per_group,
            "tolerance": self.behavior.tolerance,
            "scale_down_stabilization_seconds": self.behavior.scale_down.stabilization_window_seconds,
            "sync_seconds": self.interval_seconds,
        }

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        current = observation.desired_groups
        latest = observation.metrics.latest
        if latest is None:
            return PolicyAnswer(current, "hpa-running: no metrics yet")
        values = tuple(float(m.num_requests_running) for m in latest.groups if m.serving)
        desired, reason, recommended, self.state = per_group_metric_step(
            values, self.target_running_per_group, observation, self.behavior, self.state
        )
        mean = sum(values) / len(values) if values else float("nan")
        return PolicyAnswer(
            desired,
            f"hpa-running {reason}: {mean:.1f} running per group vs target {self.target_running_per_group:g}",
            {"running_per_group": mean, "recommended": recommended},
        )


@dataclass(frozen=True, slots=True)
class CronWindow:
    """One KEDA cron trigger: `desired_replicas` from `start_second_of_day` to `end_second_of_day`
    (a window may wrap past midnight)."""

    start_second_of_day: float
    end_second_of_day: float
    desired_replicas: int

    def __post_init__(self) -> None:
        for label, value in (
            ("start_second_of_day", self.start_second_of_day),
            ("end_second_of_day", self.end_second_of_day),
        ):
            if not 0.0 <= value <= DAY_SECONDS:
                raise ValueError(f"cron window {label} must be in [0, {DAY_SECONDS:g}], got {value}")
        if self.desired_replicas < 1:
            raise ValueError(f"cron window desired_replicas must be at least 1, got {self.desired_replicas}")

    def active(self, second_of_day: float) -> bool:
        if self.start_second_of_day <= self.end_second_of_day:
            return self.start_second_of_day <= second_of_day < self.end_second_of_day
        return second_of_day >= self.start_second_of_day or second_of_day < self.end_second_of_day


def cron_desired_replicas(windows: tuple[CronWindow, ...], second_of_day: float) -> int:
    """KEDA's cron scalers together: each reports its `desiredReplicas` inside its window and 1
    outside (the scaler's default), and the HPA takes the largest."""
    return max((w.desired_replicas for w in windows if w.active(second_of_day)), default=1)


def hourly_cron_windows(groups_by_hour: tuple[int, ...]) -> tuple[CronWindow, ...]:
    """One cron trigger per hour of the day with that hour's floor (24 values), as a team writes
    a ScaledObject from yesterday's profile. Every hour keeps its trigger, a floor of 1 too, so a
    day that never needed more than one group still makes a valid KedaCronQueue."""
    if len(groups_by_hour) != 24:
        raise ValueError(f"an hourly cron schedule takes 24 floors, got {len(groups_by_hour)}")
    return tuple(
        CronWindow(hour * 3600.0, (hour + 1) * 3600.0, groups) for hour, groups in enumerate(groups_by_hour)
    )


@dataclass
class KedaQueue:
    """KEDA ScaledObject on `sum(vllm:num_requests_waiting + vllm:num_requests_running)`: the
    requests each group holds, waiting or running, against an AverageValue target per group.

    `cron_windows` (set by `KedaCronQueue`): the cron triggers' floor by time of day, combined with
    the queue trigger by the HPA taking the larger recommendation. `day_offset_seconds` is the time
    of day at the simulation's t = 0.
    """

    target_queue_per_group: float = 32.0
    cron_windows: tuple[CronWindow, ...] = ()
    day_offset_seconds: float = 0.0
    behavior: HpaBehavior = field(default_factory=HpaBehavior)
    interval_seconds: float = 15.0
    name: str = "keda-queue"
    state: HpaState = field(default_factory=HpaState)

    def describe(self) -> dict[str, float | str]:
        described: dict[str, float | str] = {
            "metric": f"sum({vllm_names.NUM_REQUESTS_WAITING} + {vllm_names.NUM_REQUESTS_RUNNING})",
            "target_average_value": self.target_queue_per_group,
            "tolerance": self.behavior.tolerance,
            "scale_down_stabilization_seconds": self.behavior.scale_down.stabilization_window_seconds,
            "hpa_sync_seconds": self.interval_seconds,
        }
        if self.cron_windows:
            described["cron"] = ", ".join(
                f"{w.start_second_of_day / 3600:g}-{w.end_second_of_day / 3600:g} h: {w.desired_replicas}"
                for w in self.cron_windows
            )
        return described

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        current = observation.desired_groups
        latest = observation.metrics.latest
        if latest is None:
            return PolicyAnswer(current, f"{self.name}: no metrics yet")
        queue = float(sum(m.num_requests_waiting + m.num_requests_running for m in latest.groups))
        tolerance = self.behavior.tolerance
        from_queue = max(
            1,
            external_average_value_replicas(
                queue, observation.ready_groups, self.target_queue_per_group, tolerance
            ),
        )
        floor = cron_desired_replicas(
            self.cron_windows, (observation.now + self.day_offset_seconds) % DAY_SECONDS
        )
        from_cron = external_average_value_replicas(float(floor), observation.ready_groups, 1.0, tolerance)
        recommended = max(from_queue, from_cron) if self.cron_windows else from_queue
        desired, reason, self.state = reconcile_replicas(
            recommended,
            current,
            min_replicas=max(1, observation.min_groups),
            max_replicas=observation.max_groups,
            behavior=self.behavior,
            state=self.state,
            now=observation.now,
        )
        cron = f", cron floor {floor}" if self.cron_windows else ""
        return PolicyAnswer(
            desired,
            f"{self.name} {reason}: {queue:.0f} waiting or running over {observation.ready_groups} ready "
            f"groups, target {self.target_queue_per_group:g} per group{cron}",
            {"queue": queue, "cron_floor": float(floor), "recommended": recommended},
        )


@dataclass
class KedaCronQueue(KedaQueue):
    """KEDA's cron scaler (a floor by time of day, `cron_windows`) combined with its queue trigger:
    what a team that knows its daily profile writes into one ScaledObject."""

    name: str = "keda-cron-queue"

    def __post_init__(self) -> None:
        if not self.cron_windows:
            raise ValueError("KedaCronQueue needs at least one cron window (without one it is KedaQueue)")


# ---------------------------------------------------------------------------------------------- KPA


@dataclass(frozen=True, slots=True)
class KpaSpec:
    """Knative's autoscaler ConfigMap defaults, concurrency mode.

    target_per_group: the concurrency target per group. Knative's default (100 × 70 % utilisation)
    is sized for web requests; the bench sets it to 70 % of the concurrency one group holds at its
    measured capacity, as an operator tuning KPA for this model would.
    """

    target_per_group: float = 70.0
    stable_window_seconds: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold_percentage: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    tick_seconds: float = 2.0


@dataclass(frozen=True, slots=True)
class KpaState:
    panic_since: float | None = None
    """When the panic window last crossed the threshold (Knative's `panicTime`); None: stable mode."""
    max_panic_groups: int = 0


def kpa_decide(
    stable_concurrency: float,
    panic_concurrency: float,
    ready_groups: int,
    *,
    spec: KpaSpec,
    state: KpaState,
    now: float,
) -> tuple[int, str, KpaState]:
    """One KPA tick (`autoscaler.Scale`), before the min/max clamp of the PodAutoscaler."""
    ready = max(1, ready_groups)
    max_up = math.ceil(spec.max_scale_up_rate * ready)
    max_down = math.floor(ready / spec.max_scale_down_rate)
    stable_proposal = math.ceil(stable_concurrency / spec.target_per_group)
    panic_proposal = math.ceil(panic_concurrency / spec.target_per_group)
    desired_stable = int(min(max(stable_proposal, max_down), max_up))
    desired_panic = int(min(max(panic_proposal, max_down), max_up))
    over_threshold = panic_proposal / ready >= spec.panic_threshold_percentage / 100.0
    panic_since, max_panic = state.panic_since, state.max_panic_groups
    if over_threshold:
        panic_since = now
    elif panic_since is not None and panic_since + spec.stable_window_seconds < now:
        panic_since, max_panic = None, 0
    if panic_since is None:
        return desired_stable, "stable", KpaState(None, 0)
    desired = max(desired_stable, desired_panic)
    max_panic = max(max_panic, desired)
    return max_panic, "panic", KpaState(panic_since, max_panic)


def interval_concurrency(earlier: FleetSample, later: FleetSample) -> float:
    """Time-weighted requests in flight across the groups serving at `later`, between two scrapes."""
    before = earlier.by_group()
    area = 0.0
    for metrics in later.groups:
        previous = before.get(metrics.group)
        if metrics.serving and previous is not None:
            area += metrics.in_flight_seconds_total - previous.in_flight_seconds_total
    return float(area / (later.time - earlier.time))


@dataclass
class KnativeKpa:
    """Knative KPA on per-group concurrency (running + waiting), fed by 1 s scrapes like queue-proxy.

    Like Knative's metric collector, it keeps one concurrency bucket per scrape interval and averages
    the buckets inside each window, so a group that has since been drained still counts for the time
    it served.
    """

    spec: KpaSpec = field(default_factory=KpaSpec)
    name: str = "kpa"
    state: KpaState = field(default_factory=KpaState)
    scrape_interval_seconds: float = 1.0
    scrape_delay_seconds: float = 1.0
    _buckets: dict[float, tuple[float, float]] = field(default_factory=dict)
    """End time of a scrape interval -> (concurrency, interval seconds)."""

    @property
    def interval_seconds(self) -> float:
        return self.spec.tick_seconds

    def describe(self) -> dict[str, float | str]:
        spec = self.spec
        return {
            "metric": "concurrency (running + waiting per group)",
            "target_per_group": spec.target_per_group,
            "stable_window_seconds": spec.stable_window_seconds,
            "panic_window_seconds": spec.stable_window_seconds * spec.panic_window_percentage / 100,
            "panic_threshold": spec.panic_threshold_percentage / 100,
            "max_scale_up_rate": spec.max_scale_up_rate,
            "max_scale_down_rate": spec.max_scale_down_rate,
            "tick_seconds": spec.tick_seconds,
        }

    def _collect(self, view: MetricsView) -> None:
        samples = view.samples
        for earlier, later in itertools.pairwise(samples):
            if later.time not in self._buckets and later.time > earlier.time:
                self._buckets[later.time] = (interval_concurrency(earlier, later), later.time - earlier.time)
        horizon = view.as_of - 2 * self.spec.stable_window_seconds
        for stale in [time for time in self._buckets if time < horizon]:
            del self._buckets[stale]

    def _average(self, latest: float, window: float) -> float | None:
        inside = [
            (value, span) for time, (value, span) in self._buckets.items() if latest - window < time <= latest
        ]
        total = sum(span for _, span in inside)
        return sum(value * span for value, span in inside) / total if total > 0 else None

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        spec = self.spec
        latest = observation.metrics.latest
        if latest is None:
            return PolicyAnswer(observation.desired_groups, "kpa: no concurrency data yet")
        self._collect(observation.metrics)
        stable = self._average(latest.time, spec.stable_window_seconds)
        panic = self._average(latest.time, spec.stable_window_seconds * spec.panic_window_percentage / 100)
        if stable is None or panic is None:
            return PolicyAnswer(observation.desired_groups, "kpa: no concurrency data yet")
        desired, mode, self.state = kpa_decide(
            stable, panic, observation.ready_groups, spec=spec, state=self.state, now=observation.now
        )
        desired = max(observation.min_groups, min(observation.max_groups, desired))
        return PolicyAnswer(
            desired,
            f"kpa {mode}: concurrency stable {stable:.1f} panic {panic:.1f}, "
            f"target {spec.target_per_group:.1f} per group",
            {"stable_concurrency": stable, "panic_concurrency": panic, "mode": mode},
        )


@dataclass
class FixedFleet:
    """N groups, always: the provision-for-peak baseline."""

    groups: int
    interval_seconds: float = 60.0
    name: str = "fixed"

    def describe(self) -> dict[str, float | str]:
        return {"groups": self.groups}

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        return PolicyAnswer(self.groups, f"fixed fleet of {self.groups}")


def with_target(policy: HpaGpuUtilization, target: float) -> HpaGpuUtilization:
    """A copy of the HPA policy with another utilisation target (for sweeps)."""
    return replace(policy, target_utilization=target, state=HpaState())


# ---------------------------------------------------------------------------------------------- settings

_BEHAVIOR_KNOB = "scale_down_stabilization_seconds"

BASELINE_SETTINGS: dict[str, dict[str, str]] = {
    "hpa": {
        "target": "GPU busy fraction per group, 0-1 (default 0.8)",
        "window_seconds": "the busy fraction's rate window (default 60)",
        _BEHAVIOR_KNOB: "behavior.scaleDown.stabilizationWindowSeconds (default 300)",
    },
    "hpa-running": {
        "target": f"{vllm_names.NUM_REQUESTS_RUNNING} per group, AverageValue (default 32)",
        _BEHAVIOR_KNOB: "behavior.scaleDown.stabilizationWindowSeconds (default 300)",
    },
    "keda": {
        "target": f"{vllm_names.NUM_REQUESTS_WAITING} per group, AverageValue (default 5)",
        _BEHAVIOR_KNOB: "behavior.scaleDown.stabilizationWindowSeconds (default 300)",
    },
    "keda-queue": {
        "target": "waiting + running requests per group, AverageValue (default 32)",
        _BEHAVIOR_KNOB: "behavior.scaleDown.stabilizationWindowSeconds (default 300)",
    },
    "keda-cron-queue": {
        "target": "waiting + running requests per group, AverageValue (default 32)",
        "cron": "floors by hour of day, START-END:GROUPS joined by '/', e.g. 8-20:4/20-23:2 (required)",
        _BEHAVIOR_KNOB: "behavior.scaleDown.stabilizationWindowSeconds (default 300)",
    },
    "kpa": {
        "target": "concurrency (running + waiting) per group (default 16)",
        "stable_window_seconds": "the stable window (default 60)",
        "panic_threshold": "panic when the panic window's proposal is this many times ready (default 2)",
    },
    "fixed": {"groups": "the fleet's size (default: what the peak minute's work needs)"},
}
"""Each baseline's settings as `goodput simulate --baseline-setting KEY=VALUE` names them."""


def parse_baseline_settings(name: str, pairs: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` texts for baseline `name`, checked against its settings; an error names the
    setting and lists the ones the baseline has."""
    if name not in BASELINE_SETTINGS:
        raise ValueError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINE_SETTINGS)}")
    known = BASELINE_SETTINGS[name]
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--baseline-setting {pair!r}: expected KEY=VALUE")
        if key not in known:
            raise ValueError(
                f"--baseline-setting {key}: baseline {name} has no setting {key!r}; its settings: "
                + ", ".join(known)
            )
        settings[key] = value.strip()
    if name == "keda-cron-queue" and "cron" not in settings:
        raise ValueError("--baseline keda-cron-queue needs --baseline-setting cron=START-END:GROUPS/...")
    return settings


def _number(settings: Mapping[str, str], key: str, default: float, *, positive: bool = True) -> float:
    if key not in settings:
        return default
    try:
        value = float(settings[key])
    except ValueError:
        raise ValueError(f"--baseline-setting {key}: {settings[key]!r} is not a number") from None
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        raise ValueError(
            f"--baseline-setting {key}: must be {'positive' if positive else 'at least 0'}, got {value:g}"
        )
    return value


def parse_cron(text: str) -> tuple[CronWindow, ...]:
    """`8-20:4/20-23:2`: hours of the day and the floor inside them."""
    windows = []
    for part in filter(None, (piece.strip() for piece in text.split("/"))):
        hours, sep, groups = part.partition(":")
        start, dash, end = hours.partition("-")
        try:
            if not sep or not dash:
                raise ValueError(part)
            windows.append(CronWindow(float(start) * 3600.0, float(end) * 3600.0, int(groups)))
        except ValueError as error:
            raise ValueError(
                f"--baseline-setting cron: {part!r} is not START-END:GROUPS with hours 0-24 and "
                f"GROUPS >= 1 ({error})"
            ) from None
    if not windows:
        raise ValueError("--baseline-setting cron: no window given")
    return tuple(windows)


def _behavior(settings: Mapping[str, str]) -> HpaBehavior:
    window = _number(settings, _BEHAVIOR_KNOB, 300.0, positive=False)
    default = HpaBehavior()
    return replace(default, scale_down=replace(default.scale_down, stabilization_window_seconds=window))


def baseline_policy(name: str, settings: Mapping[str, str], *, fixed_groups: int) -> FleetPolicy:
    """Baseline `name` with `settings` (from `parse_baseline_settings`); `fixed_groups`: the fixed
    fleet's size when no `groups` setting is given."""
    if name == "hpa":
        return HpaGpuUtilization(
            target_utilization=_number(settings, "target", 0.8),
            metric_window_seconds=_number(settings, "window_seconds", 60.0),
            behavior=_behavior(settings),
        )
    if name == "hpa-running":
        return HpaRunningRequests(_number(settings, "target", 32.0), behavior=_behavior(settings))
    if name == "keda":
        return KedaWaitingRequests(_number(settings, "target", 5.0), behavior=_behavior(settings))
    if name == "keda-queue":
        return KedaQueue(_number(settings, "target", 32.0), behavior=_behavior(settings))
    if name == "keda-cron-queue":
        return KedaCronQueue(
            _number(settings, "target", 32.0),
            cron_windows=parse_cron(settings.get("cron", "")),
            behavior=_behavior(settings),
        )
    if name == "kpa":
        spec = KpaSpec(
            target_per_group=_number(settings, "target", 16.0),
            stable_window_seconds=_number(settings, "stable_window_seconds", 60.0),
            panic_threshold_percentage=100.0 * _number(settings, "panic_threshold", 2.0),
        )
        return KnativeKpa(spec)
    if name == "fixed":
        groups = _number(settings, "groups", float(fixed_groups))
        if groups != int(groups):
            raise ValueError(f"--baseline-setting groups: must be a whole number, got {groups:g}")
        return FixedFleet(int(groups))
    raise ValueError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINE_SETTINGS)}")
