"""The Helm chart against a real API server, and its alert rules against a real Prometheus.

A platform team's path: every object the chart renders passes the API server's own validation
(schemas, CEL, Pod Security admission) in a namespace that enforces the restricted standard; `helm
install` creates them and the operator's pod is admitted; `helm upgrade` and `helm uninstall` work and
leave the CRDs in place. Then the operator itself runs with nothing but the chart's ServiceAccount
token and reconciles a sample ModelGroup, which proves the chart's least-privilege RBAC is enough.
Finally the shipped alert rules are loaded into Prometheus, fed operator and vLLM metrics, and must
raise exactly the alerts the situation calls for.

The fake kwok nodes run no containers, so the operator under test runs here as a process, configured
with the environment the chart's Deployment sets.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from goodput.operator.metrics import OperatorMetrics
from goodput.simulator.metrics import ITL_BUCKETS_SECONDS, TTFT_BUCKETS_SECONDS
from goodput.testbed.cluster.binaries import BinariesUnavailableError, ensure_binaries
from goodput.testbed.cluster.controlplane import LocalCluster, free_ports
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import fake_leaders

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "goodput"
SAMPLES = ROOT / "manifests" / "samples"
# Kinds of the Prometheus Operator, whose CRDs this cluster does not have; the rules are checked by
# loading them into Prometheus instead (test_the_alert_rules_...).
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


# --- helpers -----------------------------------------------------------------------------------------


def helm_binary(cluster: LocalCluster) -> Path:
    helm = cluster.bin_dir / "helm"
    if not os.access(helm, os.X_OK):
        pytest.fail(f"{helm} is missing: build it with tools/build-binaries.sh", pytrace=False)
    return helm


def run_helm(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [str(helm_binary(cluster)), "--kubeconfig", cluster.kubeconfig, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args[:2])} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def template(cluster: LocalCluster, release: str, namespace: str, *flags: str) -> list[dict[str, Any]]:
    rendered = run_helm(cluster, "template", release, str(CHART), "--namespace", namespace, *flags).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def get_json(cluster: LocalCluster, *args: str) -> Any:
    result = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def release_name(namespace: str) -> str:
    """Unique per test, so cluster-scoped names (ClusterRoles, the peering object) never collide."""
    return f"gp-{namespace.removeprefix('e2e-')}"


@pytest.fixture
def restricted_namespace(cluster: LocalCluster, namespace: str) -> str:
    """The test namespace, enforcing the restricted Pod Security Standard the operator must meet."""
    cluster.kubectl("label", "namespace", namespace, RESTRICTED)
    return namespace


@contextlib.contextmanager
def scratch_namespace(cluster: LocalCluster, prefix: str) -> Iterator[str]:
    """A namespace of the test's own, yielded once its default ServiceAccount exists (pods and
    tokens need it), deleted without waiting; a ModelGroup the operator did not get to finalize (a
    failed test) must not hold it."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    try:
        wait_for(
            lambda: get_json(cluster, "serviceaccount", "default", "-n", name),
            timeout_seconds=30,
            describe=f"the default ServiceAccount of {name}",
        )
        yield name
    finally:
        remaining = get_json(cluster, "modelgroups", "-n", name) or {"items": []}
        for item in remaining["items"]:
            cluster.kubectl(
                "patch", "modelgroup", item["metadata"]["name"], "-n", name, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def workload_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A second namespace, for the ModelGroups (vLLM pods are not restricted-compliant)."""
    with scratch_namespace(cluster, "e2e-work") as name:
        yield name


@pytest.fixture(scope="session")
def peering_crds(cluster: LocalCluster) -> None:
    """The kopf peering CRDs from the chart's crds/ directory, as `helm install` creates them first."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/kopfpeerings.kopf.dev",
    )


# --- the API server validates every object ---------------------------------------------------------------


