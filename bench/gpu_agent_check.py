"""The health agent on a machine with NVIDIA GPUs: its real NVML backend and its check on the device.

    .venv/bin/python bench/gpu_agent_check.py [--bytes 67108864] [--timeout-seconds 180]
        [--rendezvous-port 29510] [--rehearse]

Runs the agent itself (`goodput.agent.main.Agent`) as the one rank of a group that holds every
visible GPU: its NCCL check (one process per GPU on the device: vLLM's StatelessProcessGroup and
PyNcclCommunicator across several GPUs, as the vLLM image carries them; a single GPU has nothing to
all-reduce with, so its one rank allocates, fills, synchronises and checks its buffer with torch
alone), then two rounds of publishing with the real NVML backend. No API server is reached: the
pod the agent would patch is kept in this process and every patch is printed as the agent sent it;
the agent's Prometheus metrics are read back over HTTP from its metrics port. Then the NVML reading
of every GPU, NVML's read time, the GPU verdict against an allocation that does not match the node
(one GPU more, another product), and each GPU's memory in use before and after the check (the
check's processes must have given theirs back).

`--rehearse` runs the same with the emulated backend and the TCP collective over two emulated GPUs,
to try the script where there is no GPU. Exits 2 without a usable driver, 3 when the all-reduce
needs vLLM (several GPUs) and it is not installed. Asserts nothing else: it prints what it saw.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import socket
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client import start_http_server

from goodput.agent import gpu, report
from goodput.agent.emulated import EmulatedBackend
from goodput.agent.main import DEFAULT_RENDEZVOUS_PORT, Agent, AgentConfig
from goodput.agent.metrics import AgentMetrics
from goodput.agent.nccl import NCCL_CHECK_BYTES
from goodput.agent.nvml import NvmlBackend

EXIT_NO_GPU = 2
EXIT_NO_VLLM = 3
NVML_READS = 20
OTHER_PRODUCT = {"NVIDIA H100 80GB HBM3": "NVIDIA H200"}


class PrintedPod:
    """The agent's PodApi for a machine without an API server: one pod held here, each patch
    merged the way a strategic merge patch merges conditions (by type) and printed."""

    def __init__(self, name: str) -> None:
        self.pod: dict[str, Any] = {"metadata": {"name": name, "annotations": {}}, "status": {}}

    def get(self) -> Mapping[str, Any]:
        return self.pod

    def patch_status(self, body: Mapping[str, Any]) -> None:
        by_type = {c["type"]: c for c in self.pod["status"].get("conditions", [])}
        for condition in body["status"]["conditions"]:
            by_type[condition["type"]] = condition
            print(f"  patch status: {condition['type']}={condition['status']} {condition['reason']}: "
                  f"{condition['message']}")  # fmt: skip
        self.pod["status"]["conditions"] = list(by_type.values())

    def patch(self, body: Mapping[str, Any]) -> None:
        annotations = body["metadata"]["annotations"]
        self.pod["metadata"]["annotations"].update(annotations)
        print(f"  patch metadata: annotations {annotations}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def agent_metrics(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return [line for line in text.splitlines() if line.startswith("goodput_agent_")]


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


def print_nvml(backend: gpu.GpuBackend, reading: gpu.GpuReading) -> None:
    """The reading, what one read costs, and the verdict against an allocation the node does not have."""
    print(f"NVML: {len(reading.devices)} GPU(s)")
    print_reading(reading)
    seconds = []
    for _ in range(NVML_READS):
        started = time.perf_counter()
        backend.read()
        seconds.append(time.perf_counter() - started)
    print(f"one NVML read of every GPU: median {statistics.median(seconds) * 1e3:.2f} ms, "
          f"max {max(seconds) * 1e3:.2f} ms over {NVML_READS} reads")  # fmt: skip
    product = reading.devices[0].product if reading.devices else None
    other = OTHER_PRODUCT.get(product or "", "NVIDIA H100 80GB HBM3")
    wrong = gpu.Allocation(len(reading.devices) + 1, other)
    condition = report.gpu_condition(gpu.evaluate(reading, wrong))
    print(f"against an allocation of {wrong.gpus} x {wrong.product}: "
          f"GPUHealthy={condition.status} {condition.reason}: {condition.message}")  # fmt: skip


def run_agent(config: AgentConfig, backend: gpu.GpuBackend) -> None:
    """The agent as its container runs it, less the API server: the check, then two rounds."""
    metrics = AgentMetrics()
    start_http_server(config.metrics_port, addr="127.0.0.1", registry=metrics.registry)
    agent = Agent(config, backend, PrintedPod(config.pod_name), metrics, threading.Event())
    started = time.monotonic()
    agent.check_nccl()
    print(f"the agent's NCCL check took {time.monotonic() - started:.1f}s "
          f"(bound {config.nccl_timeout_seconds:g}s)")  # fmt: skip
    for round_number in (1, 2):
        print(f"round {round_number} (a second round patches only what changed):")
        agent.round()
    print(f"the agent's metrics on 127.0.0.1:{config.metrics_port}/metrics:")
    for line in agent_metrics(config.metrics_port):
        print(f"  {line}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=NCCL_CHECK_BYTES)
    parser.add_argument("--timeout-seconds", type=float, default=180.0)
    parser.add_argument(
        "--rendezvous-port",
        type=int,
        default=DEFAULT_RENDEZVOUS_PORT,
        help=f"the all-reduce's rendezvous port (default {DEFAULT_RENDEZVOUS_PORT}, the agent's own)",
    )
    parser.add_argument(
        "--rehearse", action="store_true", help="emulated GPUs and the TCP collective: no GPU needed"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    backend: gpu.GpuBackend = EmulatedBackend(2) if args.rehearse else NvmlBackend()
    reading = backend.read()
    if reading.nvml_error is not None:
        print(f"no usable NVIDIA GPU here: NVML unavailable: {reading.nvml_error}", file=sys.stderr)
        backend.close()
        return EXIT_NO_GPU
    gpus = len(reading.devices)
    if not args.rehearse and gpus > 1 and importlib.util.find_spec("vllm") is None:
        print(f"{gpus} GPUs: the all-reduce needs the vllm package, not installed here", file=sys.stderr)
        print_nvml(backend, reading)
        backend.close()
        return EXIT_NO_VLLM
    config = AgentConfig(
        namespace="gpu-check", pod_name="rank-0", rank=0, pods=1, gpus_per_pod=gpus,
        leader_address="127.0.0.1", model_revision="main", rendezvous_port=args.rendezvous_port,
        backend="emulated" if args.rehearse else "nvml", collective="tcp" if args.rehearse else "vllm",
        gpu_product=reading.devices[0].product, nccl_timeout_seconds=args.timeout_seconds,
        nccl_bytes=args.bytes, metrics_port=free_port(),
    )  # fmt: skip
    before = [] if args.rehearse else memory_used_mib()
    try:
        run_agent(config, backend)
        after = [] if args.rehearse else memory_used_mib()
        print_nvml(backend, reading)
    finally:
        backend.close()
    print("GPU memory in use (MiB) before / after the check: " + (", ".join(
        f"GPU {i}: {b:.0f} / {a:.0f}" for i, (b, a) in enumerate(zip(before, after, strict=True))
    ) or "not read (emulated)"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
