"""Which share of a ModelGroup's demand no number of groups can serve within its SLO (design note
§8, §10; DESIGN.md §1 Feasibility), and what to tell the people who own it.

A request whose zero-load TTFT floor already exceeds its class's target misses on any number of
groups of this hardware and parallelism: more groups do not help it. `assess` turns the engines'
prompt-length histogram into each class's feasible threshold and the share of requests (and prompt
tokens) past it; the decision then counts only the feasible rest, so infeasible demand never causes
a scale-out and never holds a scale-in. `attainability` is the SLOAttainable verdict: it names the
prompt length beyond which a class's target is unreachable and what would fix it.

One rule for the operator and the simulator: both build the snapshot's `feasibility` here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from goodput.api import vllm_names
from goodput.api.reasons import Attainability
from goodput.controllers.autoscale.model import (
    ClassFeasibility,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
    ScalingPolicy,
    SloTargets,
)
from goodput.estimators.attainment import Histogram, histogram_quantile, merge_histograms
from goodput.estimators.capacity import CapacityProfile
from goodput.estimators.feasibility import (
    FloorModel,
    infeasible_share,
    infeasible_token_share,
    longest_feasible_prompt_tokens,
    minimum_tensor_parallel_hint,
    ttft_floor_seconds,
)

# Above this share of a class's prompts past its threshold, SLOAttainable turns False: a trace's
# stray giant prompt should not raise the condition, a steady share should.
TOLERATED_INFEASIBLE_SHARE = 0.01
# A tensor-parallel degree beyond this is no fix a message should offer: the fixed per-step costs
# that dominate such floors do not shrink with more ranks.
MAX_HINTED_TENSOR_PARALLEL = 64
# The most an expected prefix-cache hit may lower a floor (FloorModel takes fractions below 1).
_MAX_CACHED_FRACTION = 0.95


def floor_model(
    profile: CapacityProfile, *, expected_cached_fraction: float = 0.0, route_seconds: float = 0.0
) -> FloorModel:
    """One group's floors as the profile prices its steps, chunked at its `max_num_batched_tokens`."""
    return FloorModel(
        step_model=profile.step_model,
        chunk_tokens=max(1, profile.max_num_batched_tokens),
        route_seconds=max(0.0, route_seconds),
        expected_cached_fraction=min(_MAX_CACHED_FRACTION, max(0.0, expected_cached_fraction)),
    )


def class_feasibility(
    model: FloorModel, target: SloTargets, prompt_tokens: Histogram | None
) -> ClassFeasibility:
    """One class's threshold and infeasible shares; an ITL target below one decode step makes the
    whole class unattainable (threshold 0), as does a TTFT target below a one-token prompt's floor."""
    if model.step_model.decode_step_seconds(1, 1.0) > target.itl_seconds:
        return ClassFeasibility(target.name, 0, 1.0, 1.0, unmet_field="itlSeconds")
    threshold = longest_feasible_prompt_tokens(model, target.ttft_seconds)
    if threshold == 0:
        return ClassFeasibility(target.name, 0, 1.0, 1.0, unmet_field="ttftSeconds")
    # Prompts in the histogram bucket that holds the threshold count as infeasible: where in the
    # bucket they lie is unknown, and counting them feasible would scale for them.
    return ClassFeasibility(
        target.name,
        threshold,
        infeasible_share(prompt_tokens, threshold, conservative=True),
        infeasible_token_share(prompt_tokens, threshold, conservative=True),
    )


def assess(
    profile: CapacityProfile,
    classes: Sequence[SloTargets],
    prompt_tokens: Histogram | None,
    *,
    expected_cached_fraction: float = 0.0,
    route_seconds: float = 0.0,
) -> tuple[ClassFeasibility, ...]:
    """Every class's feasibility against the pooled prompt-length histogram of the window.

    vLLM's histogram carries no class, so every class is judged on the same prompts, each against
    its own TTFT target. No histogram gives unknown shares (never invented infeasibility).
    """
    model = floor_model(
        profile, expected_cached_fraction=expected_cached_fraction, route_seconds=route_seconds
    )
    return tuple(class_feasibility(model, target, prompt_tokens) for target in classes)


@dataclass(frozen=True, slots=True)
class AttainabilityVerdict:
    """The SLOAttainable condition as a value: status "True", "False" or "Unknown", reason, message."""

    status: str
    reason: Attainability
    message: str


