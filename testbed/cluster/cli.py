"""`goodput cluster up | down | status | env`: a local control plane with fake GPU nodes.

goodput cluster up [--name dev] [--topology zones=2,domains=2,nodes=2,gpus=8] [--keda]
eval "$(goodput cluster env)"      # KUBECONFIG, Prometheus URL, pod network namespace
goodput cluster status
goodput cluster down [--keep-logs]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from goodput.testbed.cluster import controlplane, keda
from goodput.testbed.cluster.binaries import BinariesUnavailableError, ensure_binaries
from goodput.testbed.cluster.netns import NetnsError
from goodput.testbed.cluster.pki import PkiError
from goodput.testbed.cluster.topology import Topology

DEFAULT_NAME = "dev"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in (
        ("up", "build the binaries if needed, start the cluster and wait until it is ready"),
        ("down", "stop the cluster's processes, remove its network namespace and state"),
        ("status", "show each component: running, ready"),
        ("env", "print shell exports: KUBECONFIG, GOODPUT_PROMETHEUS_URL, GOODPUT_NETNS"),
    ):
        sub = actions.add_parser(action, help=help_text, description=help_text)
        sub.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
        sub.add_argument(
            "--state-dir",
            type=Path,
            help="where the cluster keeps its state and logs (default ~/.cache/goodput/cluster/NAME)",
        )
        if action == "up":
            sub.add_argument(
                "--topology",
                type=Topology.parse,
                default=Topology(),
                help="fake GPU fleet: zones=2,domains=2,nodes=2,gpus=8[,product=NAME][,memory=MIB]",
            )
            sub.add_argument(
                "--scrape-interval",
                type=float,
                default=5.0,
                metavar="SECONDS",
                help="Prometheus scrape interval (default 5)",
            )
            sub.add_argument(
                "--no-netns",
                action="store_true",
                help="do not route pod IPs into a network namespace (no root needed; pods not reachable)",
            )
            sub.add_argument(
                "--keda",
                action="store_true",
                help="also start KEDA (operator and external-metrics API server), the live A/B run's peer",
            )
            sub.add_argument(
                "--timeout",
                type=float,
                default=180.0,
                metavar="SECONDS",
                help="readiness deadline (default 180)",
            )
        if action == "down":
            sub.add_argument(
                "--keep-logs", action="store_true", help="keep the component logs in the state dir"
            )


def run(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir or controlplane.default_state_dir(args.name)
    try:
        if args.action == "up":
            return _up(args, state_dir)
        if args.action == "down":
            return _down(state_dir, keep_logs=args.keep_logs)
        if args.action == "status":
            return _status(state_dir)
        return _env(state_dir)
    except (controlplane.ClusterError, BinariesUnavailableError, NetnsError, PkiError, ValueError) as error:
        print(f"goodput cluster {args.action}: {error}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace, state_dir: Path) -> int:
    bin_dir = ensure_binaries()
    spec = controlplane.ClusterSpec(
        name=args.name,
        state_dir=state_dir,
        topology=args.topology,
        scrape_interval_seconds=args.scrape_interval,
        with_netns=not args.no_netns,
        ready_timeout_seconds=args.timeout,
    )
    cluster = controlplane.up(spec, bin_dir=bin_dir)
    if args.keda:
        try:
            keda.start(cluster)
        except BaseException:
            controlplane.down(state_dir, keep_logs=True)
            raise
        print("KEDA is up: ScaledObjects scale through the cluster's HorizontalPodAutoscaler")
    print(
        f'cluster {cluster.name} is up; to use it:\n  eval "$(goodput cluster env --name {cluster.name}',
        end="",
    )
    print(f' --state-dir {shlex.quote(str(state_dir))})"' if args.state_dir else ')"')
    return 0


def _down(state_dir: Path, *, keep_logs: bool) -> int:
    if not state_dir.exists():
        print(f"no cluster state in {state_dir}; nothing to stop")
        return 0
    report = controlplane.down(state_dir, keep_logs=keep_logs)
    print(f"stopped: {', '.join(report.stopped) or 'none'}")
    if report.killed:
        print(f"killed (SIGKILL after the SIGTERM grace): {', '.join(report.killed)}")
    if report.still_exiting:
        print(f"NOT exited even after SIGKILL, may still hold ports: {', '.join(report.still_exiting)}")
    elif report.stopped or report.netns_processes_stopped:
        print("every process stopped has exited")
    if report.not_running:
        print(f"already gone: {', '.join(report.not_running)}")
    if report.netns_removed:
        extra = (
            f" (ended {len(report.netns_processes_stopped)} processes inside)"
            if report.netns_processes_stopped
            else ""
        )
        print(f"network namespace {report.netns_removed} removed{extra}")
    print(f"logs kept in {report.logs_kept_in}" if report.logs_kept_in else f"state {state_dir} removed")
    return 1 if report.still_exiting else 0


def _status(state_dir: Path) -> int:
    cluster = controlplane.load(state_dir)
    statuses = cluster.status()
    print(f"cluster {cluster.name} ({state_dir})")
    for status in statuses:
        state = "ready" if status.healthy else ("running, not ready" if status.running else "stopped")
        pid = f"pid {status.pid}" if status.pid else "no pid"
        print(f"  {status.name:<24} {state:<20} {pid:<12} {status.detail[:60]}")
    if all(status.healthy for status in statuses):
        nodes = cluster.api.request("GET", "/api/v1/nodes")["items"]
        ready = sum(
            1
            for node in nodes
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])
            )
        )
        print(f"  nodes: {ready}/{len(nodes)} Ready")
    if cluster.state.netns:
        from goodput.testbed.cluster.netns import exists

        present = "present" if exists(cluster.state.netns) else "MISSING"
        print(f"  netns {cluster.state.netns}: {present}, pod range {cluster.network.pod_range}")
    return 0 if all(status.healthy for status in statuses) else 1


def _env(state_dir: Path) -> int:
    cluster = controlplane.load(state_dir)
    print(f"export KUBECONFIG={shlex.quote(cluster.kubeconfig)}")
    print(f"export GOODPUT_PROMETHEUS_URL={shlex.quote(cluster.prometheus_url)}")
    if cluster.state.netns:
        print(f"export GOODPUT_NETNS={shlex.quote(cluster.state.netns)}")
    return 0
