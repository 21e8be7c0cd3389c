"""Pod rendering: the vLLM launch contract of single-pod and multi-pod groups, as manifests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from goodput.api.modelgroup import (
    EnvVar,
    EnvVarSource,
    NodeAffinity,
    PodOptions,
    Readiness,
    SecretKeySelector,
    SecurityContext,
    Toleration,
    VolumeMount,
    Warmup,
)
from goodput.controllers import naming
from goodput.controllers.groups.pods import GroupTemplate, render_group, vllm_args

LLAMA_8B = GroupTemplate(
    model_group="llama-8b",
    namespace="serving",
    uid="uid-8b",
    model="meta-llama/Llama-3.1-8B-Instruct",
    model_revision="main",
    served_name="llama-8b",
    image="vllm/vllm-openai:v0.33.0",
    args=("--enable-prefix-caching",),
    env=(("HF_HOME", "/models"),),
    requests=(("cpu", "8"), ("memory", "64Gi")),
    limits=(("memory", "64Gi"),),
    port=8000,
    startup_timeout_seconds=600,
    shutdown_timeout_seconds=30,
    tensor_parallel=1,
    pipeline_parallel=1,
    gpus_per_pod=1,
    topology_key="nvidia.com/gpu.clique",
    placement_mode="Required",
)
LLAMA_70B = replace(
    LLAMA_8B,
    model_group="llama-70b",
    uid="uid-70b",
    model="meta-llama/Llama-3.1-70B-Instruct",
    served_name=None,
    args=(),
    env=(("NCCL_SOCKET_IFNAME", "ib0"),),
    port=8080,
    startup_timeout_seconds=2400,
    shutdown_timeout_seconds=60,
    tensor_parallel=8,
    pipeline_parallel=2,
    gpus_per_pod=8,
    placement_mode="Preferred",
    tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
    node_selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),),
    max_num_seqs=512,
    max_num_batched_tokens=8192,
)


@dataclass(frozen=True)
class RenderCase:
    name: str
    template: GroupTemplate
    # expected
    pods: list[str]
    command_args: list[list[str]]
    service: str | None
    gpus: str
    env_interface: str


CASES = [
    RenderCase(
        name="8B TP1: one pod, no rendezvous",
        template=LLAMA_8B,
        pods=["llama-8b-g3-0"],
        command_args=[
            [
                "meta-llama/Llama-3.1-8B-Instruct",
                "--revision",
                "main",
                "--tensor-parallel-size",
                "1",
                "--pipeline-parallel-size",
                "1",
                "--shutdown-timeout",
                "30",
                "--port",
                "8000",
                "--served-model-name",
                "llama-8b",
                "--enable-prefix-caching",
            ]
        ],
        service=None,
        gpus="1",
        env_interface="eth0",
    ),
    RenderCase(
        name="70B TP8xPP2 on two 8-GPU pods: leader serves, follower headless",
        template=LLAMA_70B,
        pods=["llama-70b-g3-0", "llama-70b-g3-1"],
        command_args=[
            [
                "meta-llama/Llama-3.1-70B-Instruct",
                "--revision",
                "main",
                "--tensor-parallel-size",
                "8",
                "--pipeline-parallel-size",
                "2",
                "--shutdown-timeout",
                "60",
                "--max-num-seqs",
                "512",
                "--max-num-batched-tokens",
                "8192",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--master-addr",
                "llama-70b-g3.serving.svc",
                "--master-port",
                "29501",
                "--port",
                "8080",
            ],
            [
                "meta-llama/Llama-3.1-70B-Instruct",
                "--revision",
                "main",
                "--tensor-parallel-size",
                "8",
                "--pipeline-parallel-size",
                "2",
                "--shutdown-timeout",
                "60",
                "--max-num-seqs",
                "512",
                "--max-num-batched-tokens",
                "8192",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--master-addr",
                "llama-70b-g3.serving.svc",
                "--master-port",
                "29501",
                "--headless",
            ],
        ],
        service="llama-70b-g3",
        gpus="8",
        env_interface="ib0",
    ),
]


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in _container(pod)["env"]}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_group_manifests(case: RenderCase) -> None:
    manifests = render_group(case.template, "g3", "clique-a")

    assert [pod["metadata"]["name"] for pod in manifests.pods] == case.pods
    assert [_container(pod)["args"] for pod in manifests.pods] == case.command_args
    assert all(_container(pod)["command"] == ["vllm", "serve"] for pod in manifests.pods)
    assert (manifests.service["metadata"]["name"] if manifests.service else None) == case.service
    for rank, pod in enumerate(manifests.pods):
        labels = pod["metadata"]["labels"]
        assert labels[naming.LABEL_MODEL_GROUP] == case.template.model_group
        assert labels[naming.LABEL_GROUP] == "g3"
        assert labels[naming.LABEL_RANK] == str(rank)
        assert labels[naming.LABEL_REVISION] == case.template.revision
        resources = _container(pod)["resources"]
        assert resources["requests"][naming.GPU_RESOURCE] == case.gpus
        assert resources["limits"][naming.GPU_RESOURCE] == case.gpus
        env = _env(pod)
        assert env["VLLM_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["NCCL_SOCKET_IFNAME"] == case.env_interface
        assert env["GOODPUT_RANK"] == str(rank)
        assert sum(1 for item in _container(pod)["env"] if item["name"] == "NCCL_SOCKET_IFNAME") == 1


@pytest.mark.parametrize("template", [LLAMA_8B, LLAMA_70B], ids=["8B TP1", "70B TP8xPP2"])
def test_every_pod_is_gated_owned_and_waits_for_the_group(template: GroupTemplate) -> None:
    for pod in render_group(template, "g0", "clique-b").pods:
        spec = pod["spec"]
        assert spec["schedulingGates"] == [{"name": naming.SCHEDULING_GATE}]
        assert spec["readinessGates"] == [{"conditionType": naming.CONDITION_GROUP_READY}]
        owner = pod["metadata"]["ownerReferences"]
        assert owner == [
            {
                "apiVersion": "goodput.dev/v1alpha1",
                "kind": "ModelGroup",
                "name": template.model_group,
                "uid": template.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert pod["metadata"]["annotations"][naming.ANNOTATION_TOPOLOGY_DOMAIN] == "clique-b"
        assert spec["terminationGracePeriodSeconds"] > template.shutdown_timeout_seconds
        # Memory-backed /dev/shm, 2Gi per GPU of the pod unless the spec sizes it.
        shm = {"medium": "Memory", "sizeLimit": f"{2 * template.gpus_per_pod}Gi"}
        assert {"name": "dshm", "emptyDir": shm} in spec["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in _container(pod)["volumeMounts"]


def test_affinity_follows_the_placement_mode() -> None:
    required = render_group(LLAMA_8B, "g0", "clique-a").pods[0]["spec"]["affinity"]["nodeAffinity"]
    preferred = render_group(LLAMA_70B, "g0", "clique-a").pods[1]["spec"]["affinity"]["nodeAffinity"]
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "In", "values": ["clique-a"]}]}
    assert required == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    assert preferred == {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": term}]
    }


def test_a_node_without_the_topology_label_is_its_own_domain() -> None:
    pods = render_group(LLAMA_70B, "g0", naming.node_domain("gpu-node-7")).pods
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-7"]}]}
    for pod in pods:
        assert pod["spec"]["affinity"]["nodeAffinity"] == {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": term}]
        }
        assert pod["metadata"]["annotations"][naming.ANNOTATION_TOPOLOGY_DOMAIN] == "node/gpu-node-7"


def test_only_the_leader_is_probed_and_scraped() -> None:
    leader, follower = render_group(LLAMA_70B, "g1", "clique-a").pods
    assert _container(leader)["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    # The startup probe carries the whole load-time budget: 2400 s at one probe every 10 s.
    assert _container(leader)["startupProbe"]["failureThreshold"] * 10 >= 2400
    assert leader["metadata"]["labels"][naming.LABEL_METRICS] == "true"
    assert "readinessProbe" not in _container(follower)
    assert "startupProbe" not in _container(follower)
    assert naming.LABEL_METRICS not in follower["metadata"]["labels"]


def test_group_service_resolves_the_leader_before_it_is_ready() -> None:
    service = render_group(LLAMA_70B, "g1", "clique-a").service
    assert service is not None
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        naming.LABEL_MODEL_GROUP: "llama-70b",
        naming.LABEL_GROUP: "g1",
        naming.LABEL_RANK: "0",
    }
    assert service["metadata"]["ownerReferences"][0]["uid"] == "uid-70b"


def test_user_scheduling_constraints_reach_every_pod() -> None:
    for pod in render_group(LLAMA_70B, "g1", "clique-a").pods:
        assert pod["spec"]["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert _container(pod)["resources"]["requests"]["memory"] == "64Gi"


def test_revision_changes_with_the_pod_template_only() -> None:
    assert replace(LLAMA_8B, uid="another").revision == LLAMA_8B.revision
    assert replace(LLAMA_8B, image="vllm/vllm-openai:v0.34.0").revision != LLAMA_8B.revision
    assert replace(LLAMA_8B, args=()).revision != LLAMA_8B.revision


def test_multi_pod_args_need_a_leader_address() -> None:
    with pytest.raises(ValueError, match="leader"):
        vllm_args(LLAMA_70B, 1, None)


HF_TOKEN = EnvVar(
    name="HF_TOKEN", value_from=EnvVarSource(secret_key_ref=SecretKeySelector(name="hf", key="token"))
)
PLATFORM = replace(
    LLAMA_70B,
    env=(("HF_HOME", "/models"), HF_TOKEN, ("HF_HUB_OFFLINE", "0")),
    volume_mounts=(VolumeMount(name="weights", mount_path="/models"),),
    shared_memory_size="32Gi",
    security_context=SecurityContext.model_validate({"capabilities": {"add": ["IPC_LOCK"]}}),
    pod=PodOptions.model_validate(
        {
            "labels": {"team": "ml", naming.LABEL_GROUP.replace("goodput.dev/", "x/"): "y"},
            "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
            "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
            "securityContext": {"fsGroup": 1000},
            "runtimeClassName": "nvidia",
            "imagePullSecrets": [{"name": "registry"}],
            "serviceAccountName": "vllm",
            "automountServiceAccountToken": True,
            "priorityClassName": "inference-high",
        }
    ),
    node_affinity=NodeAffinity.model_validate(
        {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]},
                }
            ],
        }
    ),
)


def test_a_platform_teams_pod_settings_reach_every_rank_in_pod_spec_shape() -> None:
    for pod in render_group(PLATFORM, "g0", "clique-a").pods:
        spec, container = pod["spec"], _container(pod)
        env = [item for item in container["env"] if item["name"].startswith("HF_")]
        # In the spec's order, so $(NAME) still refers to a variable defined before it.
        assert env == [
            {"name": "HF_HOME", "value": "/models"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "HF_HUB_OFFLINE", "value": "0"},
        ]
        assert spec["volumes"] == [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
            {"name": "weights", "persistentVolumeClaim": {"claimName": "hf-cache"}},
        ]
        assert container["volumeMounts"] == [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "weights", "mountPath": "/models"},
        ]
        assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert spec["securityContext"] == {"fsGroup": 1000}
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == ("vllm", True)
        assert spec["priorityClassName"] == "inference-high"
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert pod["metadata"]["labels"][naming.LABEL_MODEL_GROUP] == "llama-70b"
        assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
        # The GPU count stays goodput's.
        assert container["resources"]["limits"][naming.GPU_RESOURCE] == "8"


def test_node_affinity_of_the_spec_combines_with_the_groups_domain() -> None:
    domain = {"key": "nvidia.com/gpu.clique", "operator": "In", "values": ["clique-a"]}
    preferred_spec = {
        "weight": 10,
        "preference": {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]},
    }
    # Preferred mode: the spec's required terms stand, the domain is the strongest preference.
    affinity = render_group(PLATFORM, "g0", "clique-a").pods[0]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
    ]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "preference": {"matchExpressions": [domain]}},
        preferred_spec,
    ]
    # Required mode: each alternative of the spec also requires the domain.
    required = replace(PLATFORM, placement_mode="Required")
    affinity = render_group(required, "g0", "clique-a").pods[0]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}, domain]},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}, domain]},
    ]


def test_unset_platform_settings_leave_the_pod_and_its_revision_as_before() -> None:
    plain = render_group(LLAMA_8B, "g0", "clique-a").pods[0]["spec"]
    for field in ("securityContext", "runtimeClassName", "imagePullSecrets", "serviceAccountName"):
        assert field not in plain
    assert plain["automountServiceAccountToken"] is False
    # Fields added later count in the revision only when set: an upgrade outdates no running group.
    assert replace(LLAMA_8B, pod=None, volume_mounts=()).revision == LLAMA_8B.revision
    assert replace(LLAMA_8B, shared_memory_size="8Gi").revision != LLAMA_8B.revision
    assert replace(LLAMA_8B, pod=PodOptions(runtime_class_name="nvidia")).revision != LLAMA_8B.revision
    secret = replace(LLAMA_8B, env=(*LLAMA_8B.env, HF_TOKEN))
    other = EnvVar(
        name="HF_TOKEN", value_from=EnvVarSource(secret_key_ref=SecretKeySelector(name="hf2", key="token"))
    )
    assert secret.revision != replace(LLAMA_8B, env=(*LLAMA_8B.env, other)).revision


def test_pods_request_the_device_resource_of_the_spec() -> None:
    amd = replace(LLAMA_70B, gpu_resource_name="amd.com/gpu")
    for pod in render_group(amd, "g0", "clique-a").pods:
        resources = _container(pod)["resources"]
        assert resources["requests"]["amd.com/gpu"] == resources["limits"]["amd.com/gpu"] == "8"
        assert naming.GPU_RESOURCE not in resources["requests"]
    assert amd.revision != LLAMA_70B.revision


def test_a_change_of_the_readiness_checks_outdates_the_groups_proved_under_the_old_ones() -> None:
    revision_checked = replace(LLAMA_8B, readiness=Readiness(revision_check=True))
    longer_warmup = replace(LLAMA_8B, readiness=Readiness(warmup=Warmup(max_tokens=64)))

    assert revision_checked.revision != LLAMA_8B.revision
    assert longer_warmup.revision not in (LLAMA_8B.revision, revision_checked.revision)
    # The defaults are what every template had before readiness counted: nothing is outdated by it.
    assert replace(LLAMA_8B, readiness=None).revision == LLAMA_8B.revision == PINNED_8B_REVISION


def test_revision_hash_of_a_plain_template_is_stable() -> None:
    # Pinned: a change here outdates every running group on the next operator upgrade.
    assert LLAMA_8B.revision == PINNED_8B_REVISION


PINNED_8B_REVISION = "3b029c3fd2"  # the revision of this template before platform settings existed
