"""How long one scaling decision takes, and the decisions of 1,000 ModelGroups.

Run: .venv/bin/python bench/bench_decision.py [--repeats 7] [--groups-per-model 4] [--queued 200]

Each ModelGroup has ready groups reporting every metric a decision reads, including TTFT, ITL, TPOT
and queue-time histograms with vLLM's default buckets (so the goodput signal's checks run). Prints
medians (and the fastest and slowest repeat) measured with time.perf_counter; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import (
    DecisionState,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
    RequestQueue,
    ScalingPolicy,
)
from goodput.estimators.attainment import Histogram
from goodput.estimators.capacity import CapacityProfile, build_capacity_profile
from goodput.estimators.queueing import QueuedRequest
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel, default_batch_limits

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def build_profile() -> CapacityProfile:
    seqs, tokens = default_batch_limits(H100_80G)
    return build_capacity_profile(
        StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        itl_target_seconds=0.08,
        ttft_target_seconds=2.0,
    )


def group_metrics(rng: random.Random) -> GroupMetrics:
    requests_per_second = rng.uniform(2.0, 20.0)
    mean_input, mean_output = rng.uniform(500, 3000), rng.uniform(100, 600)
    observations = int(requests_per_second * 60)
    return GroupMetrics(
        age_seconds=rng.uniform(1, 20),
        waiting_requests=rng.choice([0.0, 0.0, rng.uniform(1, 50)]),
        running_requests=requests_per_second * mean_output * 0.05,
        kv_usage_fraction=rng.uniform(0.1, 0.9),
        prompt_tokens_per_second=requests_per_second * mean_input,
        generation_tokens_per_second=requests_per_second * mean_output,
        prompt_tokens_sum=mean_input * observations,
        prompt_tokens_count=float(observations),
        generation_tokens_sum=mean_output * observations,
        generation_tokens_count=float(observations),
        prefix_hits=rng.uniform(0, 0.5),
        prefix_queries=1.0,
        ttft=Histogram.from_observations(TTFT_BUCKETS, (rng.expovariate(2.0) for _ in range(observations))),
        itl=Histogram.from_observations(ITL_BUCKETS, (rng.expovariate(25.0) for _ in range(observations))),
        queue_time=Histogram.from_observations(
            LATENCY_BUCKETS, (rng.expovariate(4.0) for _ in range(observations))
        ),
        tpot=Histogram.from_observations(ITL_BUCKETS, (rng.expovariate(30.0) for _ in range(observations))),
        finished_requests=observations * 0.98,
        aborted_requests=observations * 0.02,
    )


def snapshot(
    profile: CapacityProfile, rng: random.Random, groups_per_model: int, queued: int, index: int
) -> ModelGroupSnapshot:
    groups = tuple(
        GroupObservation(f"g{number}", "Ready", 0.0, metrics=group_metrics(rng))
        for number in range(groups_per_model)
    )
    queue = None
    if queued:
        requests = tuple(
            QueuedRequest(
                arrival_time=1000.0 - rng.uniform(0, 2),
                input_tokens=rng.randint(100, 8000),
                expected_output_tokens=rng.randint(10, 1000),
                running=rng.random() < 0.7,
                generated_tokens=rng.randint(0, 10),
            )
            for _ in range(queued)
        )
        queue = RequestQueue(requests, age_seconds=1.0)
    return ModelGroupSnapshot(
        spec_replicas=groups_per_model, groups=groups, profile=profile, name=f"ns/model-{index}", queue=queue
    )


def timed(repeats: int, action: Callable[[], object]) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return seconds


def report(label: str, seconds: list[float], scale: float, unit: str) -> None:
    median, fastest, slowest = (
        value * scale for value in (statistics.median(seconds), min(seconds), max(seconds))
    )
    print(f"{label:<52} median {median:9.1f} {unit}  (min {fastest:.1f}, max {slowest:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--groups-per-model", type=int, default=4)
    parser.add_argument("--queued", type=int, default=200, help="requests in the exact-queue variant")
    args = parser.parse_args()
    rng = random.Random(7)

    build_seconds = timed(args.repeats, build_profile)
    profile = build_profile()
    report("build one capacity profile (once per model/SLO)", build_seconds, 1e3, "ms")

    policy = ScalingPolicy(min_groups=1, max_groups=64, revision="bench")
    state = DecisionState.initial()
    single = snapshot(profile, rng, args.groups_per_model, 0, 0)
    loops = 1000

    def one_thousand_times_one() -> None:
        for tick in range(loops):
            decide(single, policy, state, 1000.0 + tick)

    per_decision = [total / loops for total in timed(args.repeats, one_thousand_times_one)]
    report(f"one decision, {args.groups_per_model} groups, engine metrics", per_decision, 1e6, "us")

    queued = snapshot(profile, rng, args.groups_per_model, args.queued, 0)

    def one_thousand_queued() -> None:
        for tick in range(loops):
            decide(queued, policy, state, 1000.0 + tick)

    per_queued = [total / loops for total in timed(args.repeats, one_thousand_queued)]
    report(f"one decision, exact queue of {args.queued} requests", per_queued, 1e6, "us")

    fleet = [snapshot(profile, rng, args.groups_per_model, 0, index) for index in range(1000)]
    states = [DecisionState.initial()] * len(fleet)

    def fleet_tick() -> None:
        for index, model_group in enumerate(fleet):
            states[index] = decide(model_group, policy, states[index], 1000.0).next_state

    report("1,000 ModelGroups' decisions (one tick)", timed(args.repeats, fleet_tick), 1e3, "ms")


if __name__ == "__main__":
    main()
