"""Compile a ModelGroup and its SLOPolicy into what a scaling decision obeys.

The API speaks in user terms (an SLOPolicy's classes, signals and HPA-shaped behaviour; a
ModelGroup's bounds and capacity profile); `autoscale.decide` reads frozen value objects
(`ScalingPolicy`, `CapacityProfile`). This module is the one translation between the two, shared
by the operator and the simulator, so a policy evaluated offline is the policy deployed.

Two parts, compiled and cached separately because they change at different rates:

- `scaling_policy`: bounds from the ModelGroup, everything else from the SLOPolicy. Cheap.
- `capacity_profile`: the service-time model of one group on its hardware, priced and tabulated at
  the primary class's targets (a few hundred step-model evaluations), calibrated to the measured
  capacity and KV size the ModelGroup's `profile` records. Its inputs are named by `profile_key`, so
  a caller rebuilds it only when they change (not on every `spec.replicas` write).

What the API cannot say is not invented: a GPU the service-time model does not know needs a measured
KV size and capacity or a description, and a model without a catalog entry, `profile.modelShape` or
a config.json it can read cannot be priced; each is reported as a problem and nothing is compiled.
A config.json in a ConfigMap is read by the caller and passed in (`referenced`), with its content in
the profile's key, so an edited ConfigMap rebuilds the profile.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from goodput.api.modelgroup import ModelGroup, ModelGroupSpec
from goodput.api.slopolicy import ScalingRules as ApiScalingRules
from goodput.api.slopolicy import SloPolicy, SloPolicySpec
from goodput.controllers.autoscale.model import (
    GoodputSignal,
    KvCacheSignal,
    MetricStaleness,
    Mode,
    QueueWorkSignal,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    Signals,
    SlackSignal,
    SloTargets,
    StaleMetricsAction,
    StepPolicy,
    StepPolicyType,
)
from goodput.controllers.compile.slo_policy import policy_problems
from goodput.controllers.hardware import ReadConfig, batch_limits, step_cost_model
from goodput.estimators.capacity import CapacityProfile, build_capacity_profile
from goodput.estimators.service_time import StepCostModel


@dataclass(frozen=True, slots=True)
class ReferenceMix:
    """The request mix a profile is calibrated at, and the tails its safe estimates use.

    The API has no field for these (a ModelGroup's benchmark records its capacity at vLLM's usual
    chat shape), so the defaults are the estimators'; the simulator passes its trace's mix.
    """

    input_tokens: float = 1024.0
    output_tokens: float = 256.0
    input_tokens_p90: float | None = None
    output_tokens_p90_over_mean: float = 2.0


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """One SLOPolicy bound to one ModelGroup, ready for `decide`.

    metrics_window_seconds: the SLOPolicy's goodput window, over which attainment, goodput and the
    engine histograms are measured.
    """

    policy: ScalingPolicy
    profile: CapacityProfile
    policy_name: str
    metrics_window_seconds: float


def scaling_policy(spec: ModelGroupSpec, slo: SloPolicySpec, *, shadow: bool = False) -> ScalingPolicy:
    """The decision's policy: the ModelGroup's bounds and the SLOPolicy's targets and behaviour."""
    return bounded_scaling_policy(
        GroupBounds(spec.min_replicas, spec.max_replicas, spec.warm_replicas), slo, shadow=shadow
    )


@dataclass(frozen=True, slots=True)
class GroupBounds:
    """The group counts a decision stays within: a ModelGroup's replica bounds, or the simulator's
    what-if bounds (a larger GPU budget than the ModelGroup allows)."""

    min_groups: int
    max_groups: int
    warm_groups: int = 0


