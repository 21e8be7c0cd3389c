"""Least privilege, proven on a real API server: what each ServiceAccount of the chart may do, what
an engine pod holds, and that the chart's NetworkPolicies are valid objects.

The permissions are read as a platform team's review would read them, from the API server itself:
`kubectl auth can-i --list --as=system:serviceaccount:<ns>:<sa>` after `helm install`, in the
namespace each account serves and in one it does not serve (what it holds cluster-wide). What every
authenticated client may do (discovery, self reviews) is measured on an account with no binding and
set aside; the rest must equal a reviewed table, row for row, and obey rules that hold whatever the
table says: no Secrets, no wildcard, no escalate, bind or impersonate, and writes only where the
operator owns the objects. Granting one rule more to a chart's role makes both checks fail; the
last test shows it on the live cluster.

The engine pods are created by the operator itself (a process here, with only the chart's token, as
in test_chart_install.py), and must hold no ServiceAccount token but in the health agent's container.

No network plugin runs here, so the API server validates and stores the NetworkPolicies and nothing
enforces them; tests/test_chart_security.py checks what they allow.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart_install import (
    Installed,
    get_json,
    installed,
    operator_environment,
    operator_process,
    restricted_namespace,  # noqa: F401 (a fixture, used by name)
    scratch_namespace,
    service_account_kubeconfig,
    workload_namespace,  # noqa: F401 (a fixture, used by name)
)

from goodput.controllers.groups import agent_sidecar
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for

# (resource as kubectl prints it, e.g. "pods", "modelgroups.goodput.dev/status"; resource name or "";
# verb). A non-resource URL is ("", url, verb).
Grant = tuple[str, str, str]

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
NEVER_VERBS = frozenset({"escalate", "bind", "impersonate"})
# Where the operator may write, and why: its own kinds (kopf's finalizer and annotations, status,
# scale), the pods and Services of its groups, Events, and its leader election Lease (in the release's
# namespace only; kopf's peering object instead when a platform chooses peering). RBAC cannot say
# "only the pods it owns"; the owner references and the group labels say it, and the API server's
# admission is the place to narrow it further.
OPERATOR_WRITES = frozenset(
    {
        "modelgroups.goodput.dev",
        "slopolicies.goodput.dev",
        "modelgroups.goodput.dev/status",
        "slopolicies.goodput.dev/status",
        "modelgroups.goodput.dev/scale",
        "modelgroups.goodput.dev/finalizers",
        "pods",
        "pods/status",
        "services",
        "resourceclaimtemplates.resource.k8s.io",
        "events",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
        "leases.coordination.k8s.io",
    }
)
AGENT_WRITES = frozenset({"pods", "pods/status"})


def expand(resources: Iterable[str], verbs: Iterable[str], name: str = "") -> set[Grant]:
    return {(resource, name, verb) for resource in resources for verb in verbs}


NODES_TABLE = expand(["nodes"], ["get", "list", "watch"]) | expand(
    ["resourceslices.resource.k8s.io", "deviceclasses.resource.k8s.io"], ["get", "list", "watch"]
)


def operator_table() -> set[Grant]:
    """What the operator needs where it serves, reviewed: the chart's _rbac.tpl says why each."""
    return (
        expand(["events"], ["create"])
        | expand(["modelgroups.goodput.dev", "slopolicies.goodput.dev"], ["get", "list", "watch", "patch"])
        | expand(["modelgroups.goodput.dev/status", "slopolicies.goodput.dev/status"], ["patch"])
        | expand(["modelgroups.goodput.dev/scale"], ["get", "patch", "update"])
        | expand(["modelgroups.goodput.dev/finalizers"], ["update"])
        | expand(["pods"], ["list", "watch", "create", "patch", "delete"])
        | expand(["pods/status"], ["patch"])
        | expand(["services"], ["create", "delete"])
        | expand(["endpointslices.discovery.k8s.io"], ["get", "list", "watch"])
        | expand(["resourceclaimtemplates.resource.k8s.io"], ["create"])
        | expand(["resourceclaims.resource.k8s.io"], ["list", "watch"])
        | expand(["configmaps"], ["get"])
        | NODES_TABLE
    )


