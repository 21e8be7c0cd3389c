"""A platform team runs models as ModelGroups: complete TP×PP groups, gang-placed, ready only when whole.

Each story runs the operator (`goodput run --standalone`) against the session cluster, in the test's
namespace, on a GPU pool of its own (fake nodes labelled for the test, selected by the ModelGroup's
node selector), so stories never compete for GPUs. The test plays the two parts the operator talks
to: the in-pod health agent (it reports NCCL health and the loaded model revision on each rank) and
the vLLM leader (a small HTTP server in the pod network answering the warm-up completion on every
leader's pod IP).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import FakeLeaders, OperatorProcess, fake_leaders, health_agent

pytestmark = pytest.mark.e2e

POOL_LABEL = "e2e.goodput.dev/pool"
CLIQUE = "nvidia.com/gpu.clique"
LABEL_MODEL_GROUP = "goodput.dev/model-group"


@contextlib.contextmanager
def gpu_pool(
    cluster: LocalCluster, namespace: str, cliques: int, nodes_per_clique: int = 2
) -> Iterator[list[str]]:
    """Fake 8-GPU nodes for this test only: `cliques` NVLink domains over two zones."""
    names = []
    try:
        for clique in range(cliques):
            for index in range(nodes_per_clique):
                node = cluster.add_gpu_node(
                    f"{namespace}-c{clique}-{index}",
                    zone=f"{namespace}-z{clique % 2}",
                    clique=f"{namespace}-c{clique}",
                    labels={POOL_LABEL: namespace},
                )
                names.append(node.name)
        yield names
    finally:
        for name in names:
            cluster.remove_node(name)


# Reading the cluster.


def pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_MODEL_GROUP}")
    return list(answer["items"]) if answer else []


def live_pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    return [pod for pod in pods(cluster, namespace) if not pod["metadata"].get("deletionTimestamp")]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def condition_true(obj: dict[str, Any], kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found["status"] == "True"


def model_group(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.api.get(
        f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/{name}"
    )
    return found


def status(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(model_group(cluster, namespace, name).get("status") or {})


def events(cluster: LocalCluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector=reason%3D{reason}")
    return list(answer["items"]) if answer else []


def node_clique(cluster: LocalCluster, node: str) -> str:
    return str(cluster.api.get(f"/api/v1/nodes/{node}")["metadata"]["labels"][CLIQUE])


def groups_of(pod_list: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for pod in pod_list:
        grouped.setdefault(pod["metadata"]["labels"]["goodput.dev/group"], []).append(pod)
    return grouped


def llama_70b(name: str, namespace: str, *, replicas: int, max_replicas: int = 4, **spec: Any) -> str:
    """A 70B-style ModelGroup: TP8 x PP2, two 8-GPU pods per group, on this test's GPU pool."""
    body: dict[str, Any] = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "revision": "main"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "parallelism": {"tensor": 8, "pipeline": 2, "gpusPerPod": 8},
            # Required: these stories are about a group held whole inside one NVLink domain.
            "placement": {
                "mode": "Required",
                "nodeSelector": [{"key": POOL_LABEL, "value": namespace}],
                "scheduleTimeoutSeconds": 60,
            },
            "replicas": replicas,
            "maxReplicas": max_replicas,
            # These stories run the (simulated) health agent, so they ask for its checks.
            "readiness": {
                "ncclCheck": "Required",
                "revisionCheck": True,
                "warmup": {"prompt": "The capital of France is", "maxTokens": 4, "timeoutSeconds": 5},
            },
            "drain": {"minLifetimeSeconds": 0},
            **spec,
        },
    }
    return yaml.safe_dump(body)


def wait_ready_groups(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    count: int,
    *,
    operator: OperatorProcess,
    timeout_seconds: float = 90,
) -> dict[str, Any]:
    def ready() -> dict[str, Any]:
        current = status(cluster, namespace, name)
        return current if current.get("readyGroups") == count else {}

    found: dict[str, Any] = wait_for(
        ready,
        timeout_seconds=timeout_seconds,
        describe=lambda: (
            f"{count} ready groups; status {status(cluster, namespace, name)}\n"
            f"operator log:\n{operator.log_tail()}"
        ),
    )
    return found


