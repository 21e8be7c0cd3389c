"""From a ModelGroup object to the group template, and the spec errors only the controller can see."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.controllers.groups.placement import NodeInventory
from goodput.controllers.groups.pods import render_group
from goodput.controllers.groups.template import (
    IMAGE_REFERENCE,
    group_template,
    parse_model_group,
    placement_rules,
    readiness_rules,
    spec_problems,
)

CLIQUE = "nvidia.com/gpu.clique"
BODY: dict[str, Any] = {
    "apiVersion": "goodput.dev/v1alpha1",
    "kind": "ModelGroup",
    "metadata": {"name": "llama-70b", "namespace": "serving", "uid": "u-1", "generation": 2},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "revision": "abc123"},
        "engine": {
            "image": "vllm/vllm-openai:v0.33.0",
            "env": [{"name": "HF_HOME", "value": "/m"}],
            "resources": {"requests": {"cpu": "32", "memory": "400Gi"}},
        },
        "parallelism": {"tensor": 8, "pipeline": 2, "gpusPerPod": 8},
        "placement": {"scheduleTimeoutSeconds": 120},
        "maxReplicas": 4,
        "profile": {"gpu": "h100-80g"},
        "readiness": {"ncclCheck": "Skip", "warmup": {"prompt": "Hi", "maxTokens": 2}},
    },
}
NODES = tuple(NodeInventory(f"n{i}", ((CLIQUE, "a"),), 8) for i in range(2))


def body(**spec_changes: Any) -> dict[str, Any]:
    changed = copy.deepcopy(BODY)
    for dotted, value in spec_changes.items():
        target = changed
        *path, last = dotted.split("__")
        for key in path:
            target = target[key]
        target[last] = value
    return changed


def model_group(raw: dict[str, Any]) -> Any:
    parsed = parse_model_group(raw)
    assert not isinstance(parsed, str), parsed
    return parsed


def test_the_template_carries_the_spec() -> None:
    template = group_template(model_group(BODY))
    assert (template.model_group, template.namespace, template.uid) == ("llama-70b", "serving", "u-1")
    assert (template.tensor_parallel, template.pipeline_parallel, template.pods_per_group) == (8, 2, 2)
    assert template.requests == (("cpu", "32"), ("memory", "400Gi"))
    assert template.env == (("HF_HOME", "/m"),)
    # The profile's GPU gives vLLM's batch defaults on an H100, rendered by the operator.
    assert (template.max_num_seqs, template.max_num_batched_tokens) == (1024, 8192)


def test_rules_come_from_the_spec() -> None:
    spec = model_group(BODY).spec
    readiness = readiness_rules(spec)
    assert (
        readiness.model_revision,
        readiness.nccl_required,
        readiness.schedule_timeout_seconds,
        readiness.warmup_prompt,
        readiness.warmup_max_tokens,
    ) == ("abc123", False, 120, "Hi", 2)
    placement = placement_rules(spec)
    assert (placement.topology_key, placement.spread_key, placement.mode) == (
        CLIQUE,
        "topology.kubernetes.io/zone",
        "Preferred",
    )


def test_a_spec_the_api_server_would_reject_is_described_field_by_field() -> None:
    problems = parse_model_group(body(spec__parallelism={"tensor": 8, "pipeline": 1, "gpusPerPod": 3}))
    assert isinstance(problems, str)
    assert problems.startswith("spec.parallelism: ")
    assert "gpusPerPod" in problems


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (
            body(spec__engine={"image": "Not A Valid Image!"}),
            "spec.engine.image: 'Not A Valid Image!' is not a valid",
        ),
        (
            body(
                spec__engine={
                    "image": "vllm/vllm-openai",
                    "env": [{"name": "VLLM_HOST_IP", "value": "1.2.3.4"}],
                }
            ),
            "spec.engine.env: VLLM_HOST_IP are set by goodput",
        ),
        (body(metadata={"name": "x" * 60, "namespace": "serving", "uid": "u"}), "metadata.name: "),
        (
            body(spec__parallelism={"tensor": 16, "pipeline": 1, "gpusPerPod": 16}),
            "spec.parallelism: a group of 1 pod(s) × 16 GPUs fits not even the 2 eligible node(s) together",
        ),
        (
            body(
                spec__parallelism={"tensor": 8, "pipeline": 3, "gpusPerPod": 8},
                spec__placement={"mode": "Required"},
            ),
            "spec.parallelism: a group of 3 pod(s) × 8 GPUs fits no nvidia.com/gpu.clique domain",
        ),
        (
            body(spec__parallelism={"tensor": 8, "pipeline": 3, "gpusPerPod": 8}),
            "spec.parallelism: a group of 3 pod(s) × 8 GPUs",
        ),
    ],
    ids=[
        "image reference",
        "operator-owned env",
        "name too long for pod names",
        "pod larger than any node",
        "group larger than any domain (Required)",
        "group larger than every node together (Preferred)",
    ],
)
def test_problems_only_the_controller_can_see(raw: dict[str, Any], problem: str) -> None:
    problems = spec_problems(model_group(raw), NODES)
    assert len(problems) == 1
    assert problems[0].startswith(problem)


def test_a_valid_spec_has_no_problems_and_a_cluster_without_nodes_is_not_a_spec_error() -> None:
    assert spec_problems(model_group(BODY), NODES) == ()
    big = model_group(body(spec__parallelism={"tensor": 16, "pipeline": 1, "gpusPerPod": 16}))
    assert spec_problems(big, ()) == ()


@pytest.mark.parametrize(
    ("image", "valid"),
    [
        ("vllm/vllm-openai:v0.33.0", True),
        ("registry.example.com:5000/team/vllm@sha256:" + "a" * 64, True),
        ("localhost/vllm", True),
        ("vllm", True),
        ("VLLM/Openai", False),
        ("vllm openai", False),
        ("vllm/vllm-openai:", False),
        ("vllm//openai", False),
    ],
)
def test_image_references(image: str, valid: bool) -> None:
    assert bool(IMAGE_REFERENCE.match(image)) is valid


def test_the_gated_sample_reads_its_token_from_a_secret_and_caches_weights_on_a_claim() -> None:
    path = (
        Path(__file__).resolve().parent.parent
        / "manifests"
        / "samples"
        / "modelgroup-gated-llama-8b-secret-pvc.yaml"
    )
    document = yaml.safe_load(path.read_text())
    document["metadata"].update(namespace="serving", uid="u-2")
    (pod,) = render_group(group_template(model_group(document)), "g0", "node/gpu-0").pods
    container = pod["spec"]["containers"][0]
    env = {item["name"]: item for item in container["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    }
    assert "value" not in env["HF_TOKEN"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod["spec"]["volumes"]
    assert {"name": "hf-cache", "mountPath": "/models"} in container["volumeMounts"]
    assert pod["metadata"]["labels"]["cost-center"] == "ml-platform"
    # No clique label on the node: the domain is the node itself.
    assert pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "preference"
    ] == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-0"]}]}


def test_the_device_resource_of_the_spec_reaches_placement_and_pods() -> None:
    spec_engine = {**BODY["spec"]["engine"], "gpuResourceName": "nvidia.com/mig-3g.40gb"}
    parsed = model_group(body(spec__engine=spec_engine))
    assert placement_rules(parsed.spec).gpu_resource == "nvidia.com/mig-3g.40gb"
    assert group_template(parsed).gpu_resource == "nvidia.com/mig-3g.40gb"
    # The default leaves the template as it was, so running groups keep their revision.
    assert group_template(model_group(BODY)).gpu_resource_name is None
    mig_nodes = tuple(
        NodeInventory(f"n{i}", ((CLIQUE, "a"),), 0, other_devices=(("nvidia.com/mig-3g.40gb", 2),))
        for i in range(2)
    )
    # 16 slices are needed, 4 exist: the spec can never be placed there.
    assert spec_problems(parsed, mig_nodes)[0].startswith("spec.parallelism: a group of 2 pod(s) × 8 GPUs")


ADAPTERS = [
    {"name": "sql", "source": "/adapters/sql"},
    {"name": "legal", "source": "org/legal-lora", "maxRank": 32},
]


def test_adapters_start_vllm_with_lora_on_and_the_runtime_adapter_api_open() -> None:
    template = group_template(
        model_group(
            body(spec__adapters=ADAPTERS, spec__adapterLimits={"maxLoadedPerGroup": 4, "maxRank": 32})
        )
    )
    args = list(template.args)
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "4"
    assert args[args.index("--max-lora-rank") + 1] == "32"
    assert "--max-cpu-loras" not in args, "absent: vLLM's default"
    assert ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True") in template.env
    pod_args = render_group(template, "g1", "d1").pods[0]["spec"]["containers"][0]["args"]
    assert "--enable-lora" in pod_args


def test_a_modelgroup_without_adapters_keeps_its_pods_and_revision() -> None:
    plain = group_template(model_group(body()))
    assert not any("lora" in arg for arg in plain.args)
    assert all(not (isinstance(v, tuple) and "LORA" in v[0]) for v in plain.env)
    with_defaults = group_template(model_group(body(spec__adapterLimits={"maxLoadedPerGroup": 8})))
    assert with_defaults.revision == plain.revision, "limits alone change nothing"


@pytest.mark.parametrize(
    ("spec_changes", "problem"),
    [
        pytest.param(
            {"spec__adapters": [*ADAPTERS, ADAPTERS[0]]}, "adapter names must be unique", id="duplicate name"
        ),
        pytest.param(
            {"spec__adapters": [{"name": "meta-llama/Llama-3.1-70B-Instruct", "source": "/a"}]},
            "must differ from the served model name",
            id="named as the base model",
        ),
        pytest.param(
            {"spec__adapters": ADAPTERS, "spec__adapterLimits": {"maxLoadedPerGroup": 0}},
            "maxLoadedPerGroup",
            id="nothing may be loaded",
        ),
        pytest.param(
            {"spec__adapters": ADAPTERS}, "must not exceed `adapterLimits.maxRank`", id="rank over the limit"
        ),
        pytest.param(
            {"spec__adapterLimits": {"maxLoadedPerGroup": 8, "maxCpuLoaded": 4}},
            "`maxCpuLoaded` must be at least `maxLoadedPerGroup`",
            id="cpu cache smaller than the loaded set",
        ),
    ],
)
def test_bad_adapters_are_refused_naming_the_field(spec_changes: dict[str, Any], problem: str) -> None:
    parsed = parse_model_group(body(**spec_changes))
    assert isinstance(parsed, str), parsed
    assert problem in parsed


@pytest.mark.parametrize(
    ("kv_offload", "expected"),
    [
        pytest.param(
            {"cpuSizeGib": 64},
            ["--kv-offloading-size", "64", "--kv-offloading-backend", "native"],
            id="native by default",
        ),
        pytest.param(
            {"cpuSizeGib": 12.5, "backend": "lmcache"},
            ["--kv-offloading-size", "12.5", "--kv-offloading-backend", "lmcache"],
            id="lmcache, a fractional size",
        ),
    ],
)
def test_kv_offload_renders_vllms_offloading_flags(kv_offload: dict[str, Any], expected: list[str]) -> None:
    template = group_template(model_group(body(spec__kvOffload=kv_offload)))
    args = list(template.args)
    start = args.index("--kv-offloading-size")
    assert args[start : start + 4] == expected
    pod_args = render_group(template, "g1", "d1").pods[0]["spec"]["containers"][0]["args"]
    assert "--kv-offloading-size" in pod_args
    assert template.revision != group_template(model_group(body())).revision


def test_a_modelgroup_without_kv_offload_renders_no_offloading_flag() -> None:
    assert not any("offloading" in arg for arg in group_template(model_group(body())).args)


@pytest.mark.parametrize(
    ("spec_changes", "problem"),
    [
        pytest.param({"spec__kvOffload": {"cpuSizeGib": 0}}, "cpuSizeGib", id="no CPU memory"),
        pytest.param(
            {"spec__kvOffload": {"cpuSizeGib": 8, "backend": "disk"}}, "backend", id="unknown backend"
        ),
        pytest.param(
            {"spec__engine__args": ["--kv-offloading-size=8"]},
            "must not set a flag that goodput renders",
            id="the flag set by hand",
        ),
        pytest.param(
            {"spec__kvOffload": {"cpuSizeGib": 8}, "spec__engine__args": ["--kv-transfer-config", "{}"]},
            "must not set `--kv-transfer-config` with `kvOffload`",
            id="a second connector by hand",
        ),
    ],
)
def test_bad_kv_offload_is_refused_naming_the_field(spec_changes: dict[str, Any], problem: str) -> None:
    parsed = parse_model_group(body(**spec_changes))
    assert isinstance(parsed, str), parsed
    assert problem in parsed