def bounded_scaling_policy(bounds: GroupBounds, slo: SloPolicySpec, *, shadow: bool = False) -> ScalingPolicy:
    """The SLOPolicy's targets and behaviour within `bounds`.

    Warm groups never exceed the maximum. A shadow policy is never applied, so it is compiled as
    Advisory (unless Frozen): its decisions must not remember scale events that never happened, or
    its step limits would drift from the active policy's.
    """
    autoscaling = slo.autoscaling
    signals = autoscaling.signals
    mode = Mode(autoscaling.mode)
    if shadow and mode is Mode.ACTIVE:
        mode = Mode.ADVISORY
    return ScalingPolicy(
        min_groups=bounds.min_groups,
        max_groups=bounds.max_groups,
        warm_groups=min(bounds.warm_groups, bounds.max_groups),
        revision=slo.revision,
        mode=mode,
        interval_seconds=float(autoscaling.interval_seconds),
        classes=tuple(
            SloTargets(cls.name, cls.ttft_seconds, cls.itl_seconds, cls.attainment, cls.percentile)
            for cls in slo.classes
        ),
        signals=Signals(
            queue_work=QueueWorkSignal(
                drain_target_seconds=signals.queue_work.drain_target_seconds,
                safety_factor=signals.queue_work.safety_factor,
            )
            if signals.queue_work.enabled
            else None,
            slack=SlackSignal(
                min_slack_seconds=signals.slack.min_slack_seconds,
                low_slack_fraction=signals.slack.low_slack_fraction,
            )
            if signals.slack.enabled
            else None,
            kv_cache=KvCacheSignal(min_free_fraction=signals.kv_cache.min_free_fraction)
            if signals.kv_cache.enabled
            else None,
            goodput=GoodputSignal(attainment_floor=signals.goodput.attainment_floor)
            if signals.goodput.enabled
            else None,
        ),
        scale_up=scaling_rules(autoscaling.scale_up, max_groups=bounds.max_groups),
        scale_down=scaling_rules(autoscaling.scale_down, max_groups=bounds.max_groups),
        staleness=MetricStaleness(
            max_age_seconds=float(autoscaling.metrics.max_age_seconds),
            action=StaleMetricsAction(autoscaling.metrics.on_stale),
        ),
    )


def scaling_rules(rules: ApiScalingRules, *, max_groups: int) -> ScalingRules:
    """One direction's behaviour. An empty list of step policies means no step limit, which is a
    policy allowing the whole range [0, maxReplicas] in any period."""
    steps = tuple(
        StepPolicy(StepPolicyType(step.type), step.value, float(step.period_seconds))
        for step in rules.policies
    )
    select = SelectPolicy(rules.select_policy)
    if not steps and select is not SelectPolicy.DISABLED:
        steps = (StepPolicy(StepPolicyType.GROUPS, max(1, max_groups), 1.0),)
    return ScalingRules(
        tolerance=rules.tolerance,
        stabilization_window_seconds=float(rules.stabilization_window_seconds),
        policies=steps,
        select_policy=select,
    )


def capacity_profile(
    spec: ModelGroupSpec,
    slo: SloPolicySpec,
    mix: ReferenceMix = ReferenceMix(),
    referenced: ReadConfig = None,
    *,
    envelope_work_seconds_per_second: float | None = None,
) -> CapacityProfile | str:
    """One group's capacity profile at the SLOPolicy's primary class, or why it cannot be built.

    The primary (first) class sets the targets, as it is the class engine histograms are judged
    against. A measured capacity replaces the model's capacity at the reference mix and scales the
    whole grid with it: `envelope_work_seconds_per_second` where a benchmark measured one (the
    simulator's capacity envelope), else the ModelGroup's `capacityWorkSecondsPerSecond`.
    `referenced`: the config.json read from `profile.modelConfigRef`, or why it could not be read.
    """
    model = step_cost_model(spec, referenced)
    if isinstance(model, str):
        return model
    limits = batch_limits(spec)
    if limits is None:
        return (
            "spec.profile.maxNumSeqs and spec.profile.maxNumBatchedTokens are required for a GPU "
            "goodput does not know"
        )
    measured = envelope_work_seconds_per_second
    if measured is None and spec.profile is not None:
        measured = spec.profile.capacity_work_seconds_per_second
    primary = slo.classes[0]
    return model_capacity_profile(model, limits, (primary.ttft_seconds, primary.itl_seconds), mix, measured)


def model_capacity_profile(
    model: StepCostModel,
    limits: tuple[int, int],
    targets_seconds: tuple[float, float],
    mix: ReferenceMix,
    measured_work_seconds_per_second: float | None,
) -> CapacityProfile:
    """The profile of a step model under (max_num_seqs, max_num_batched_tokens) `limits`, priced at
    the primary class's (TTFT, ITL) `targets_seconds` and calibrated to a measured capacity when
    there is one: the one builder behind `capacity_profile` and the simulator's what-if runs without
    a ModelGroup."""
    max_num_seqs, max_num_batched_tokens = limits
    ttft_target_seconds, itl_target_seconds = targets_seconds
    profile = build_capacity_profile(
        model,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        itl_target_seconds=itl_target_seconds,
        ttft_target_seconds=ttft_target_seconds,
        reference_input_tokens=mix.input_tokens,
        reference_output_tokens=mix.output_tokens,
        input_tokens_p90=mix.input_tokens_p90,
        output_tokens_p90_over_mean=mix.output_tokens_p90_over_mean,
    )
    measured = measured_work_seconds_per_second
    return profile.calibrated(measured) if measured is not None else profile