@pytest.mark.parametrize("variant", ["defaults", "all-features", "namespaced"])
def test_every_chart_object_passes_the_api_servers_validation_and_pod_security(
    cluster: LocalCluster,
    restricted_namespace: str,
    goodput_crds: list[str],
    peering_crds: None,
    variant: str,
) -> None:
    namespace = restricted_namespace
    release = release_name(namespace)
    flags = {
        "defaults": [],
        # The health agent's objects go to the namespaces it serves: here, the test's own.
        "all-features": [
            "-f",
            str(CHART / "ci" / "all-features-values.yaml"),
            "--set",
            f"agent.namespaces[0]={namespace}",
        ],
        "namespaced": ["--set", f"watchNamespaces[0]={namespace}", "--set", "prometheus.rules.enabled=true"],
    }[variant]
    objects = template(cluster, release, namespace, *flags)
    checked = [obj for obj in objects if obj["kind"] not in MONITORING_KINDS]

    result = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--dry-run=server", "--validate=strict",
        "--field-manager=goodput-chart-test", "-f", "-",
        input=yaml.safe_dump_all(checked), check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, f"the API server warned: {result.stderr}"
    for obj in checked:
        assert f"/{obj['metadata']['name']} serverside-applied (server dry run)" in result.stdout, obj["kind"]
    assert {obj["kind"] for obj in objects} - {obj["kind"] for obj in checked} <= MONITORING_KINDS


# --- install, upgrade, uninstall ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Installed:
    release: str
    namespace: str


@contextlib.contextmanager
def installed(cluster: LocalCluster, namespace: str, *flags: str) -> Iterator[Installed]:
    """The chart installed (taking over CRDs another test applied), uninstalled on the way out."""
    release = release_name(namespace)
    run_helm(
        cluster, "install", release, str(CHART), "--namespace", namespace, "--take-ownership",
        "--wait", "--timeout", "90s", *flags,
    )  # fmt: skip
    try:
        yield Installed(release, namespace)
    finally:
        run_helm(
            cluster, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s", check=False
        )


def release_objects(cluster: LocalCluster, release: str, namespace: str) -> set[tuple[str, str]]:
    selector = f"app.kubernetes.io/instance={release}"
    found: set[tuple[str, str]] = set()
    namespaced = (
        "deployments,replicasets,pods,serviceaccounts,services,roles,rolebindings,poddisruptionbudgets"
    )
    cluster_scoped = "clusterroles,clusterrolebindings,clusterkopfpeerings"
    for kinds, scope in ((namespaced, ["-n", namespace]), (cluster_scoped, [])):
        listing = get_json(cluster, kinds, "-l", selector, *scope) or {"items": []}
        found |= {(item["kind"], item["metadata"]["name"]) for item in listing["items"]}
    return found


