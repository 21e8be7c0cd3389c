"""Fixtures for tests against a real local control plane (`goodput cluster`).

- `cluster` (session): a running cluster — `.kubeconfig`, `.bin_dir`, `.prometheus_url`, `.netns`,
  `.kubectl(*args, input=None, check=True)`, `.run_in_netns(argv)`; KUBECONFIG is exported for the
  session. Started once (default topology: 2 zones x 2 NVLink domains x 2 nodes x 8 GPUs) and
  stopped at the end, its logs kept in the session's tmp dir. `GOODPUT_E2E_CLUSTER=<state dir>`
  reuses a cluster started by `goodput cluster up` instead (left running).
- `goodput_crds` (session): the project's CRDs from crds/ applied and Established.
- `namespace` (function): a fresh namespace (with its default ServiceAccount), deleted afterwards
  without waiting.
- `operator_image_archive` (session): `make image`'s OCI archive, current with the sources. A session
  that runs the chart's image story starts the build in the background at its start, so that the
  minutes of dpkg, pip and buildah overlap other stories.

If the binaries cannot be built, or the harness cannot run here, every e2e test fails with the
reason: these tests guard the production path and must not be skipped silently.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import subprocess
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
ROOT = repository_root()
SESSION_SCRAPE_INTERVAL_SECONDS = 2.0

# `make e2e` runs the stories on E2E_WORKERS workers (pytest-xdist, `--dist loadfile`), each with a
# session cluster of its own, so that no story shares a cluster with one running at the same time (GPU
# capacity, node faults, chaos) and a file's module fixtures run once. A worker takes a file at a time,
# longest first: seconds each file took with four workers on two cores (`pytest -n 4 --durations=0`).
# test_chart_install's figure leaves out the image's build (536 s of its 900 in a fresh clone): the
# build runs beside the stories from the session's start (`pytest_sessionstart` below), and the file,
# taken later, finds the archive built or nearly.
FILE_SECONDS: dict[str, float] = {
    "test_drain_killed": 820,
    "test_drain": 450,
    "test_autoscaler": 1070,
    "test_keda": 700,
    "test_chart_install": 360,
    "test_nodes_on_demand": 300,
    "test_gateway": 750,
    "test_emulator": 680,
    "test_ab": 600,
    "test_demo": 400,
    "test_chaos": 300,
    "test_modelgroup": 200,
    "test_sessions": 110,
    "test_endpoint_picker": 100,
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


# --- the operator's image, built once and beside the stories ---------------------------------------------

IMAGE_OUT = ROOT / "out" / "image"
# Held by whoever builds the image (`make image` takes it too), so that no two builds share its storage.
IMAGE_LOCK = IMAGE_OUT / ".build.lock"
IMAGE_BUILD_LOG = IMAGE_OUT / "build.log"
# The folders the image holds (Containerfile); a newer source file means the archive is stale.
IMAGE_LAYERS = ("api", "estimators", "controllers", "operator", "simulator", "gateway", "agent")
IMAGE_STORY = Path(__file__).resolve().parent / "test_chart_install.py"
IMAGE_BUILD = pytest.StashKey[subprocess.Popen[bytes]]()


def image_archive() -> Path:
    tag = yaml.safe_load((ROOT / "charts" / "goodput" / "Chart.yaml").read_text())["appVersion"]
    return IMAGE_OUT / f"goodput-{tag}.oci.tar"


def image_is_stale() -> bool:
    """Whether the archive is absent or older than a file it is built from: an older operator would
    refuse fields of the CRDs."""
    sources = [path for layer in IMAGE_LAYERS for path in (ROOT / layer).rglob("*.py")]
    newest_source = max(
        path.stat().st_mtime for path in [*sources, ROOT / "pyproject.toml", ROOT / "Containerfile"]
    )
    archive = image_archive()
    return not archive.exists() or archive.stat().st_mtime < newest_source


def _session_runs(config: pytest.Config, story: Path) -> bool:
    """Whether the session's arguments take in `story`: the file itself, or a folder above it."""
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == story or path in story.parents:
            return True
    return False


def pytest_sessionstart(session: pytest.Session) -> None:
    """Starts the image's build in the background (the session's main process only, at a low CPU
    priority) when the session runs the image story and the archive is stale: the story then waits
    for what is left of it instead of a worker spending minutes in the build."""
    config = session.config
    if os.environ.get("PYTEST_XDIST_WORKER") or config.option.collectonly:
        return
    if not _session_runs(config, IMAGE_STORY) or not image_is_stale():
        return
    IMAGE_OUT.mkdir(parents=True, exist_ok=True)
    with IMAGE_LOCK.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a build is running already; the story waits for it
        # The build inherits the locked file and holds the lock until it exits.
        with IMAGE_BUILD_LOG.open("wb") as log:
            config.stash[IMAGE_BUILD] = subprocess.Popen(
                ["nice", "-n", "10", "make", "--no-print-directory", "image-build"],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(lock.fileno(),),
                start_new_session=True,
            )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build the image story never waited for (deselected, or the run interrupted) is stopped."""
    build = session.config.stash.get(IMAGE_BUILD, None)
    if build is None or build.poll() is not None:
        return
    os.killpg(build.pid, signal.SIGTERM)
    try:
        build.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait(timeout=10)


@pytest.fixture(scope="session")
def operator_image_archive() -> Path:
    """`make image`'s archive, current with the sources: a build under way (the one the session
    started) is waited for, and the image is built here when none ran or it failed (minutes)."""
    IMAGE_OUT.mkdir(parents=True, exist_ok=True)
    with IMAGE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_is_stale():
            built = subprocess.run(
                ["make", "--no-print-directory", "image-build"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
            assert built.returncode == 0, (
                f"make image failed (the session's own attempt: {IMAGE_BUILD_LOG}):\n"
                f"{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
            )
    return image_archive()
