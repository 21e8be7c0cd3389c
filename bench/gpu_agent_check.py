"""The health agent's real backends on a machine with NVIDIA GPUs: NVML and an NCCL all-reduce.

    .venv/bin/python bench/gpu_agent_check.py [--gpus N] [--bytes 67108864] [--timeout-seconds 180]
        [--rendezvous-port 29510]

Needs an NVIDIA driver (for NVML) and, for the all-reduce, the `vllm` package with a CUDA build of
torch in the same environment (the agent uses vLLM's StatelessProcessGroup and PyNcclCommunicator,
as the vLLM image carries them). Prints what the agent would publish: the NVML reading of every
visible GPU, the GPUHealthy verdict, the all-reduce's latency and bus bandwidth over the GPUs of this
node with the NCCLHealthy verdict (expected figure: NVLink within one node), and each GPU's memory
in use before and after the check (the check's processes must have given theirs back). Without a
driver it says so and exits 2; without vLLM it reports NVML and exits 3. Asserts nothing else.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

from goodput.agent import gpu, nccl, report
from goodput.agent.main import DEFAULT_RENDEZVOUS_PORT
from goodput.agent.nvml import NvmlBackend

EXIT_NO_GPU = 2
EXIT_NO_VLLM = 3


def memory_used_mib() -> list[float]:
    import pynvml

    return [
        pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used / 2**20
        for i in range(pynvml.nvmlDeviceGetCount())
    ]


def print_reading(reading: gpu.GpuReading) -> None:
    for device in reading.devices:
        links = list(device.nvlinks)
        down = [link.link for link in links if not link.active]
        errors = sum(link.replay_errors + link.recovery_errors + link.crc_flit_errors for link in links)
        print(
            f"  GPU {device.index}: {device.product or '?'}; critical XIDs {list(device.xids)}; "
            f"uncorrectable ECC {device.ecc_uncorrectable}; remap pending {device.remap_pending}, "
            f"failed {device.remap_failed}; NVLinks {len(links)} ({len(down)} down {down}, "
            f"{errors} errors); throttle {list(device.throttle_reasons) or 'none'}"
            + (f"; ERROR {device.error}" if device.error else "")
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs in the all-reduce (default: all visible)"
    )
    parser.add_argument("--bytes", type=int, default=nccl.NCCL_CHECK_BYTES)
    parser.add_argument("--timeout-seconds", type=float, default=180.0)
    parser.add_argument(
        "--rendezvous-port",
        type=int,
        default=DEFAULT_RENDEZVOUS_PORT,
        help=f"the all-reduce's rendezvous port (default {DEFAULT_RENDEZVOUS_PORT}, the agent's own)",
    )
    args = parser.parse_args()

    backend = NvmlBackend()
    reading = backend.read()
    if reading.nvml_error is not None:
        print(f"no usable NVIDIA GPU here: NVML unavailable: {reading.nvml_error}", file=sys.stderr)
        backend.close()
        return EXIT_NO_GPU
    gpus = args.gpus or len(reading.devices)
    verdict = gpu.evaluate(reading, gpu.Allocation(len(reading.devices)))
    condition = report.gpu_condition(verdict)
    print(f"NVML: {len(reading.devices)} GPU(s)")
    print_reading(reading)
    print(f"GPUHealthy={condition.status} {condition.reason}: {condition.message}")

    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        print("vLLM (with torch) is not installed here: the all-reduce was not run", file=sys.stderr)
        backend.close()
        return EXIT_NO_VLLM
    before = memory_used_mib()
    specs = nccl.local_ranks(
        kind="vllm", leader_host="127.0.0.1", port=args.rendezvous_port, pod_rank=0, pods=1,
        gpus_per_pod=gpus, rendezvous_timeout_seconds=args.timeout_seconds,
    )  # fmt: skip
    started = time.monotonic()
    outcome = nccl.run_check(specs, args.timeout_seconds, size_bytes=args.bytes)
    elapsed = time.monotonic() - started
    after = memory_used_mib()
    for measurement in outcome.measurements:
        print(
            f"  rank {measurement.rank}: latency {measurement.latency_seconds * 1e6:.1f}us, "
            f"{measurement.size_bytes / 2**20:.0f} MiB in {measurement.bandwidth_seconds * 1e3:.3f}ms, "
            f"busbw {measurement.busbw_gb_per_s:.1f} GB/s"
        )
    for problem in (*outcome.errors, *outcome.rendezvous_failures):
        print(f"  {problem}")
    nccl_verdict = nccl.evaluate(outcome, nccl.expectation_for(1))
    nccl_condition = report.nccl_condition(nccl_verdict)
    print(f"NCCL check took {elapsed:.1f}s (bound {args.timeout_seconds:g}s)")
    print(f"NCCLHealthy={nccl_condition.status} {nccl_condition.reason}: {nccl_condition.message}")
    print("GPU memory in use (MiB) before / after the check: " + ", ".join(
        f"GPU {i}: {b:.0f} / {a:.0f}" for i, (b, a) in enumerate(zip(before, after, strict=True))
    ))  # fmt: skip
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
