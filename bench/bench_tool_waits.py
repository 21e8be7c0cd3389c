"""Where a waiting session's KV is kept, offloaded or recomputed, on modelled hardware.

Run: .venv/bin/python bench/bench_tool_waits.py [--cpu-gib 64] [--prompt-tokens-per-second 2000]

For Llama-3.1-8B on one H100 and Llama-3.1-70B on four (tensor-parallel), priced by the service-time
model (`StepCostModel.from_hardware`, `WorkPricing`), prints for a session of each context length
at each KV pressure: its KV in GiB, its prefix's recompute work (seconds), the offload round trip
at OFFLOAD_TRANSFER_BYTES_PER_SECOND, and the two thresholds `wait_thresholds` derives: keep while
the predicted wait is below the first, offload up to the second (with a CPU tier of `--cpu-gib`),
recompute beyond, where the tier turns over at `--prompt-tokens-per-second` of prompts written to
it; then the single threshold without a CPU tier. Asserts nothing.
"""

from __future__ import annotations

import argparse

from goodput.controllers.requests.tool_waits import (
    OFFLOAD_TRANSFER_BYTES_PER_SECOND,
    HeldKv,
    ToolWaitPolicy,
    turnover_seconds,
    wait_thresholds,
)
from goodput.estimators.accelerators import H100_80G
from goodput.estimators.service_time import LLAMA_3_1_8B, LLAMA_3_1_70B, StepCostModel
from goodput.estimators.work import WorkPricing

CONTEXTS = (2_000, 8_000, 32_000)
PRESSURES = (0.5, 0.9, 1.0)
HEADER = "  context  pressure  KV GiB  recompute s  round trip s  keep < s  offload < s  no tier: keep <"
SETUPS = (("llama-3.1-8b, 1x H100", LLAMA_3_1_8B, 1), ("llama-3.1-70b, 4x H100", LLAMA_3_1_70B, 4))


def seconds(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-gib", type=float, default=64.0, help="the CPU tier (kvOffload.cpuSizeGib)")
    parser.add_argument("--prompt-tokens-per-second", type=float, default=2000.0, help="written to the tier")
    args = parser.parse_args()
    offload = ToolWaitPolicy(offload_cpu_bytes=int(args.cpu_gib * 2**30))
    assert offload.offload_cpu_bytes is not None
    plain = ToolWaitPolicy()
    for title, model, tensor_parallel in SETUPS:
        step = StepCostModel.from_hardware(model, H100_80G, tensor_parallel)
        pricing = WorkPricing.from_step_model(step)
        bytes_per_token = step.kv_bytes_per_token
        turnover = turnover_seconds(offload.offload_cpu_bytes, args.prompt_tokens_per_second, bytes_per_token)
        print(
            f"{title}: {step.kv_capacity_tokens} KV tokens, {bytes_per_token} bytes a token, "
            f"a {args.cpu_gib:g} GiB tier turning over in {turnover:.0f} s"
        )
        print(HEADER)
        for context in CONTEXTS:
            for pressure in PRESSURES:
                held = HeldKv(
                    kv_tokens=context,
                    kv_bytes_per_token=step.kv_bytes_per_token,
                    recompute_seconds=pricing.prefill_work_seconds(context),
                    group_kv_capacity_tokens=step.kv_capacity_tokens,
                    kv_pressure=pressure,
                    offload_turnover_seconds=turnover,
                )
                keep, recompute = wait_thresholds(offload, held)
                alone, _ = wait_thresholds(plain, held)
                round_trip = 2 * held.kv_bytes / OFFLOAD_TRANSFER_BYTES_PER_SECOND
                print(
                    f"  {context:7d}  {pressure:8.1f}  {held.kv_bytes / 2**30:6.2f}  "
                    f"{held.recompute_seconds:11.3f}  {round_trip:12.3f}  {seconds(keep):>8}  "
                    f"{seconds(recompute):>11}  {seconds(alone):>17}"
                )


if __name__ == "__main__":
    main()
