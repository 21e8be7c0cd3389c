"""A platform team asks `goodput doctor` whether its cluster gives goodput what it needs.

The chart is installed on the local cluster as a team installs it (the CRDs, the operator's RBAC and
ServiceAccount, its Deployment configured with the cluster's Prometheus, watching one namespace),
the operator runs with that Deployment's environment and nothing but its ServiceAccount's token (the
fake nodes run no containers, so it runs here as a process), and the emulator serves a ModelGroup's
leader with vLLM's metrics, which the cluster's Prometheus scrapes as a PodMonitor would.

Then `goodput doctor` runs as a user runs it, with an admin's kubeconfig and no settings of its own:
it finds the operator's Deployment, reads its Prometheus from it, and passes. Asked with a
Prometheus that has no scrape of the vLLM leaders (what a cluster without the vLLM PodMonitor, or
with one no Prometheus selects, looks like), it fails and says so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_autoscaler import POOL_LABEL, model_group, slo_policy
from test_chart_install import (
    Installed,
    installed,
    operator_environment,
    operator_process,
    scratch_namespace,
    service_account_kubeconfig,
)

from goodput.testbed.cluster.controlplane import LocalCluster, free_ports
from goodput.testbed.cluster.kube import probe
from goodput.testbed.cluster.processes import stop_child
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import EmulatorProcess

pytestmark = pytest.mark.e2e

API = "/apis/goodput.dev/v1alpha1"


@dataclass(frozen=True, slots=True)
class Served:
    """The chart installed, the operator and the emulator running, one ModelGroup with a Ready group."""

    cluster: LocalCluster
    install: Installed
    workload: str


def _apply(cluster: LocalCluster, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))


def _ready_groups(cluster: LocalCluster, workload: str) -> int:
    found = cluster.api.get(f"{API}/namespaces/{workload}/modelgroups/llama") or {}
    return int((found.get("status") or {}).get("readyGroups") or 0)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _scraped(cluster: LocalCluster, workload: str) -> bool:
    """Whether the cluster's Prometheus holds the leader's engine gauge under the autoscaler's labels."""
    query = f'vllm:num_requests_running{{namespace="{workload}",model_group="llama"}}'
    ok, body = probe(f"{cluster.prometheus_url}/api/v1/query?query={urllib.parse.quote(query)}")
    return ok and '"result":[{' in body


@pytest.fixture(scope="module")
def served(
    cluster: LocalCluster, goodput_crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    logs = tmp_path_factory.mktemp("doctor")
    with contextlib.ExitStack() as stack:
        release_namespace = stack.enter_context(scratch_namespace(cluster, "e2e-doctor"))
        workload = stack.enter_context(scratch_namespace(cluster, "e2e-doctor-work"))
        node = cluster.add_gpu_node(
            f"{workload}-h100", zone=f"{workload}-z", clique=f"{workload}-c", labels={POOL_LABEL: workload}
        )
        stack.callback(cluster.remove_node, node.name)
        install = stack.enter_context(
            installed(
                cluster, release_namespace,
                "--set", f"watchNamespaces[0]={workload}",
                "--set", f"prometheus.url={cluster.prometheus_url}",
            )
        )  # fmt: skip
        fullname = f"{install.release}-goodput"
        kubeconfig = service_account_kubeconfig(cluster, release_namespace, fullname, logs / "kubeconfig")
        stack.enter_context(EmulatorProcess(cluster, workload, logs / "emulator.log"))
        stack.enter_context(
            operator_process(operator_environment(cluster, install), kubeconfig, logs / "operator.log")
        )
        _apply(
            cluster, slo_policy("chat", workload), model_group("llama", workload, replicas=1, policy="chat")
        )
        wait_for(
            lambda: _ready_groups(cluster, workload) == 1,
            timeout_seconds=120,
            describe=lambda: f"a Ready group of llama; operator log:\n{_tail(logs / 'operator.log')}",
        )
        wait_for(
            lambda: _scraped(cluster, workload),
            timeout_seconds=60,
            describe="the leader's series in Prometheus",
        )
        yield Served(cluster, install, workload)


def doctor(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """`goodput doctor` as a user runs it: an admin's kubeconfig, no GOODPUT_* settings of its own."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("GOODPUT_")}
    environment["KUBECONFIG"] = served.cluster.kubeconfig
    return subprocess.run(
        [sys.executable, "-m", "goodput.operator.cli", "doctor", "-n", served.workload, *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def lines_by_check(output: str) -> dict[str, str]:
    """Each check's line by its name (the word after the verdict), fix lines folded into it."""
    checks: dict[str, str] = {}
    name = ""
    for line in output.splitlines():
        verdict, _, rest = line.partition("  ")
        if verdict.strip() in {"OK", "WARN", "FAIL"}:
            name = rest.strip().split("  ")[0]
            checks[name] = line
        elif name and line.strip().startswith("fix:"):
            checks[name] += "\n" + line
    return checks


def test_doctor_passes_on_a_cluster_that_serves_a_model_group(served: Served) -> None:
    result = doctor(served)
    checks = lines_by_check(result.stdout)
    workload = served.workload

    assert result.returncode == 0, result.stdout + result.stderr
    for name in (
        "crds",
        "rbac",
        "prometheus",
        f"vllm-series {workload}/llama",
        f"gpus {workload}/llama",
        "gateway",
    ):
        assert checks[name].startswith("OK"), result.stdout
    # Found by its labels, and its Prometheus read from its Deployment.
    account = f"ServiceAccount {served.install.namespace}/{served.install.release}-goodput"
    assert account in checks["rbac"], checks["rbac"]
    assert served.cluster.prometheus_url in checks["prometheus"]
    assert "1 Ready group(s)" in checks[f"vllm-series {workload}/llama"]


@contextlib.contextmanager
def prometheus_without_the_leaders_scrape(cluster: LocalCluster, folder: Path) -> Iterator[str]:
    """A Prometheus of the same build that scrapes nothing of the cluster's pods, as one whose
    vLLM PodMonitor is missing (or carries no label its podMonitorSelector wants)."""
    (port,) = free_ports(1)
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "2s"}, "scrape_configs": []}))
    url = f"http://127.0.0.1:{port}"
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                str(cluster.bin_dir / "prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: probe(f"{url}/-/ready")[0], timeout_seconds=30, describe="the second Prometheus ready"
        )
        yield url
    finally:
        stop_child(process, grace_seconds=10)


def test_doctor_fails_and_names_the_missing_vllm_monitor(served: Served, tmp_path: Path) -> None:
    with prometheus_without_the_leaders_scrape(served.cluster, tmp_path) as url:
        result = doctor(served, "--prometheus-url", url)
    checks = lines_by_check(result.stdout)
    series = checks[f"vllm-series {served.workload}/llama"]

    assert result.returncode == 1, result.stdout + result.stderr
    assert checks["prometheus"].startswith("OK"), result.stdout
    assert series.startswith("FAIL"), result.stdout
    assert "nothing scrapes leader(s) llama-g" in series
    assert "the vLLM PodMonitor (or the scrape job) is missing" in series
    assert "goodput.dev/metrics=true" in series, "the fix says which pods to scrape"
    assert result.stdout.splitlines()[-1].endswith("1 fail")