def attainability(
    entries: Sequence[ClassFeasibility],
    classes: Sequence[SloTargets],
    model: FloorModel,
    *,
    tensor_parallel: int,
    prompt_tokens: Histogram | None = None,
) -> AttainabilityVerdict:
    """False when a class cannot be met at all, or more than `TOLERATED_INFEASIBLE_SHARE` of its
    prompts are past its threshold; the message says where the target becomes unreachable and what
    would fix it. Unknown while no prompt lengths were observed."""
    targets = {target.name: target for target in classes}
    problems: list[str] = []
    reason = Attainability.DEMAND_FEASIBLE
    for entry in entries:
        target = targets.get(entry.class_name)
        if target is None:
            continue
        if entry.unmet_field is not None:
            problems.append(_unattainable_class(entry, target, model, tensor_parallel))
            reason = Attainability.CLASS_UNATTAINABLE
        elif (entry.infeasible_request_share or 0.0) > TOLERATED_INFEASIBLE_SHARE:
            problems.append(_infeasible_share(entry, target, model, tensor_parallel, prompt_tokens))
            if reason is Attainability.DEMAND_FEASIBLE:
                reason = Attainability.INFEASIBLE_DEMAND
    if problems:
        return AttainabilityVerdict("False", reason, "; ".join(problems))
    if any(entry.infeasible_request_share is None for entry in entries) or not entries:
        return AttainabilityVerdict(
            "Unknown",
            Attainability.FEASIBILITY_UNKNOWN,
            f"no prompt lengths observed yet ({vllm_names.REQUEST_PROMPT_TOKENS}): "
            "nothing is counted infeasible",
        )
    thresholds = ", ".join(
        f"{entry.class_name} up to {entry.longest_feasible_prompt_tokens} prompt tokens" for entry in entries
    )
    return AttainabilityVerdict(
        "True",
        Attainability.DEMAND_FEASIBLE,
        f"at most {TOLERATED_INFEASIBLE_SHARE:.0%} of prompts past each class's feasible threshold "
        f"({thresholds})",
    )


def _unattainable_class(
    entry: ClassFeasibility, target: SloTargets, model: FloorModel, tensor_parallel: int
) -> str:
    if entry.unmet_field == "itlSeconds":
        floor = model.step_model.decode_step_seconds(1, 1.0)
        value = target.itl_seconds
    else:
        floor = ttft_floor_seconds(model, 1)
        value = target.ttft_seconds
    return (
        f"class {entry.class_name}: no request can meet {entry.unmet_field}={value:g} on groups of this "
        f"shape (even an idle group takes {floor:.3g}s); fix: "
        f"{_parallelism_fix(tensor_parallel, floor, value)}a longer {entry.unmet_field}, or another class"
    )


def _infeasible_share(
    entry: ClassFeasibility,
    target: SloTargets,
    model: FloorModel,
    tensor_parallel: int,
    prompt_tokens: Histogram | None,
) -> str:
    threshold = entry.longest_feasible_prompt_tokens
    # The tail the fix must cover: the class percentile of observed prompts, or twice the threshold.
    tail = histogram_quantile(prompt_tokens, target.percentile)
    tail_tokens = max(threshold + 1, round(tail) if tail is not None else 2 * threshold)
    tail_floor = ttft_floor_seconds(model, tail_tokens)
    return (
        f"class {entry.class_name}: {entry.infeasible_request_share or 0.0:.1%} of prompts are longer than "
        f"{threshold} tokens, past which an idle group's prefill alone exceeds "
        f"ttftSeconds={target.ttft_seconds:g} (a {tail_tokens}-token prompt takes {tail_floor:.3g}s); "
        f"these requests cannot meet the SLO on any number of groups and are not scaled for; fix: "
        f"{_parallelism_fix(tensor_parallel, tail_floor, target.ttft_seconds)}a longer ttftSeconds, or a "
        f"class with a longer target for prompts over {threshold} tokens"
    )


def _parallelism_fix(tensor_parallel: int, floor_seconds: float, target_seconds: float) -> str:
    """The tensor-parallel part of a fix, when a degree within reason would do."""
    hint = minimum_tensor_parallel_hint(tensor_parallel, floor_seconds, target_seconds)
    if hint > MAX_HINTED_TENSOR_PARALLEL:
        return ""
    return f"tensor parallelism of about {hint} (now {tensor_parallel}), "


@dataclass(frozen=True, slots=True)
class PromptEvidence:
    """What the fresh ready groups' engines say about prompts over the window: the pooled
    prompt-length histogram (None: not exported or nothing finished) and the share of prompt tokens
    the prefix cache served (the expected cached fraction of a prompt)."""

    prompt_tokens: Histogram | None
    cached_fraction: float