def lease_table(lease: str) -> set[Grant]:
    """In the release's namespace only: the leader election Lease, created once (RBAC cannot name
    an object before it exists), then read and renewed by its name."""
    return expand(["leases.coordination.k8s.io"], ["create"]) | expand(
        ["leases.coordination.k8s.io"], ["get", "update"], name=lease
    )


AGENT_TABLE = expand(["pods"], ["get", "patch"]) | expand(["pods/status"], ["patch"])
# The gateway watches its ModelGroup and the namespace's SLOPolicies, so a policy change applies
# without a restart.
GATEWAY_TABLE = expand(["pods"], ["list", "watch"]) | expand(
    ["modelgroups.goodput.dev", "slopolicies.goodput.dev"], ["get", "list", "watch"]
)

ROW = re.compile(r"^(\S*)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$")


def parse_can_i_list(output: str) -> set[Grant]:
    """`kubectl auth can-i --list`'s table (Resources, Non-Resource URLs, Resource Names, Verbs),
    one grant per resource or URL, name and verb."""
    lines = output.strip().splitlines()
    assert lines and lines[0].split()[:2] == ["Resources", "Non-Resource"], output
    found: set[Grant] = set()
    for line in lines[1:]:
        match = ROW.match(line)
        assert match is not None, f"unreadable row {line!r}"
        resource, urls, names, verbs = match.groups()
        for verb in verbs.split():
            found |= {("", url, verb) for url in urls.split()}
            if resource:
                found |= {(resource, name, verb) for name in (names.split() or [""])}
    return found


def can_i_list(cluster: LocalCluster, account: str, namespace: str) -> set[Grant]:
    user = f"system:serviceaccount:{account}"
    listing = cluster.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace).stdout
    return parse_can_i_list(listing)


def violations(grants: Iterable[Grant], writable: frozenset[str]) -> list[str]:
    """The rules that hold whatever the reviewed table says."""
    found = []
    for resource, name, verb in sorted(grants):
        grant = f"{verb} {resource or name}{f' [{name}]' if resource and name else ''}"
        if "*" in (resource, verb) or (not resource and name.endswith("*") and verb != "get"):
            found.append(f"wildcard: {grant}")
        if resource.split("/")[0] == "secrets":
            found.append(f"Secrets: {grant}")
        if verb in NEVER_VERBS:
            found.append(f"privilege escalation: {grant}")
        if resource and verb in WRITE_VERBS and resource not in writable:
            found.append(f"write outside what it owns: {grant}")
    return found


@dataclass(frozen=True, slots=True)
class Review:
    """One account's permissions in one namespace, less what every authenticated client has."""

    account: str
    namespace: str
    grants: frozenset[Grant]


def review(cluster: LocalCluster, account: str, namespace: str, baseline: set[Grant]) -> Review:
    return Review(account, namespace, frozenset(can_i_list(cluster, account, namespace) - baseline))


def baseline_of(cluster: LocalCluster, namespace: str) -> set[Grant]:
    """An account with no binding: discovery, version, self reviews. Nothing of it may be a write
    outside the self reviews, or the subtraction would hide a privilege."""
    grants = can_i_list(cluster, f"{namespace}:default", namespace)
    assert {resource for resource, _, verb in grants if resource and verb in WRITE_VERBS} <= {
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
        "selfsubjectreviews.authentication.k8s.io",
    }, grants
    return grants


def assert_reviewed(found: Review, table: set[Grant], writable: frozenset[str]) -> None:
    where = f"{found.account} in {found.namespace}"
    assert not violations(found.grants, writable), f"{where}: {violations(found.grants, writable)}"
    assert found.grants == table, (
        f"{where} differs from the reviewed table: more {sorted(found.grants - table)}, "
        f"less {sorted(table - found.grants)}"
    )


# --- the tests -----------------------------------------------------------------------------------------


@pytest.fixture
def elsewhere(cluster: LocalCluster) -> Iterator[str]:
    """A namespace the chart serves nothing in: what an account may do there, it may do everywhere."""
    with scratch_namespace(cluster, "e2e-elsewhere") as name:
        yield name