def test_the_chart_installs_upgrades_and_uninstalls_leaving_only_the_crds(
    cluster: LocalCluster, restricted_namespace: str, goodput_crds: list[str]
) -> None:
    namespace = restricted_namespace
    release = release_name(namespace)
    fullname = f"{release}-goodput"

    with installed(cluster, namespace) as install:
        status = run_helm(cluster, "status", release, "--namespace", namespace).stdout
        assert "STATUS: deployed" in status
        assert "kubectl -n NAMESPACE get mg" in status and "goodput explain mg/" in status, (
            "NOTES say what next"
        )
        objects = release_objects(cluster, release, namespace)
        for expected in [
            ("Deployment", fullname),
            ("ServiceAccount", fullname),
            ("Service", f"{fullname}-metrics"),
            ("ClusterRole", f"{fullname}-framework"),
            ("ClusterRole", f"{fullname}-controller"),
            ("ClusterRole", f"{fullname}-nodes"),
            ("ClusterRoleBinding", f"{fullname}-controller"),
            ("Role", f"{fullname}-leader-election"),
            ("RoleBinding", f"{fullname}-leader-election"),
            ("PodDisruptionBudget", fullname),
        ]:
            assert expected in objects, f"{expected} not created"
        assert not [kind for kind, _ in objects if kind == "ClusterKopfPeering"], "the Lease replaced peering"
        # The pods passed the restricted Pod Security admission (kwok then runs nothing in them).
        deployment = get_json(cluster, "deployment", fullname, "-n", namespace)
        assert deployment["status"]["availableReplicas"] == deployment["spec"]["replicas"] == 2
        for crd in goodput_crds:
            body = get_json(cluster, "crd", crd)
            assert body["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
            assert body["metadata"]["annotations"]["meta.helm.sh/release-name"] == install.release

        run_helm(
            cluster, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values",
            "--set", "logging.verbose=true", "--wait", "--timeout", "90s",
        )  # fmt: skip
        container = get_json(cluster, "deployment", fullname, "-n", namespace)["spec"]["template"]["spec"][
            "containers"
        ][0]
        assert {"name": "GOODPUT_VERBOSE", "value": "true"} in container["env"]

    wait_for(
        lambda: not release_objects(cluster, release, namespace),
        timeout_seconds=60,
        describe=lambda: f"the release's objects to go: {release_objects(cluster, release, namespace)}",
    )
    for crd in goodput_crds:
        assert get_json(cluster, "crd", crd) is not None, f"{crd} must survive the uninstall"


# --- the operator runs with the chart's permissions and nothing more ------------------------------------


def service_account_kubeconfig(
    cluster: LocalCluster, namespace: str, service_account: str, path: Path
) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, with a short-lived token."""
    token = cluster.kubectl(
        "create", "token", service_account, "-n", namespace, "--duration=15m"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "cluster", "cluster": server}],
                "users": [{"name": service_account, "user": {"token": token}}],
                "contexts": [
                    {"name": "operator", "context": {"cluster": "cluster", "user": service_account}}
                ],
                "current-context": "operator",
            }
        )
    )
    return path


def operator_environment(cluster: LocalCluster, install: Installed) -> dict[str, str]:
    """The environment the chart's Deployment gives the operator, with ports moved to free loopback ones."""
    deployment = get_json(cluster, "deployment", f"{install.release}-goodput", "-n", install.namespace)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] + container["args"] == ["goodput", "run"]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    liveness_port, metrics_port = free_ports(2)
    env["GOODPUT_LIVENESS_ENDPOINT"] = f"http://127.0.0.1:{liveness_port}/healthz"
    env["GOODPUT_METRICS_ADDRESS"] = "127.0.0.1"
    env["GOODPUT_METRICS_PORT"] = str(metrics_port)
    env["POD_ID"] = f"{install.release}-under-test"
    # The downward API's metadata.namespace, as the Deployment gives it.
    if env.get("GOODPUT_LEADER_ELECTION") == "true":
        env["GOODPUT_LEADER_ELECTION_NAMESPACE"] = install.namespace
    return env


@contextlib.contextmanager
def operator_process(
    env: Mapping[str, str], kubeconfig: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`goodput run` as its own process; stopped with SIGTERM (then SIGKILL) on the way out."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("GOODPUT_")}
    environment |= {**env, "KUBECONFIG": str(kubeconfig)}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "goodput.operator.cli", "run"],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def apply_samples(cluster: LocalCluster, namespace: str) -> None:
    for sample in ("slopolicy-batch.yaml", "slopolicy-interactive.yaml", "modelgroup-llama-70b-tp8-pp2.yaml"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLES / sample))