def prompt_evidence(groups: Sequence[GroupObservation], max_age_seconds: float) -> PromptEvidence:
    """Pool the prompt histograms and prefix hits of the ready groups with fresh metrics (the same
    groups the decision reads); histograms with bounds unlike the first are left out.

    The window's prompt lengths first; when no group finished a prompt within it, the longer lookback
    (`GroupMetrics.prompt_tokens_lookback`): a window of long prefills that finishes nothing must not
    turn a known infeasible share into "unknown" and so into demand to scale for.
    """
    fresh = [
        group.metrics
        for group in groups
        if group.state == "Ready"
        and group.metrics is not None
        and group.metrics.age_seconds <= max_age_seconds
    ]
    prompt_rate = hit_rate = 0.0
    for metrics in fresh:
        if math.isfinite(metrics.prompt_tokens_per_second) and math.isfinite(metrics.prefix_hit_fraction):
            prompt_rate += metrics.prompt_tokens_per_second
            hit_rate += metrics.prompt_tokens_per_second * metrics.prefix_hit_fraction
    pooled = _pooled([metrics.prompt_tokens for metrics in fresh]) or _pooled(
        [metrics.prompt_tokens_lookback for metrics in fresh]
    )
    return PromptEvidence(
        prompt_tokens=with_unfinished_prompts(pooled, fresh),
        cached_fraction=hit_rate / prompt_rate if prompt_rate > 0 else 0.0,
    )


def with_unfinished_prompts(pooled: Histogram | None, fresh: Sequence[GroupMetrics]) -> Histogram | None:
    """The finished prompts' histogram with the prompts begun and not finished added in.

    vLLM counts a prompt's tokens at its first token but observes its length at its finish, so while
    a long prompt decodes, its tokens are demand the histogram cannot explain: judged by the short
    prompts finished so far, they would be feasible demand to scale for. Each group's unexplained
    tokens go in as `unfinished_prompts` prompts of equal length, at least one (the count nets
    prompts that finished in the window after beginning before it, and a short one that finished
    must not split a long one that began). Without a histogram the bounds are unknown and nothing is
    added: feasibility stays unknown, as before any prompt finished.
    """
    if pooled is None:
        return None
    unfinished: list[tuple[float, float]] = []
    for metrics in fresh:
        tokens = metrics.unfinished_prompt_tokens
        if tokens >= 1.0:
            prompts = max(1, round(metrics.unfinished_prompts))
            unfinished.append((tokens / prompts, float(prompts)))
    if not unfinished:
        return pooled
    return merge_histograms([pooled, Histogram.from_weighted_observations(pooled.upper_bounds, unfinished)])


def _pooled(histograms: Sequence[Histogram | None]) -> Histogram | None:
    """The merged histogram of those sharing the first one's bounds; None when it counts nothing."""
    present = [histogram for histogram in histograms if histogram is not None]
    pooled = (
        merge_histograms([h for h in present if h.upper_bounds == present[0].upper_bounds])
        if present
        else None
    )
    return pooled if pooled is not None and pooled.total > 0 else None


def snapshot_feasibility(
    profile: CapacityProfile, policy: ScalingPolicy, evidence: PromptEvidence
) -> tuple[ClassFeasibility, ...]:
    """The snapshot's `feasibility` for a policy, from the engines' prompt evidence."""
    slack = policy.signals.slack
    return assess(
        profile,
        policy.classes,
        evidence.prompt_tokens,
        expected_cached_fraction=evidence.cached_fraction,
        route_seconds=slack.route_seconds if slack is not None else 0.0,
    )


def snapshot_attainability(
    snapshot: ModelGroupSnapshot, policy: ScalingPolicy, *, tensor_parallel: int
) -> AttainabilityVerdict:
    """The SLOAttainable verdict for a snapshot whose `feasibility` was built by
    `snapshot_feasibility` from the same groups."""
    evidence = prompt_evidence(snapshot.groups, policy.staleness.max_age_seconds)
    slack = policy.signals.slack
    model = floor_model(
        snapshot.profile,
        expected_cached_fraction=evidence.cached_fraction,
        route_seconds=slack.route_seconds if slack is not None else 0.0,
    )
    return attainability(
        snapshot.feasibility,
        policy.classes,
        model,
        tensor_parallel=tensor_parallel,
        prompt_tokens=evidence.prompt_tokens,
    )