def profile_key(
    spec: ModelGroupSpec,
    slo: SloPolicySpec,
    mix: ReferenceMix = ReferenceMix(),
    referenced: ReadConfig = None,
) -> str:
    """Everything `capacity_profile` reads, as one string: equal keys build equal profiles."""
    parts = {
        "model": spec.model.model_dump(mode="json"),
        "parallelism": spec.parallelism.model_dump(mode="json"),
        "profile": None if spec.profile is None else spec.profile.model_dump(mode="json"),
        "engine_args": list(spec.engine.args),
        "referenced": referenced if referenced is None or isinstance(referenced, str) else dict(referenced),
        "targets": [slo.classes[0].ttft_seconds, slo.classes[0].itl_seconds],
        "mix": dataclasses.asdict(mix),
    }
    return json.dumps(parts, sort_keys=True, default=str)


def compile_policy(
    model_group: ModelGroup,
    slo: SloPolicy,
    *,
    shadow: bool = False,
    profile: CapacityProfile | None = None,
    bounds: GroupBounds | None = None,
    mix: ReferenceMix = ReferenceMix(),
    envelope_work_seconds_per_second: float | None = None,
    referenced: ReadConfig = None,
) -> CompiledPolicy | str:
    """The SLOPolicy bound to the ModelGroup, or why it cannot be: the one way in for the operator,
    the simulator and the gateway, so a policy the operator rejects is rejected offline too.

    profile: a profile already built for `profile_key(model_group.spec, slo.spec, mix)`, to skip
    rebuilding it. `referenced`: the config.json of `profile.modelConfigRef`, for a caller that read
    it. What a benchmark measures overrides what the API says, explicitly: `bounds` (a
    what-if GPU budget), `mix` (the trace's request mix) and `envelope_work_seconds_per_second` (its
    measured capacity).
    """
    spec = model_group.spec
    problems = compile_problems(spec, slo.spec)
    if problems:
        return "; ".join(problems)
    built = (
        profile
        if profile is not None
        else capacity_profile(
            spec, slo.spec, mix, referenced, envelope_work_seconds_per_second=envelope_work_seconds_per_second
        )
    )
    if isinstance(built, str):
        return built
    if bounds is None:
        bounds = GroupBounds(spec.min_replicas, spec.max_replicas, spec.warm_replicas)
    return CompiledPolicy(
        policy=bounded_scaling_policy(bounds, slo.spec, shadow=shadow),
        profile=built,
        policy_name=slo.metadata.name or "",
        metrics_window_seconds=metrics_window_seconds(slo.spec),
    )


DEFAULT_RATE_WINDOW_SECONDS = 60.0
"""The window of token rates and the request mix unless the operator is told otherwise
(GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS) or a policy's drain target is longer
(`rate_window_seconds`); the simulator reads its rates over it too."""


def rate_window_seconds(
    metrics_window_seconds: float, rate_setting_seconds: float, drain_target_seconds: float = 0.0
) -> float:
    """The window of token rates and the request mix, in the operator and in the simulator alike:
    the setting, or the queue-work drain target T_d where that is longer, never longer than the
    goodput window (a burst must show in the arrival rate within an interval or two, not be averaged
    over the goodput window).

    Why T_d: the queue-work proposal, ceil((s·λ_w + Q_work/T_d) / C), lets waiting work take T_d to
    drain, so arrivals are read over the same horizon. A burst shorter than T_d is backlog, which
    the Q_work/T_d term already carries; read over a shorter window it is counted again as a rate,
    and a group asked for it is ready only after the burst has passed. On the 70B sample (T_d = ready
    time = 600 s) a 60 s reading rose and fell between 0.04 and 1.27 work-s/s on the Azure code
    trace and the scale-in stabilisation held the peak. Policies with a short T_d (the interactive
    sample: 10 s) keep the setting."""
    return max(1.0, min(metrics_window_seconds, max(rate_setting_seconds, drain_target_seconds)))


def drain_target_seconds(policy: ScalingPolicy) -> float:
    """The queue-work signal's drain target T_d (0 with the signal off): what `rate_window_seconds`
    reads arrivals over at least."""
    queue_work = policy.signals.queue_work
    return 0.0 if queue_work is None else float(queue_work.drain_target_seconds)


def metrics_window_seconds(slo: SloPolicySpec) -> float:
    """The window over which a decision reads attainment, goodput and the engine histograms: the
    SLOPolicy's goodput window, in the operator and in the simulator alike."""
    return float(slo.goodput.window_seconds)


def compile_problems(spec: ModelGroupSpec, slo: SloPolicySpec) -> Sequence[str]:
    """Why the pair cannot be compiled: the SLOPolicy's own cross-field rules (an SLOPolicy that is
    not Accepted is never acted on) and a ModelGroup without a profile."""
    problems = list(policy_problems(slo))
    if spec.profile is None:
        problems.append("spec.profile is required with a policy: the autoscaler prices work with it")
    return problems