def operator_account(install: Installed) -> str:
    return f"{install.namespace}:{install.release}-goodput"


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_the_default_install_grants_the_operator_exactly_the_reviewed_table(
    cluster: LocalCluster,
    *,
    restricted_namespace: str,  # noqa: F811
    workload_namespace: str,  # noqa: F811
    elsewhere: str,
    goodput_crds: list[str],
    mode: str,
) -> None:
    """Cluster-wide (the defaults) the operator holds its table in every namespace; with
    watchNamespaces, in those only, and elsewhere nothing but reading nodes."""
    flags = ["--set", f"watchNamespaces[0]={workload_namespace}"] if mode == "namespaced" else []
    with installed(cluster, restricted_namespace, *flags) as install:
        lease = lease_table(f"{install.release}-goodput")
        served = operator_table()
        if mode == "namespaced":
            expected = {
                workload_namespace: served,
                elsewhere: NODES_TABLE,
                restricted_namespace: NODES_TABLE | lease,
            }
        else:
            expected = dict.fromkeys((workload_namespace, elsewhere), served)
            expected[restricted_namespace] = served | lease
        for namespace, table in expected.items():
            baseline = baseline_of(cluster, namespace)
            found = review(cluster, operator_account(install), namespace, baseline)
            assert_reviewed(found, table, OPERATOR_WRITES)
        # No token for anything else: the chart's ServiceAccount is not automounted.
        account = get_json(cluster, "serviceaccount", f"{install.release}-goodput", "-n", install.namespace)
        assert account["automountServiceAccountToken"] is False


def agent_and_gateway_flags(workload: str) -> list[str]:
    return [
        "--set", "agent.enabled=true", "--set", f"agent.namespaces[0]={workload}",
        "--set", "gateway.enabled=true", "--set", "gateway.modelGroup=llama-pp2",
        "--set", f"gateway.namespace={workload}", "--set", "networkPolicy.engines.enabled=true",
    ]  # fmt: skip


def nccl_model_group(namespace: str) -> dict[str, Any]:
    """Two ranks per group that ask for the NCCL check, so the operator injects the health agent."""
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": "llama-pp2", "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "parallelism": {"tensor": 1, "pipeline": 2, "gpusPerPod": 1},
            "maxReplicas": 1,
            "readiness": {"ncclCheck": "Required"},
        },
    }


def test_with_the_agent_and_the_gateway_each_account_holds_its_reviewed_table_and_no_more(
    cluster: LocalCluster,
    *,
    restricted_namespace: str,  # noqa: F811
    workload_namespace: str,  # noqa: F811
    elsewhere: str,
    goodput_crds: list[str],
    tmp_path: Path,
) -> None:
    with installed(cluster, restricted_namespace, *agent_and_gateway_flags(workload_namespace)) as install:
        gateway = f"{install.namespace}:{install.release}-goodput-gateway"
        agent = f"{workload_namespace}:{agent_sidecar.SERVICE_ACCOUNT}"
        expected = {
            # The operator is cluster-wide: the same everywhere.
            (operator_account(install), workload_namespace): operator_table(),
            (operator_account(install), elsewhere): operator_table(),
            (operator_account(install), install.namespace): operator_table()
            | lease_table(f"{install.release}-goodput"),
            # The agent: its own pod, in the namespace it runs in, and nothing anywhere else.
            (agent, workload_namespace): AGENT_TABLE,
            (agent, elsewhere): set(),
            # The gateway reads its ModelGroup's namespace only, and writes nothing.
            (gateway, workload_namespace): GATEWAY_TABLE,
            (gateway, install.namespace): set(),
            (gateway, elsewhere): set(),
        }
        writable = {agent: AGENT_WRITES, gateway: frozenset()}
        baselines = {ns: baseline_of(cluster, ns) for ns in {ns for _, ns in expected}}
        for (account, namespace), table in expected.items():
            found = review(cluster, account, namespace, baselines[namespace])
            assert_reviewed(found, table, writable.get(account, OPERATOR_WRITES))
        for name, namespace in ((gateway, install.namespace), (agent, workload_namespace)):
            body = get_json(cluster, "serviceaccount", name.split(":")[1], "-n", namespace)
            assert body["automountServiceAccountToken"] is False, name

        assert_the_agent_writes_only_its_own_pod(cluster, workload_namespace, tmp_path)

        # The NetworkPolicies were accepted (validated) by the API server.
        policies = {
            (item["metadata"]["namespace"], item["metadata"]["name"])
            for ns in (install.namespace, workload_namespace)
            for item in get_json(cluster, "networkpolicies", "-n", ns)["items"]
        }
        assert policies == {
            (install.namespace, f"{install.release}-goodput"),
            (install.namespace, f"{install.release}-goodput-gateway"),
            (workload_namespace, f"{install.release}-goodput-engines"),
        }


