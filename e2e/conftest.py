"""Fixtures for tests against a real local control plane (`goodput cluster`).

- `cluster` (session): a running cluster — `.kubeconfig`, `.bin_dir`, `.prometheus_url`, `.netns`,
  `.kubectl(*args, input=None, check=True)`, `.run_in_netns(argv)`; KUBECONFIG is exported for the
  session. Started once (default topology: 2 zones x 2 NVLink domains x 2 nodes x 8 GPUs) and
  stopped at the end, its logs kept in the session's tmp dir. `GOODPUT_E2E_CLUSTER=<state dir>`
  reuses a cluster started by `goodput cluster up` instead (left running).
- `goodput_crds` (session): the project's CRDs from crds/ applied and Established.
- `namespace` (function): a fresh namespace (with its default ServiceAccount), deleted afterwards
  without waiting.

If the binaries cannot be built, or the harness cannot run here, every e2e test fails with the
reason: these tests guard the production path and must not be skipped silently.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from goodput.testbed.cluster import controlplane
from goodput.testbed.cluster.binaries import BinariesUnavailableError, ensure_binaries, repository_root
from goodput.testbed.cluster.kube import ApiError
from goodput.testbed.cluster.netns import NetnsError
from goodput.testbed.cluster.pki import PkiError
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import FakeLeaders, OperatorProcess, fake_leaders

E2E_CLUSTER_ENV = "GOODPUT_E2E_CLUSTER"
SESSION_SCRAPE_INTERVAL_SECONDS = 2.0

# `make e2e` runs the stories on E2E_WORKERS workers (pytest-xdist, `--dist loadfile`), each with a
# session cluster of its own, so that no story shares a cluster with one running at the same time (GPU
# capacity, node faults, chaos) and a file's module fixtures run once. A worker takes a file at a time,
# longest first: seconds each file took with four workers on two cores (`pytest -n 4 --durations=0`).
FILE_SECONDS: dict[str, float] = {
    "test_drain": 1270,
    "test_autoscaler": 1070,
    "test_keda": 700,
    "test_nodes_on_demand": 300,
    "test_chart_install": 900,
    "test_gateway": 750,
    "test_emulator": 680,
    "test_ab": 600,
    "test_demo": 400,
    "test_chaos": 300,
    "test_modelgroup": 200,
    "test_least_privilege": 150,
    "test_cluster": 120,
    "test_bad_input": 120,
    "test_leader_election": 100,
}
DEFAULT_FILE_SECONDS = 60.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if Path(str(item.fspath)).parent == here]
    for item in ours:
        item.add_marker(pytest.mark.e2e)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The longest files first, so that the worker given the last one does not finish late; one by
        # one, the stories keep the files' order.
        def seconds(item: pytest.Item) -> float:
            return -FILE_SECONDS.get(Path(str(item.fspath)).stem, DEFAULT_FILE_SECONDS)

        others = [item for item in items if Path(str(item.fspath)).parent != here]
        items[:] = others + sorted(ours, key=seconds)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.LocalCluster]:
    reuse = os.environ.get(E2E_CLUSTER_ENV)
    if reuse:
        handle = controlplane.load(Path(reuse))
        os.environ["KUBECONFIG"] = handle.kubeconfig
        yield handle
        return
    if os.geteuid() != 0:
        pytest.fail(
            "e2e tests need root: the harness routes pod IPs into a network namespace "
            f"(or set {E2E_CLUSTER_ENV} to the state dir of a running `goodput cluster up`)",
            pytrace=False,
        )
    try:
        bin_dir = ensure_binaries()
    except BinariesUnavailableError as error:
        pytest.fail(f"cannot build the local cluster's binaries: {error}", pytrace=False)
    spec = controlplane.ClusterSpec(
        name=f"e2e{os.getpid() % 100_000}",
        state_dir=tmp_path_factory.mktemp("cluster"),
        scrape_interval_seconds=SESSION_SCRAPE_INTERVAL_SECONDS,
    )
    try:
        handle = controlplane.up(spec, bin_dir=bin_dir)
    except (controlplane.ClusterError, NetnsError, PkiError, ApiError, OSError) as error:
        pytest.fail(
            f"the local cluster did not start: {error} (component logs: {spec.state_dir}/logs)", pytrace=False
        )
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = handle.kubeconfig
    try:
        yield handle
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        controlplane.down(spec.state_dir, keep_logs=True)


@pytest.fixture(scope="session")
def goodput_crds(cluster: controlplane.LocalCluster) -> list[str]:
    """Names of the project's CRDs, applied server-side from crds/ and Established."""
    crd_dir = repository_root() / "crds"
    files = sorted(crd_dir.glob("*.yaml"))
    names = [
        doc["metadata"]["name"]
        for path in files
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    if not names:
        pytest.fail(
            f"{crd_dir} holds no CustomResourceDefinition; render them with `goodput crds`", pytrace=False
        )
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))

    # Polled, not `kubectl wait`: that fails at once on a CRD read before it has any status.
    def established() -> bool:
        return all(_crd_established(cluster, name) for name in names)

    wait_for(established, timeout_seconds=60, describe=f"CRDs {', '.join(names)} to be Established")
    return names


def _crd_established(cluster: controlplane.LocalCluster, name: str) -> bool:
    crd = cluster.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    conditions = (crd.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


@pytest.fixture
def namespace(cluster: controlplane.LocalCluster) -> Iterator[str]:
    name = f"e2e-{secrets.token_hex(4)}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the controller manager has created the namespace's default ServiceAccount.
    wait_for(
        lambda: cluster.api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout_seconds=30,
        describe=f"the default ServiceAccount of namespace {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(
    cluster: controlplane.LocalCluster, goodput_crds: list[str], namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator watching the test's namespace, after the CRDs; a file that needs another start
    order (the emulator first) or another process declares its own."""
    with OperatorProcess(cluster, namespace, tmp_path / "operator.log") as running:
        yield running


@pytest.fixture
def leaders(cluster: controlplane.LocalCluster, tmp_path: Path) -> Iterator[FakeLeaders]:
    """Stand-ins serving as every group leader, recording what they were sent."""
    with fake_leaders(cluster, tmp_path / "completions.jsonl") as serving:
        yield serving