def condition(body: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    return next((item for item in conditions if item["type"] == kind), None)


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_the_operator_reconciles_a_sample_with_only_the_charts_permissions(
    cluster: LocalCluster,
    *,
    restricted_namespace: str,
    workload_namespace: str,
    goodput_crds: list[str],
    tmp_path: Path,
    mode: str,
) -> None:
    flags = ["--set", f"watchNamespaces[0]={workload_namespace}"] if mode == "namespaced" else []
    # As a platform team would: point the autoscaler at the Prometheus that scrapes the vLLM pods.
    flags += ["--set", f"prometheus.url={cluster.prometheus_url}"]
    with installed(cluster, restricted_namespace, *flags) as install:
        fullname = f"{install.release}-goodput"
        kubeconfig = service_account_kubeconfig(
            cluster, restricted_namespace, fullname, tmp_path / "kubeconfig"
        )
        env = operator_environment(cluster, install)
        log = tmp_path / "operator.log"
        apply_samples(cluster, workload_namespace)

        with operator_process(env, kubeconfig, log) as operator:

            def operator_output() -> str:
                return f"operator exit code {operator.poll()}, log:\n{log.read_text()[-4000:]}"

            def group_scheduled() -> bool:
                if operator.poll() is not None:
                    raise AssertionError(f"the operator exited: {operator_output()}")
                pods = get_json(
                    cluster, "pods", "-n", workload_namespace, "-l", "goodput.dev/model-group=llama-70b"
                )
                items = (pods or {}).get("items", [])
                return len(items) == 2 and all(pod["spec"].get("nodeName") for pod in items)

            # pods: create (gated), then patch (gates released together) -> the scheduler binds both ranks
            wait_for(
                group_scheduled,
                timeout_seconds=90,
                describe=lambda: f"the 70B group's two ranks to be scheduled; {operator_output()}",
            )
            # services: create (the group's headless Service for the leader address)
            assert get_json(cluster, "service", "llama-70b-g0", "-n", workload_namespace) is not None
            # slopolicies: watch, status patch
            for policy in ("batch", "interactive"):

                def accepted(policy: str = policy) -> bool:
                    body = get_json(cluster, "slopolicy", policy, "-n", workload_namespace)
                    return (condition(body, "Accepted") or {}).get("status") == "True"

                def waiting_for(policy: str = policy) -> str:
                    return f"SLOPolicy {policy} Accepted; {operator_output()}"

                wait_for(accepted, timeout_seconds=60, describe=waiting_for)
            # modelgroups: patch (kopf's finalizer), status patch (observedGeneration)
            model_group = wait_for(
                lambda: (
                    (mg := get_json(cluster, "modelgroup", "llama-70b", "-n", workload_namespace))
                    and mg.get("status", {}).get("observedGeneration") == mg["metadata"]["generation"]
                    and mg
                ),
                timeout_seconds=60,
                describe=lambda: f"ModelGroup status for the current generation; {operator_output()}",
            )
            assert "goodput.dev/finalizer" in model_group["metadata"]["finalizers"]
            # events: create
            events = get_json(
                cluster, "events", "-n", workload_namespace, "--field-selector", "reason=GroupCreated"
            )
            assert any(event.get("reportingComponent") == "goodput" for event in events["items"])
            # leases: the operator holds the chart's Lease in the release's namespace
            lease = get_json(cluster, "lease", fullname, "-n", install.namespace)
            holder = lease["spec"]["holderIdentity"]
            assert holder.startswith(env["POD_ID"] + "_"), f"the Lease is held by {holder}"
            with urllib.request.urlopen(env["GOODPUT_LIVENESS_ENDPOINT"], timeout=5) as health:
                assert health.status == 200

            # Deleting the ModelGroup: the operator removes its finalizer (modelgroups patch).
            cluster.kubectl("delete", "modelgroup", "llama-70b", "-n", workload_namespace, "--wait=false")
            wait_for(
                lambda: get_json(cluster, "modelgroup", "llama-70b", "-n", workload_namespace) is None,
                timeout_seconds=60,
                describe=lambda: f"the ModelGroup to be deleted; {operator_output()}",
            )

        # A cluster-wide operator also sees other tests' namespaces being deleted; the API server
        # refuses Events there ("being terminated"), which says nothing about the chart's RBAC.
        output = "\n".join(
            line for line in log.read_text().splitlines() if "because it is being terminated" not in line
        )
        refused = [
            line for line in output.splitlines() if "Forbidden" in line or " 403" in line or '"403' in line
        ]
        assert not refused, "the chart's RBAC refused the operator:\n" + "\n".join(refused[:10])
        # Warnings may come from the operator's own shutdown; an error would be a failed request.
        errors = [
            line
            for line in output.splitlines()
            if '"severity": "error"' in line or '"severity": "critical"' in line
        ]
        assert not errors, "the operator logged errors:\n" + "\n".join(errors[:10])


# --- the operator's image, as the chart deploys it ---------------------------------------------------

IMAGE_TAG = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def unpack_oci_archive(archive: Path, rootfs: Path) -> dict[str, Any]:
    """The image's root filesystem, layer by layer (whiteouts applied), and its config."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> bytes:
            member = outer.extractfile(f"blobs/{digest.replace(':', '/')}")
            assert member is not None, digest
            return member.read()

        index = json.loads(blob_of_path(outer, "index.json"))
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config: dict[str, Any] = json.loads(blob(manifest["config"]["digest"]))
        rootfs.mkdir(parents=True)
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as tar:
                members = []
                for member in tar.getmembers():
                    name = Path(member.name)
                    if name.name.startswith(".wh."):
                        target = rootfs / name.parent / name.name.removeprefix(".wh.")
                        if target.is_dir() and not target.is_symlink():
                            shutil.rmtree(target)
                        else:
                            target.unlink(missing_ok=True)
                        continue
                    if member.isdev():
                        continue  # the runtime provides /dev
                    members.append(member)
                tar.extractall(rootfs, members=members, filter="tar")
    return config


def blob_of_path(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    assert member is not None, name
    return member.read()


@pytest.fixture(scope="module")
def operator_rootfs(
    operator_image_archive: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """`make image`'s archive unpacked (e2e/conftest.py builds it, or waits for the session's build)."""
    rootfs = tmp_path_factory.mktemp("image") / "rootfs"
    return rootfs, unpack_oci_archive(operator_image_archive, rootfs)


@contextlib.contextmanager
def image_operator_process(
    rootfs: Path, config: Mapping[str, Any], env: Mapping[str, str], kubeconfig: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The image's entrypoint as the kubelet would start it: its own mount namespace, the image as a
    read-only root, a tmpfs at /tmp (the chart's emptyDir), the image's user, its environment plus
    the chart's."""
    image = config["config"]
    environment = dict(item.split("=", 1) for item in image.get("Env", []))
    environment |= {**env, "KUBECONFIG": "/tmp/kubeconfig"}
    user = image["User"]
    command = [*image["Entrypoint"], *image["Cmd"]]
    # Host tools prepare the mounts; inside the root, only the image's environment (env -i).
    script = (
        'set -e; root="$1"; kubeconfig="$2"; user="$3"; shift 3; mount --bind "$root" "$root"; '
        'mount -t tmpfs -o size=64m,mode=1777 tmpfs "$root/tmp"; mount -t proc proc "$root/proc"; '
        'cp "$kubeconfig" "$root/tmp/kubeconfig"; chmod 0444 "$root/tmp/kubeconfig"; '
        'mount -o remount,bind,ro "$root"; exec chroot --userspec="$user" "$root" "$@"'
    )
    inside = ["/usr/bin/env", "-i", *(f"{key}={value}" for key, value in environment.items()), *command]
    argv = ["unshare", "--mount", "--fork", "--", "sh", "-c", script, "sh", str(rootfs), str(kubeconfig)]
    argv += [user, *inside]
    with log.open("wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def self_contained(kubeconfig: Path) -> Path:
    """The kubeconfig with its CA inlined: inside the image's root the host's files do not exist."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        path = entry["cluster"].pop("certificate-authority", None)
        if path is not None:
            entry["cluster"]["certificate-authority-data"] = base64.b64encode(
                Path(path).read_bytes()
            ).decode()
    kubeconfig.write_text(yaml.safe_dump(config))
    return kubeconfig


# Its setup may wait for the image's build (minutes), on top of the story.
@pytest.mark.timeout(1800)
def test_the_operator_image_serves_a_model_group_with_the_charts_account_and_environment(
    cluster: LocalCluster,
    *,
    restricted_namespace: str,
    workload_namespace: str,
    goodput_crds: list[str],
    operator_rootfs: tuple[Path, dict[str, Any]],
    tmp_path: Path,
) -> None:
    rootfs, config = operator_rootfs
    assert config["config"]["User"] == "65532:65532", "the image runs as the chart's non-root user"
    with installed(
        cluster, restricted_namespace, "--set", f"prometheus.url={cluster.prometheus_url}"
    ) as install:
        fullname = f"{install.release}-goodput"
        deployment = get_json(cluster, "deployment", fullname, "-n", install.namespace)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == f"ghcr.io/goodput-dev/goodput:{IMAGE_TAG}", (
            "the chart deploys this image"
        )
        kubeconfig = self_contained(
            service_account_kubeconfig(cluster, restricted_namespace, fullname, tmp_path / "kubeconfig")
        )
        env = operator_environment(cluster, install)
        model_group = {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "ModelGroup",
            "metadata": {"name": "llama-8b", "namespace": workload_namespace},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                "parallelism": {"gpusPerPod": 1},
                "maxReplicas": 1,
                "readiness": {"warmup": {"maxTokens": 4, "timeoutSeconds": 10}},
            },
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(model_group))
        log = tmp_path / "operator.log"
        with (
            fake_leaders(cluster, tmp_path / "completions.jsonl"),
            image_operator_process(rootfs, config, env, kubeconfig, log) as operator,
        ):

            def ready() -> bool:
                if operator.poll() is not None:
                    raise AssertionError(
                        f"the operator exited {operator.returncode}:\n{log.read_text()[-4000:]}"
                    )
                body = get_json(cluster, "modelgroup", "llama-8b", "-n", workload_namespace) or {}
                return (condition(body, "Ready") or {}).get("status") == "True" and body["status"][
                    "replicas"
                ] == 1

            wait_for(
                ready,
                timeout_seconds=120,
                describe=lambda: (
                    f"the ModelGroup Ready from the image's operator; log:\n{log.read_text()[-4000:]}"
                ),
            )
            cluster.kubectl("delete", "modelgroup", "llama-8b", "-n", workload_namespace, "--wait=false")
            wait_for(
                lambda: get_json(cluster, "modelgroup", "llama-8b", "-n", workload_namespace) is None,
                timeout_seconds=60,
                describe="the ModelGroup finalized by the image's operator",
            )
        output = log.read_text()
        assert "Read-only file system" not in output, "the operator wrote to its read-only root"
        assert "Forbidden" not in output, "the chart's RBAC refused the image's operator"


# --- the alert rules in a real Prometheus -------------------------------------------------------------------


def prometheus_binary() -> Path:
    try:
        return ensure_binaries(build=False, progress=False) / "prometheus"
    except BinariesUnavailableError as error:
        pytest.fail(f"the Prometheus binary is needed to check the alert rules: {error}", pytrace=False)


class Exposition:
    """Operator and vLLM metrics for one situation, advancing on every scrape as a live system would.

    ModelGroup serving/llama wants 3 groups and has 1 ready and 1 draining; its leader answers 10%
    of first tokens after the 2.5 s threshold while token gaps stay fast, its KV cache is 95% full
    and requests are preempted; it still generates tokens. serving/mistral has a ready group that
    Prometheus holds no vLLM series for. Reconciles keep failing and groups keep being replaced.
    """

    def __init__(self) -> None:
        self.operator = OperatorMetrics()
        self.operator.set_group_counts("serving", "llama", 3, {"Ready": 1, "Draining": 1})
        self.operator.set_group_counts("serving", "mistral", 1, {"Ready": 1})
        self.operator.placement_limited.labels("InsufficientCapacity")  # present, never increased
        self.vllm = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "TTFT",
            labels,
            registry=self.vllm,
            buckets=TTFT_BUCKETS_SECONDS,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "ITL", labels, registry=self.vllm, buckets=ITL_BUCKETS_SECONDS
        )
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", labels, registry=self.vllm)
        self.generated = Counter("vllm:generation_tokens", "tokens", labels, registry=self.vllm)
        for name, value in (
            ("vllm:num_requests_running", 4),
            ("vllm:num_requests_waiting", 5),
            ("vllm:kv_cache_usage_perc", 0.95),
        ):
            Gauge(name, name, labels, registry=self.vllm).labels("llama", "0").set(value)
        self.lock = threading.Lock()

    def operator_text(self) -> bytes:
        with self.lock:
            self.operator.reconcile_errors.labels("modelgroup", "internal").inc()
            self.operator.group_failures.labels("NcclUnhealthy").inc()
            return generate_latest(self.operator.registry)

    def vllm_text(self) -> bytes:
        with self.lock:
            for _ in range(9):
                self.ttft.labels("llama", "0").observe(0.3)
            self.ttft.labels("llama", "0").observe(4.0)
            for _ in range(10):
                self.itl.labels("llama", "0").observe(0.04)
            self.preemptions.labels("llama", "0").inc()
            self.generated.labels("llama", "0").inc(100)
            return generate_latest(self.vllm)


@contextlib.contextmanager
def metrics_server(exposition: Exposition) -> Iterator[int]:
    routes: dict[str, Callable[[], bytes]] = {
        "/operator": exposition.operator_text,
        "/vllm": exposition.vllm_text,
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            render = routes.get(self.path)
            if render is None:
                self.send_error(404)
                return
            body = render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def prometheus_config(metrics_port: int, closed_port: int) -> dict[str, Any]:
    leader = {"namespace": "serving", "model_group": "llama", "rank": "0"}
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "manifests" / "observability" / "prometheus-rules.yaml")],
        "scrape_configs": [
            {
                # As the chart's ServiceMonitor scrapes the operator: job "goodput", its labels honoured.
                "job_name": "goodput",
                "honor_labels": True,
                "metrics_path": "/operator",
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
            },
            {
                # As the vLLM PodMonitor scrapes leaders, labels already mapped; one leader is unreachable.
                "job_name": "vllm",
                "metrics_path": "/vllm",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{metrics_port}"],
                        "labels": {**leader, "group": "g1", "pod": "llama-g1-0"},
                    },
                    {
                        "targets": [f"127.0.0.1:{closed_port}"],
                        "labels": {**leader, "group": "g2", "pod": "llama-g2-0"},
                    },
                ],
            },
        ],
    }


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        result: list[dict[str, Any]] = json.load(response)["data"]["result"]
        return result


EXPECTED_ALERTS = {
    ("GoodputTTFTAttainmentLow", "llama"),
    ("GoodputAttainmentLowScalingLimited", "llama"),
    ("GoodputGroupsBelowDesired", "llama"),
    ("GoodputKVCachePressure", "llama"),
    ("GoodputDrainStuck", "llama"),
    ("GoodputVLLMMetricsMissing", "mistral"),
    ("GoodputVLLMScrapeFailing", "llama"),
    ("GoodputReconcileErrors", ""),
    ("GoodputGroupsFailing", ""),
}


def test_the_alert_rules_load_and_raise_exactly_the_alerts_the_situation_calls_for(tmp_path: Path) -> None:
    prometheus = prometheus_binary()
    port, closed_port = free_ports(2)
    exposition = Exposition()
    with metrics_server(exposition) as metrics_port:
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(metrics_port, closed_port)))
        log = tmp_path / "prometheus.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [
                    str(prometheus), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
                ],
                stdout=output, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                base = f"http://127.0.0.1:{port}"

                def loaded() -> list[dict[str, Any]] | None:
                    if process.poll() is not None:
                        raise AssertionError(f"Prometheus refused the rules:\n{log.read_text()[-3000:]}")
                    try:
                        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=2) as response:
                            groups: list[dict[str, Any]] = json.load(response)["data"]["groups"]
                            return groups
                    except OSError:
                        return None

                groups = wait_for(loaded, timeout_seconds=60, describe="Prometheus to serve its rules") or []
                shipped = yaml.safe_load(
                    (ROOT / "manifests" / "observability" / "prometheus-rules.yaml").read_text()
                )
                assert {group["name"]: len(group["rules"]) for group in groups} == {
                    group["name"]: len(group["rules"]) for group in shipped["groups"]
                }

                def active_alerts() -> set[tuple[str, str]]:
                    series = query(base, "ALERTS")
                    return {
                        (
                            s["metric"]["alertname"],
                            s["metric"].get("model_group") or s["metric"].get("modelgroup", ""),
                        )
                        for s in series
                    }

                wait_for(
                    lambda: active_alerts() == EXPECTED_ALERTS,
                    timeout_seconds=60,
                    describe=lambda: f"alerts {sorted(EXPECTED_ALERTS)}; active {sorted(active_alerts())}",
                )
                # Every rule evaluated without error against real series (joins, label_replace, le strings).
                with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=5) as response:
                    for group in json.load(response)["data"]["groups"]:
                        for rule in group["rules"]:
                            assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
                attainment = query(
                    base, 'namespace_model_group:vllm_ttft_attainment:ratio_rate10m{model_group="llama"}'
                )
                assert float(attainment[0]["value"][1]) == pytest.approx(0.9, abs=1e-9)
                time.sleep(3)
                assert active_alerts() == EXPECTED_ALERTS, "no further alert fires as the data accumulates"
            finally:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