def test_the_operators_engine_pods_hold_no_token_but_in_the_agents_container(
    cluster: LocalCluster,
    *,
    restricted_namespace: str,  # noqa: F811
    workload_namespace: str,  # noqa: F811
    goodput_crds: list[str],
    tmp_path: Path,
) -> None:
    flags = ["--set", "agent.enabled=true", "--set", f"agent.namespaces[0]={workload_namespace}"]
    with installed(cluster, restricted_namespace, *flags) as install:
        kubeconfig = service_account_kubeconfig(
            cluster, install.namespace, f"{install.release}-goodput", tmp_path / "kubeconfig"
        )
        env = operator_environment(cluster, install)
        assert env["GOODPUT_AGENT_IMAGE"], "the chart tells the operator to inject the agent"
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(nccl_model_group(workload_namespace)))
        log = tmp_path / "operator.log"
        with operator_process(env, kubeconfig, log) as operator:

            def ranks() -> list[dict[str, Any]] | None:
                if operator.poll() is not None:
                    raise AssertionError(f"the operator exited:\n{log.read_text()[-4000:]}")
                selector = "goodput.dev/model-group=llama-pp2"
                items = (get_json(cluster, "pods", "-n", workload_namespace, "-l", selector) or {})["items"]
                return items if len(items) == 2 else None

            pods = wait_for(
                ranks,
                timeout_seconds=90,
                describe=lambda: f"the group's two ranks; {log.read_text()[-3000:]}",
            )
            for pod in pods or []:
                assert_token_only_in_the_agent(pod)
            cluster.kubectl("delete", "modelgroup", "llama-pp2", "-n", workload_namespace, "--wait=false")
            wait_for(
                lambda: get_json(cluster, "modelgroup", "llama-pp2", "-n", workload_namespace) is None,
                timeout_seconds=60,
                describe="the ModelGroup finalized",
            )


