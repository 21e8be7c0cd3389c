"""`goodput emulate`: serve vLLM 0.33's endpoints and metrics at the cluster's pod IPs (or at given
addresses), timed by the engine model.

With a cluster (the default): watch goodput's vLLM pods through the kubeconfig and serve every
leader at its pod IP:port, inside the network namespace named by `--netns` (or $GOODPUT_NETNS, as
`goodput cluster env` exports it). Run it in the host namespace, where the API server's loopback
address is reachable; only the listening sockets are created inside the pod namespace. With
`--agent-processes` the real health agent (`goodput.agent`, emulated GPUs, TCP collective) runs
beside every running pod and publishes the pods' health itself (`emulator_agents`).

Standalone (`--serve HOST:PORT`, repeatable): one emulated vLLM per address, no cluster needed
(port 0 picks a free port). Each listening address is printed as `listening NAME HOST:PORT`.

SIGTERM or SIGINT stops it the way the kubelet stops vLLM: each server drains for its
`--shutdown-timeout`, aborts the rest, then the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from goodput.testbed.emulator import (
    DEFAULT_LOAD_SECONDS,
    DEFAULT_NCCL_CHECK_SECONDS,
    EmulatorSettings,
    FleetEmulator,
    ProfileDefaults,
    VllmArgs,
    gpu_by_name,
    serving_profile,
)
from goodput.testbed.emulator_agents import (
    DEFAULT_NCCL_TIMEOUT_SECONDS,
    AgentProcesses,
    AgentProcessSettings,
)
from goodput.testbed.emulator_engine import DEFAULT_MAX_MODEL_LEN, DEFAULT_STREAM_INTERVAL_SECONDS
from goodput.testbed.emulator_kube import KubeClient
from goodput.testbed.emulator_netns import ListenerFactory, NetnsUnavailableError
from goodput.testbed.emulator_server import ServerIdentity, VllmServer

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("cluster mode (default)")
    cluster.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    cluster.add_argument("--context", default=None, help="kubeconfig context (default: current)")
    cluster.add_argument("--namespace", default=None, help="watch one namespace only (default: all)")
    cluster.add_argument(
        "--netns",
        default=os.environ.get("GOODPUT_NETNS"),
        help="network namespace (name under /run/netns, or a path) whose pod IPs to listen on "
        "(default: $GOODPUT_NETNS; none: this process's own namespace)",
    )
    cluster.add_argument(
        "--no-health-agent",
        action="store_true",
        help="do not publish goodput.dev/NCCLHealthy and goodput.dev/model-revision",
    )
    cluster.add_argument(
        "--nccl-check-seconds",
        type=float,
        default=DEFAULT_NCCL_CHECK_SECONDS,
        help="delay after the load before NCCLHealthy is reported (annotation "
        "sim.goodput.dev/nccl-check-seconds overrides it per pod)",
    )
    cluster.add_argument(
        "--agent-processes",
        action="store_true",
        help="run the real health agent beside every running pod (emulated GPUs, TCP collective) "
        "instead of publishing its verdicts",
    )
    cluster.add_argument(
        "--agent-nccl-timeout-seconds",
        type=float,
        default=DEFAULT_NCCL_TIMEOUT_SECONDS,
        help="with --agent-processes: the agents' bound on their all-reduce",
    )
    cluster.add_argument(
        "--agent-dir",
        type=Path,
        default=None,
        help="with --agent-processes: the agents' files and logs (default: a temporary folder)",
    )
    standalone = parser.add_argument_group("standalone mode")
    standalone.add_argument(
        "--serve",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="serve one emulated vLLM here instead of watching a cluster (repeatable)",
    )
    standalone.add_argument("--model", default=DEFAULT_MODEL)
    standalone.add_argument("--served-model-name", default=None)
    standalone.add_argument("--tensor-parallel-size", type=int, default=1)
    standalone.add_argument("--pipeline-parallel-size", type=int, default=1)
    standalone.add_argument(
        "--shutdown-timeout",
        type=float,
        default=0.0,
        help="seconds to drain in-flight requests after SIGTERM (vLLM's default 0 aborts)",
    )
    standalone.add_argument("--max-num-seqs", type=int, default=None)
    standalone.add_argument("--max-num-batched-tokens", type=int, default=None)
    standalone.add_argument(
        "--max-num-queued-reqs",
        type=int,
        default=None,
        help="refuse requests above this many in flight with HTTP 503",
    )
    engine = parser.add_argument_group("engine model")
    engine.add_argument(
        "--gpu", default="h100-80g", help="GPU when the ModelGroup names none (default h100-80g)"
    )
    engine.add_argument(
        "--load-seconds",
        type=float,
        default=DEFAULT_LOAD_SECONDS,
        help="simulated load before the port accepts connections (annotation "
        "sim.goodput.dev/load-seconds overrides it per pod)",
    )
    engine.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    engine.add_argument(
        "--stream-interval-seconds",
        type=float,
        default=DEFAULT_STREAM_INTERVAL_SECONDS,
        help="how often decoded tokens are flushed to streaming clients",
    )
    engine.add_argument(
        "--step-noise-sigma",
        type=float,
        default=0.0,
        help="σ of a mean-one lognormal factor on step durations (0: deterministic)",
    )
    engine.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=None,
        help="stop by itself after this long (default: run until SIGTERM/SIGINT)",
    )
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        defaults = ProfileDefaults(
            gpu=gpu_by_name(args.gpu),
            stream_interval_seconds=args.stream_interval_seconds,
            max_model_len=args.max_model_len,
            step_noise_sigma=args.step_noise_sigma,
            seed=args.seed,
        )
        listeners = ListenerFactory(args.netns)
    except (ValueError, NetnsUnavailableError) as error:
        print(f"goodput emulate: {error}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args, defaults, listeners))
    finally:
        listeners.close()


async def _main(args: argparse.Namespace, defaults: ProfileDefaults, listeners: ListenerFactory) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if args.run_seconds is not None:
        loop.call_later(args.run_seconds, stop.set)
    if args.serve:
        return await _standalone(args, defaults, listeners, stop)
    if not args.kubeconfig:
        print(
            "goodput emulate: no kubeconfig (set --kubeconfig or $KUBECONFIG), and no --serve address",
            file=sys.stderr,
        )
        return 2
    settings = EmulatorSettings(
        namespace=args.namespace,
        health_agent=not args.no_health_agent,
        default_load_seconds=args.load_seconds,
        default_nccl_check_seconds=args.nccl_check_seconds,
        profile=defaults,
    )
    with contextlib.ExitStack() as stack:
        agents = None
        if args.agent_processes:
            root = args.agent_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agents-")))
            timeout = args.agent_nccl_timeout_seconds
            agents = AgentProcesses(
                AgentProcessSettings(kubeconfig=args.kubeconfig, root=root, nccl_timeout_seconds=timeout)
            )
        async with KubeClient.from_kubeconfig(args.kubeconfig, args.context) as kube:
            emulator = FleetEmulator(kube, listeners, settings, on_listen=_announce, agents=agents)
            await emulator.run(stop)
    return 0


async def _standalone(
    args: argparse.Namespace, defaults: ProfileDefaults, listeners: ListenerFactory, stop: asyncio.Event
) -> int:
    vllm = VllmArgs(
        model=args.model,
        served_model_name=args.served_model_name,
        tensor_parallel=args.tensor_parallel_size,
        pipeline_parallel=args.pipeline_parallel_size,
        shutdown_timeout_seconds=args.shutdown_timeout,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_queued_reqs=args.max_num_queued_reqs,
    )
    profile = serving_profile(None, vllm, defaults)
    identity = ServerIdentity(vllm.model, vllm.served_name, vllm.revision)
    addresses = [_address(text) for text in args.serve]
    servers = [VllmServer(profile, identity, name=f"{host}:{port}") for host, port in addresses]
    # The port refuses connections while the model "loads", as vLLM's does.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.load_seconds)
    if not stop.is_set():
        for server, (host, port) in zip(servers, addresses, strict=True):
            await server.listen(await listeners.open(host, port))
            bound_host, bound_port = server.address or (host, port)
            _announce(server.name, bound_host, bound_port)
        await stop.wait()
    await asyncio.gather(*(server.terminate(vllm.shutdown_timeout_seconds) for server in servers))
    return 0


def _announce(name: str, host: str, port: int) -> None:
    print(f"listening {name} {host}:{port}", flush=True)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"goodput emulate: --serve wants HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="goodput emulate", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
