"""`goodput demo`, shortened, on the session's cluster: what its summary claims holds in its JSON.

The demo is run as a user runs it (its own process, the CLI), against the running cluster it is given,
in a namespace and Helm release of its own; it must leave neither behind.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from typing import Any

import pytest

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for

pytestmark = pytest.mark.e2e

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A short story: 20 s steady, a 45 s burst at about three times the rate, 45 s steady again, and up
# to 90 s for the drains (the demo policy scales in one group per 15 s after a 30 s window).
SHORT = [
    "--before-seconds", "20", "--burst-seconds", "45", "--after-seconds", "45",
    "--interval-seconds", "5", "--engine-load-seconds", "3", "--settle-seconds", "90",
]  # fmt: skip


@pytest.fixture(scope="module")
def demo_run(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    suffix = secrets.token_hex(3)
    out = tmp_path_factory.mktemp("demo")
    namespace, release_namespace, release = f"e2e-demo-{suffix}", f"e2e-demo-{suffix}-op", f"gp-demo-{suffix}"
    argv = [
        sys.executable, "-m", "goodput.operator.cli", "demo", "--cluster-state-dir", str(cluster.state_dir),
        "--out", str(out), "--namespace", namespace, "--release", release,
        "--release-namespace", release_namespace, *SHORT,
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (
        f"goodput demo failed ({result.returncode}):\n{result.stderr[-4000:]}\n{result.stdout[-2000:]}"
    )
    return {
        "out": out,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "document": json.loads((out / "demo.json").read_text()),
        "namespace": namespace,
        "release_namespace": release_namespace,
        "release": release,
    }


def test_the_burst_is_met_by_at_least_one_scale_out_with_its_reason(demo_run: dict[str, Any]) -> None:
    summary = demo_run["document"]["summary"]
    assert summary["scale_outs"], f"no scale-out: {demo_run['stdout']}"
    first = summary["scale_outs"][0]
    assert first["to_groups"] > first["from_groups"] and first["signal"], first
    burst = next(p for p in demo_run["document"]["scenario"]["phases"] if p["name"] == "burst")
    assert first["offset_seconds"] >= 20, "nothing scaled out before the burst began"
    assert burst["rate_multiplier"] > 2 * demo_run["document"]["scenario"]["phases"][0]["rate_multiplier"]
    assert summary["peak_groups"] > 1


def test_after_the_burst_a_group_is_drained_and_no_request_is_lost(demo_run: dict[str, Any]) -> None:
    summary = demo_run["document"]["summary"]
    assert summary["scale_ins"], f"no scale-in: {demo_run['stdout']}"
    drained = [drain for drain in summary["drains"] if drain["ending"] == "drained"]
    assert drained, f"no drain ended with its leader idle: {summary['drains']}"
    assert summary["drained_scale_ins"] == len(drained)
    assert all(drain["requests_lost"] == 0 for drain in drained), drained
    assert summary["lost_on_drained_groups"] == 0
    # A drain never cuts a stream: the load generator saw none cut or aborted at all.
    assert summary["failed_by_outcome"]["cut"] == 0 and summary["failed_by_outcome"]["aborted"] == 0
    assert demo_run["document"]["load"]["outcomes"]["cut"] == 0


def test_attainment_is_counted_against_everything_offered(demo_run: dict[str, Any]) -> None:
    document = demo_run["document"]
    summary = document["summary"]
    assert summary["offered"] == document["load"]["planned"] > 0
    assert summary["attainment_offered"] is not None and 0.0 <= summary["attainment_offered"] <= 1.0
    assert summary["attainment_offered"] == pytest.approx(summary["attained"] / summary["offered"])
    assert sum(row["offered"] for row in document["timeline"]) == summary["offered"]
    assert "attainment against offered load" in demo_run["stdout"]


def test_the_load_goes_through_the_gateway_with_two_tenants_and_it_counts_what_the_client_sent(
    demo_run: dict[str, Any],
) -> None:
    document = demo_run["document"]
    steady, bursty = document["scenario"]["tenants"]
    tenants = {figures["tenant"]: figures for figures in document["summary"]["tenants"]}
    assert set(tenants) == {steady, bursty}
    assert tenants[bursty]["offered"] > tenants[steady]["offered"], "the burst is the second tenant's"
    # Every request the client sent reached the gateway, which counted it for the right tenant; its
    # refusals are the client's 429s.
    counted = document["scenario"]["gateway"]
    sent = {
        name: sum(row_t["offered"] for row in document["timeline"] for row_t in row["tenants"]
                  if row_t["tenant"] == name)
        for name in (steady, bursty)
    }  # fmt: skip
    not_sent = document["load"]["not_sent"]
    assert sum(not_sent.values()) == 0, not_sent
    for name in (steady, bursty):
        assert counted[name]["offered"] == sent[name], (name, counted, sent)
        assert counted[name].get("rejected", 0) == tenants[name]["rejected"], (name, counted, tenants)
    assert document["summary"]["rejected"] == document["load"]["outcomes"]["rejected"]
    assert "the gateway counted (its own metrics), per tenant:" in demo_run["stdout"]
    assert f"{steady}: offered/s rejected attained" in demo_run["stdout"]


def test_the_plots_are_written_and_not_empty(demo_run: dict[str, Any]) -> None:
    plots = demo_run["document"]["scenario"]["plots"]
    assert sorted(plots) == ["groups.png", "latency.png"]
    for name in plots:
        data = (demo_run["out"] / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name


def test_the_demo_removes_what_it_installed_in_a_cluster_it_did_not_start(
    cluster: LocalCluster, demo_run: dict[str, Any]
) -> None:
    def gone(kind: str, name: str, *scope: str) -> bool:
        result = cluster.kubectl("get", kind, name, *scope, "-o", "json", check=False)
        return result.returncode != 0 or json.loads(result.stdout)["status"].get("phase") == "Terminating"

    wait_for(
        lambda: gone("namespace", demo_run["namespace"]) and gone("namespace", demo_run["release_namespace"]),
        timeout_seconds=60,
        describe="the demo's namespaces to go",
    )
    assert gone("clusterrole", f"{demo_run['release']}-goodput-nodes")
    assert "teardown: uninstalling" in demo_run["stderr"]
    assert all(status.healthy for status in cluster.status()), "the cluster it was given keeps running"