def assert_token_only_in_the_agent(pod: Mapping[str, Any]) -> None:
    """As the API server stored the pod (after its ServiceAccount admission, which would have added a
    kube-api-access volume to every container if the pod let it)."""
    spec = pod["spec"]
    name = pod["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False, name
    assert spec["serviceAccountName"] == agent_sidecar.SERVICE_ACCOUNT, name
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert not [v for v in volumes if v.startswith("kube-api-access")], f"{name}: an automounted token"
    assert not [v for v in volumes.values() if "secret" in v], f"{name}: a Secret volume"
    token_volumes = {
        volume_name
        for volume_name, volume in volumes.items()
        if any("serviceAccountToken" in source for source in volume.get("projected", {}).get("sources", []))
    }
    assert token_volumes == {agent_sidecar.TOKEN_VOLUME}, name
    mounts = {
        container["name"]: {mount["name"] for mount in container.get("volumeMounts", [])}
        for container in [*spec.get("initContainers", []), *spec["containers"]]
    }
    holders = sorted(container for container, names in mounts.items() if names & token_volumes)
    assert holders == [agent_sidecar.AGENT_CONTAINER_NAME], f"{name}: the token is mounted in {holders}"
    assert len(mounts) == 2, f"{name}: the engine and the agent, nothing else: {sorted(mounts)}"


def test_a_wider_role_fails_the_review(
    cluster: LocalCluster,
    *,
    restricted_namespace: str,  # noqa: F811
    elsewhere: str,
    goodput_crds: list[str],
) -> None:
    """The review is not a mirror of the chart: a rule added to the operator's role shows as an
    unreviewed grant and breaks the rules that hold whatever the table says."""
    with installed(cluster, restricted_namespace) as install:
        table = operator_table()
        baseline = baseline_of(cluster, elsewhere)
        extra = [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]},
        ]
        patch = [{"op": "add", "path": "/rules/-", "value": rule} for rule in extra]
        cluster.kubectl(
            "patch", "clusterrole", f"{install.release}-goodput-controller", "--type=json",
            "-p", yaml.safe_dump(patch, default_flow_style=True),
        )  # fmt: skip

        def wider() -> Review | None:
            found = review(cluster, operator_account(install), elsewhere, baseline)
            return found if found.grants != table else None

        found = wait_for(
            wider,
            timeout_seconds=30,
            describe="the API server to authorize the wider role",
        )
        assert found is not None
        assert found.grants - table == expand(["secrets"], ["get", "list", "watch"]) | expand(
            ["deployments.apps"], ["*"]
        )
        assert sorted(violations(found.grants, OPERATOR_WRITES)) == [
            "Secrets: get secrets",
            "Secrets: list secrets",
            "Secrets: watch secrets",
            "wildcard: * deployments.apps",
        ]
        with pytest.raises(AssertionError, match="secrets"):
            assert_reviewed(found, table, OPERATOR_WRITES)


def patch_as(cluster: LocalCluster, token: str, path: str, body: Mapping[str, Any]) -> tuple[int, str]:
    """A merge patch with the token alone, as the agent's client sends it (no read first)."""
    server = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
    context = ssl.create_default_context()
    if "certificate-authority" in server:
        context.load_verify_locations(cafile=server["certificate-authority"])
    else:
        context.load_verify_locations(cadata=base64.b64decode(server["certificate-authority-data"]).decode())
    request = urllib.request.Request(
        f"{server['server']}{path}",
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def assert_the_agent_writes_only_its_own_pod(cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    """RBAC lets the agent patch any pod of its namespace; the chart's admission policy narrows it to
    the pod its token is bound to, as the kubelet binds the projected token."""
    for name in ("rank-a", "rank-b"):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "serviceAccountName": agent_sidecar.SERVICE_ACCOUNT,
                "automountServiceAccountToken": False,
                "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.33.0"}],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    uid = get_json(cluster, "pod", "rank-a", "-n", namespace)["metadata"]["uid"]
    bound = cluster.kubectl(
        "create", "token", agent_sidecar.SERVICE_ACCOUNT, "-n", namespace, "--duration=10m",
        "--bound-object-kind=Pod", "--bound-object-name=rank-a", f"--bound-object-uid={uid}",
    ).stdout.strip()  # fmt: skip
    unbound = cluster.kubectl(
        "create", "token", agent_sidecar.SERVICE_ACCOUNT, "-n", namespace, "--duration=10m"
    ).stdout.strip()
    condition = {"status": {"conditions": [{"type": "goodput.dev/nccl-healthy", "status": "True"}]}}
    annotation = {"metadata": {"annotations": {"goodput.dev/model-revision": "abc"}}}

    def patch(token: str, pod: str, body: Mapping[str, Any], *subresource: str) -> tuple[int, str]:
        return patch_as(
            cluster, token, f"/api/v1/namespaces/{namespace}/pods/{pod}{''.join(subresource)}", body
        )

    refusal = "the health agent may write only the pod its token is bound to"
    for body, subresource in ((condition, ["/status"]), (annotation, [])):
        code, error = patch(bound, "rank-a", body, *subresource)
        assert code == 200, f"the agent refused its own pod: {error}"
    for other, body, subresource in (
        ("rank-b", condition, ["/status"]),
        ("rank-b", annotation, []),
    ):
        code, error = patch(bound, other, body, *subresource)
        assert code == 403 and refusal in error, error
    code, error = patch(unbound, "rank-a", condition, "/status")
    assert code == 403 and refusal in error, f"a token bound to no pod: {error}"