# The stories.


def test_a_70b_model_group_serves_only_complete_healthy_warm_groups(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    with gpu_pool(cluster, namespace, cliques=2):
        cluster.kubectl("apply", "-f", "-", input=llama_70b("llama", namespace, replicas=2))

        # Every rank starts, but with no NCCL health reported nothing counts as capacity.
        wait_for(
            lambda: (
                len([p for p in live_pods(cluster, namespace) if condition_true(p, "ContainersReady")]) == 4
            ),
            timeout_seconds=60,
            describe=lambda: f"4 running ranks\n{operator.log_tail()}",
        )
        current = status(cluster, namespace, "llama")
        assert (current["readyGroups"], current["replicas"]) == (0, 0)
        assert all(not condition_true(p, "goodput.dev/group-ready") for p in live_pods(cluster, namespace))

        # Each group is whole inside one NVLink domain, and the two groups use different domains.
        grouped = groups_of(live_pods(cluster, namespace))
        cliques = {
            group: {node_clique(cluster, p["spec"]["nodeName"]) for p in members}
            for group, members in grouped.items()
        }
        assert sorted(len(members) for members in grouped.values()) == [2, 2]
        assert all(len(domains) == 1 for domains in cliques.values()), cliques
        assert len(set.union(*cliques.values())) == 2, cliques

        with health_agent(cluster, namespace):
            # NCCL healthy and revision reported, but the leaders do not answer yet: still not ready.
            wait_for(
                lambda: all(
                    condition_true(p, "goodput.dev/NCCLHealthy") for p in live_pods(cluster, namespace)
                ),
                timeout_seconds=30,
                describe="NCCL health on every rank",
            )
            wait_for(
                lambda: any(
                    "warm-up through the leader failed" in (g.get("message") or "")
                    for g in status(cluster, namespace, "llama").get("groups", [])
                ),
                timeout_seconds=30,
                describe=lambda: f"a failed warm-up\n{operator.log_tail()}",
            )
            assert status(cluster, namespace, "llama")["readyGroups"] == 0

            with fake_leaders(cluster, tmp_path / "completions.jsonl") as leaders:
                final = wait_ready_groups(cluster, namespace, "llama", 2, operator=operator)

        leader_ips = {
            p["status"]["podIP"]
            for p in live_pods(cluster, namespace)
            if p["metadata"]["labels"]["goodput.dev/rank"] == "0"
        }
        warmed = {w["ip"] for w in leaders.completions() if w["path"] == "/v1/completions"}
        assert leader_ips <= warmed
        assert all(w["request"]["prompt"] == "The capital of France is" for w in leaders.completions())
        assert all(condition_true(p, "Ready") for p in live_pods(cluster, namespace))
        assert final["replicas"] == 2 and condition_true({"status": final}, "Ready")
        for group in final["groups"]:
            assert group["state"] == "Ready"
            assert group["readyTime"]["totalSeconds"] >= group["readyTime"]["warmingSeconds"] > 0
            # The same time in finer phases, in order; the known ones add up to the whole.
            phases = group["readyTime"]["phases"]
            assert [p["phase"] for p in phases] == [
                "Scheduling",
                "ContainerStart",
                "WeightLoad",
                "RankFormation",
                "WarmUp",
            ]
            known = sum(p["seconds"] for p in phases if "seconds" in p)
            assert abs(known - group["readyTime"]["totalSeconds"]) <= 0.1 * len(phases)
        # Both groups recorded once, with the distribution the autoscaler looks ahead by.
        ready_time = final["readyTime"]
        assert ready_time["samples"] == 2
        assert sorted(s["group"] for s in ready_time["recent"]) == sorted(g["name"] for g in final["groups"])
        assert ready_time["p90Seconds"] >= ready_time["p50Seconds"] > 0
        assert "stalled" not in ready_time or ready_time["stalled"] == []
        table = cluster.kubectl("get", "mg", "llama", "-n", namespace).stdout.splitlines()
        assert table[0].split()[:3] == ["NAME", "DESIRED", "READY"]
        assert table[1].split()[:3] == ["llama", "2", "2"]
        assert events(cluster, namespace, "GroupReady")
        # A ModelGroup without roles is one pool, `serving`: its ranks carry it, and its entry in
        # `status.pools` is the ModelGroup's own count and selector.
        pools = {p["metadata"]["labels"]["goodput.dev/pool"] for p in live_pods(cluster, namespace)}
        assert pools == {"serving"}
        (pool,) = final["pools"]
        assert (pool["name"], pool["desiredGroups"], pool["readyGroups"]) == ("serving", 2, 2)
        assert pool["labelSelector"] == final["labelSelector"]
        assert {group["pool"] for group in final["groups"]} == {"serving"}


def test_scaling_past_free_gpus_places_only_whole_groups_and_says_why(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, leaders: FakeLeaders
) -> None:
    with gpu_pool(cluster, namespace, cliques=4) as nodes, health_agent(cluster, namespace):
        # Another workload holds 8 GPUs in the fourth domain: room for 3 groups, not 4.
        blocker = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "blocker", "namespace": namespace},
            "spec": {
                "nodeName": nodes[-1],
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(blocker))
        cluster.kubectl("apply", "-f", "-", input=llama_70b("llama", namespace, replicas=1))
        wait_ready_groups(cluster, namespace, "llama", 1, operator=operator)

        cluster.kubectl("scale", "mg", "llama", "-n", namespace, "--replicas=4")
        final = wait_ready_groups(cluster, namespace, "llama", 3, operator=operator)

        limited = condition({"status": final}, "ScalingLimited")
        assert limited is not None and limited["status"] == "True"
        assert limited["reason"] == "InsufficientGPUs"
        assert "needs 16 GPUs" in limited["message"] and f"{namespace}-c3=8" in limited["message"]
        assert final["desiredGroups"] == 4 and final["replicas"] == 3
        # No fourth group was started: no pod of it holds (or waits for) GPUs.
        grouped = groups_of(pods(cluster, namespace))
        assert len(grouped) == 3 and all(len(members) == 2 for members in grouped.values())
        assert sorted(grouped) == sorted(g["name"] for g in final["groups"])


