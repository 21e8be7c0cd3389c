"""The autoscaler's reaction on the local cluster: offered load step → decision → groups ready.

    python bench/bench_autoscaler_reaction.py [--runs 3] [--cluster STATE_DIR]

Each run: a ModelGroup of one emulated 8B group (`maxNumSeqs: 2`, about four 256/64-token requests a
second) under 2.5 requests a second for 20 s, then 5 a second (the e2e's burst). The operator
(`goodput run`, policy interval 5 s, Prometheus scraping every 2 s, 8 s rate window) scales it out.
Printed per run: step → scale-out decision, decision → all wanted groups ready, and the latter minus
the simulated start-up of a group (kwok's pod start 0.1 s and image pull 1 s, then the emulator's
model load 2 s and NCCL check 0.5 s), which is what the operator and the control plane add. Then
the operator's own histogram of time per decision (`goodput_autoscaler_decision_duration_seconds`,
stages metrics / decide / total), scraped from its metrics endpoint. Asserts nothing.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))  # the e2e stage is shared, not duplicated

from test_autoscaler import (  # noqa: E402  (the e2e stage: emulator, operator, load)
    BASE_RATE,
    BURST_RATE,
    POOL_LABEL,
    Stage,
    emulator_process,
    load,
    model_group,
    operator_process,
    slo_policy,
)

from goodput.testbed.cluster.controlplane import LocalCluster  # noqa: E402
from goodput.testbed.cluster.testing import wait_for  # noqa: E402
from goodput.testbed.operator_process import local_cluster  # noqa: E402

SIMULATED_START_SECONDS = 0.1 + 1.0 + 2.0 + 0.5
BASE_SECONDS, BURST_SECONDS = 20.0, 60.0


def one_run(cluster: LocalCluster, scratch: Path) -> tuple[dict[str, float], str]:
    """Figures of one run, and the operator's metrics page at its end."""
    namespace = f"bench-as-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    wait_for(
        lambda: cluster.api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"), timeout_seconds=30
    )
    node = cluster.add_gpu_node(
        f"{namespace}-h100", zone=f"{namespace}-z", clique=f"{namespace}-c", labels={POOL_LABEL: namespace}
    )
    emulator = emulator_process(cluster, namespace, scratch / f"{namespace}-emulator.log")
    operator = operator_process(cluster, namespace, scratch / f"{namespace}-operator.log")
    metrics_port = operator.argv[operator.argv.index("--metrics-port") + 1]
    emulator.start()
    operator.start()
    try:
        stage = Stage(cluster, namespace, operator, emulator)
        stage.apply(slo_policy("chat", namespace), model_group("llama", namespace, replicas=1, policy="chat"))
        stage.wait_ready_groups("llama", 1)
        with load(stage, "llama", [(BASE_RATE, BASE_SECONDS), (BURST_RATE, BURST_SECONDS)]) as started:
            step = started + BASE_SECONDS
            wait_for(
                lambda: stage.replicas("llama") > 1, timeout_seconds=BURST_SECONDS, describe="a scale-out"
            )
            wanted = stage.replicas("llama")
            wait_for(
                lambda: stage.status("llama").get("readyGroups", 0) >= wanted,
                timeout_seconds=60,
                interval_seconds=0.1,
                describe=f"{wanted} ready groups",
            )
            ready = time.time()
            decided = wait_for(
                lambda: next(
                    (
                        float(record["time"])
                        for record in stage.decisions("llama")
                        if record["result"]["desired_groups"] > record["result"]["current_groups"]
                    ),
                    None,
                ),
                timeout_seconds=10,
            )
            page = (
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            )
        return {
            "step_to_decision": decided - step,
            "decision_to_ready": ready - decided,
            "operator_and_control_plane": ready - decided - SIMULATED_START_SECONDS,
            "groups": float(wanted),
        }, page
    finally:
        operator.stop()
        emulator.stop()
        cluster.remove_node(node.name)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def histogram(page: str, name: str) -> dict[str, dict[str, float]]:
    """Bucket counts, sum and count of a histogram's series by their `stage` label."""
    series: dict[str, dict[str, float]] = {}
    for line in page.splitlines():
        if not line.startswith(name):
            continue
        key, value = line.rsplit(" ", 1)
        stage = key.split('stage="', 1)[1].split('"', 1)[0]
        entry = series.setdefault(stage, {})
        if "_bucket" in key:
            entry["le=" + key.split('le="', 1)[1].split('"', 1)[0]] = float(value)
        elif key.startswith(name + "_sum"):
            entry["sum"] = float(value)
        elif key.startswith(name + "_count"):
            entry["count"] = float(value)
    return series


def quantile(entry: dict[str, float], q: float) -> float:
    """The upper bound of the bucket holding quantile q (what a histogram can say)."""
    rank = q * entry["count"]
    bounds = sorted((float(k[3:]), v) for k, v in entry.items() if k.startswith("le="))
    return next(bound for bound, count in bounds if count >= rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--cluster", type=Path, help="state dir of a running `goodput cluster up` (else a new one)"
    )
    args = parser.parse_args()
    figures: list[dict[str, float]] = []
    pages: list[str] = []
    with local_cluster(args.cluster) as cluster, tempfile.TemporaryDirectory() as scratch:
        crds = ROOT / "crds"
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelgroups.goodput.dev")
        for run in range(args.runs):
            result, page = one_run(cluster, Path(scratch))
            figures.append(result)
            pages.append(page)
            extra = result["operator_and_control_plane"]
            print(
                f"run {run + 1}: step→decision {result['step_to_decision']:.1f} s, "
                f"decision→{result['groups']:.0f} groups ready {result['decision_to_ready']:.1f} s "
                f"(operator + control plane {extra:.1f} s beyond {SIMULATED_START_SECONDS:.1f} s of "
                "simulated start-up)",
                flush=True,
            )
    for key, label in (
        ("step_to_decision", "load step → scale-out decision"),
        ("decision_to_ready", "decision → groups ready"),
        ("operator_and_control_plane", "decision → ready, minus simulated start-up"),
    ):
        values = [figure[key] for figure in figures]
        spread = f"(min {min(values):.1f}, max {max(values):.1f})"
        print(f"{label:45s} median {statistics.median(values):5.1f} s  {spread}")
    print("time per decision in the running operator (goodput_autoscaler_decision_duration_seconds):")
    for page in pages:
        for stage, entry in sorted(histogram(page, "goodput_autoscaler_decision_duration_seconds").items()):
            if entry.get("count"):
                mean_ms = 1000 * entry["sum"] / entry["count"]
                p50, p90 = 1000 * quantile(entry, 0.5), 1000 * quantile(entry, 0.9)
                count = f"n={entry['count']:.0f}"
                print(f"  {stage:8s} {count} mean {mean_ms:.2f} ms, p50 ≤ {p50:g} ms, p90 ≤ {p90:g} ms")


if __name__ == "__main__":
    main()
