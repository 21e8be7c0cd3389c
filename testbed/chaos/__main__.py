"""`python -m goodput.testbed.chaos`: the chaos run on a throwaway local cluster (or a running one),
its seed printed first, its report last; exit status 1 when an invariant broke or nothing settled.

CHAOS_SECONDS and CHAOS_SEED set the defaults of --seconds and --seed (what `make chaos` passes on).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from goodput.testbed.chaos.report import format_report
from goodput.testbed.chaos.run import run_chaos
from goodput.testbed.chaos.schedule import ChaosSettings
from goodput.testbed.cluster.binaries import repository_root
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.topology import Topology
from goodput.testbed.operator_process import local_cluster

DEFAULT_SECONDS = 900.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m goodput.testbed.chaos", description=__doc__)
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS") or DEFAULT_SECONDS)
    )
    seed = os.environ.get("CHAOS_SEED")
    parser.add_argument("--seed", type=int, default=int(seed) if seed else secrets.randbelow(2**31))
    parser.add_argument("--out", type=Path, default=Path("out/chaos"))
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="a cluster started by `goodput cluster up` (default: a throwaway one)",
    )
    return parser.parse_args(argv)


def prepare(cluster: LocalCluster, namespace: str) -> None:
    """The project's CRDs applied and Established, and a namespace with its default ServiceAccount."""
    crd_dir = repository_root() / "crds"
    names = [
        doc["metadata"]["name"]
        for path in sorted(crd_dir.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))
    # Polled rather than `kubectl wait`, which fails when it reads a CRD before its status exists.
    _wait(lambda: all(_established(cluster, name) for name in names), f"the CRDs {names} Established")
    cluster.kubectl("create", "namespace", namespace)
    _wait(
        lambda: bool(cluster.api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")),
        f"the default ServiceAccount of namespace {namespace}",
    )


def _established(cluster: LocalCluster, name: str) -> bool:
    crd = cluster.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    conditions = (crd.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _wait(ready: Callable[[], bool], what: str, timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise RuntimeError(f"not ready after {timeout_seconds:g} s: {what}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ChaosSettings(duration_seconds=args.seconds, seed=args.seed)
    print(f"chaos run: seed {args.seed} ({args.seconds:g} s); repeat with CHAOS_SEED={args.seed}", flush=True)
    namespace = f"chaos-{args.seed % 100_000}"
    # A small cluster: the run brings its own GPU pool; the default nodes only carry the system's pods.
    with local_cluster(args.state_dir, Topology(zones=1, domains_per_zone=1, nodes_per_domain=1)) as cluster:
        prepare(cluster, namespace)
        try:
            report = run_chaos(cluster, namespace, settings, args.out)
        finally:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    print(format_report(report), flush=True)
    print(f"report: {args.out / 'report.json'}", flush=True)
    (args.out / "report.txt").write_text(format_report(report) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