def test_a_failed_rank_takes_its_group_out_at_once_and_a_whole_replacement_comes(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, leaders: FakeLeaders
) -> None:
    with gpu_pool(cluster, namespace, cliques=2), health_agent(cluster, namespace):
        cluster.kubectl("apply", "-f", "-", input=llama_70b("llama", namespace, replicas=1))
        first = wait_ready_groups(cluster, namespace, "llama", 1, operator=operator)
        (failed,) = (g["name"] for g in first["groups"])
        survivor = f"llama-{failed}-0"

        cluster.kubectl(
            "annotate", "pod", f"llama-{failed}-1", "-n", namespace, "sim.goodput.dev/fail=container-crash"
        )

        def out_of_service() -> bool:
            current = status(cluster, namespace, "llama")
            leader = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{survivor}")
            # The healthy rank leaves the Service too: its gate goes False, or it is already going away.
            leader_out = (
                leader is None
                or leader["metadata"].get("deletionTimestamp") is not None
                or not condition_true(leader, "goodput.dev/group-ready")
            )
            return current["readyGroups"] == 0 and leader_out

        wait_for(
            out_of_service,
            timeout_seconds=15,
            describe=lambda: f"group {failed} out of service\n{operator.log_tail()}",
        )
        degraded = condition(model_group(cluster, namespace, "llama"), "Degraded")
        assert degraded is not None and degraded["status"] == "True"

        final = wait_ready_groups(cluster, namespace, "llama", 1, operator=operator)
        (replacement,) = final["groups"]
        assert replacement["name"] != failed and len(replacement["pods"]) == 2
        grouped = groups_of(live_pods(cluster, namespace))
        assert list(grouped) == [replacement["name"]]
        assert all(
            p["metadata"]["annotations"]["goodput.dev/replaces"] == failed
            for p in grouped[replacement["name"]]
        )
        assert any(failed in e["message"] for e in events(cluster, namespace, "GroupFailed"))
        wait_for(
            lambda: condition_true({"status": status(cluster, namespace, "llama")}, "Degraded") is False,
            timeout_seconds=10,
            describe="Degraded cleared once the replacement serves",
        )


def test_restarting_the_operator_during_a_scale_out_leaves_no_duplicate_or_orphan(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, leaders: FakeLeaders
) -> None:
    with gpu_pool(cluster, namespace, cliques=3), health_agent(cluster, namespace):
        cluster.kubectl("apply", "-f", "-", input=llama_70b("llama", namespace, replicas=1))
        wait_ready_groups(cluster, namespace, "llama", 1, operator=operator)

        cluster.kubectl("scale", "mg", "llama", "-n", namespace, "--replicas=3")
        # Kill the operator as soon as the scale-out has started creating pods.
        wait_for(
            lambda: len(pods(cluster, namespace)) > 2,
            timeout_seconds=20,
            interval_seconds=0.02,
            describe="the scale-out's first pod",
        )
        operator.stop(kill=True)
        operator.start()

        final = wait_ready_groups(cluster, namespace, "llama", 3, operator=operator)
        wait_for(
            lambda: len(pods(cluster, namespace)) == 6,
            timeout_seconds=30,
            describe=lambda: (
                f"only the 3 groups' pods left: {[p['metadata']['name'] for p in pods(cluster, namespace)]}"
            ),
        )
        grouped = groups_of(pods(cluster, namespace))
        assert sorted(grouped) == sorted(g["name"] for g in final["groups"])
        assert all(
            sorted(p["metadata"]["labels"]["goodput.dev/rank"] for p in members) == ["0", "1"]
            for members in grouped.values()
        )


def test_deleting_a_model_group_removes_every_pod(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    with gpu_pool(cluster, namespace, cliques=2):
        cluster.kubectl("apply", "-f", "-", input=llama_70b("llama", namespace, replicas=2))
        wait_for(lambda: len(pods(cluster, namespace)) == 4, timeout_seconds=30, describe="4 pods")

        cluster.kubectl("delete", "mg", "llama", "-n", namespace, "--wait=true", "--timeout=60s")

        wait_for(
            lambda: not pods(cluster, namespace),
            timeout_seconds=60,
            describe=lambda: f"no pod left: {[p['metadata']['name'] for p in pods(cluster, namespace)]}",
        )
        services = cluster.api.get(
            f"/api/v1/namespaces/{namespace}/services?labelSelector={LABEL_MODEL_GROUP}"
        )
        wait_for(
            lambda: (
                not cluster.api.get(
                    f"/api/v1/namespaces/{namespace}/services?labelSelector={LABEL_MODEL_GROUP}"
                )["items"]
            ),
            timeout_seconds=30,
            describe=f"no group Service left: {services}",
        )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"engine": {"image": "Not A Valid Image"}}, "spec.engine.image"),
        ({"parallelism": {"tensor": 16, "pipeline": 1, "gpusPerPod": 16}}, "spec.parallelism"),
    ],
    ids=["an image no runtime could pull", "a pod larger than any node"],
)
def test_a_spec_the_controller_cannot_act_on_is_reported_and_nothing_is_created(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, change: dict[str, Any], problem: str
) -> None:
    with gpu_pool(cluster, namespace, cliques=1):
        cluster.kubectl("apply", "-f", "-", input=llama_70b("llama", namespace, replicas=1, **change))

        def invalid() -> dict[str, Any]:
            ready = condition(model_group(cluster, namespace, "llama"), "Ready")
            return ready if ready is not None and ready["reason"] == "InvalidSpec" else {}

        ready = wait_for(invalid, timeout_seconds=30, describe=lambda: f"InvalidSpec\n{operator.log_tail()}")
        assert ready["status"] == "False" and problem in ready["message"]
        invalid_events = wait_for(
            lambda: events(cluster, namespace, "InvalidSpec"),
            timeout_seconds=15,
            describe="an InvalidSpec Event",
        )
        assert problem in invalid_events[0]["message"]
        # Several reconcile passes later, still nothing was created.
        wait_for(
            lambda: status(cluster, namespace, "llama").get("observedGeneration") == 1,
            timeout_seconds=10,
            describe="the spec observed",
        )
        with contextlib.suppress(AssertionError):
            wait_for(lambda: pods(cluster, namespace), timeout_seconds=3)
        assert pods(cluster, namespace) == []
