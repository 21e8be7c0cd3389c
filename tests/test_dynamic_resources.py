"""GPUs under dynamic resource allocation: what placement counts for a DeviceClass, and the pods'
claims (controllers/dynamic_resources.py, the DRA parts of pods.py and observation.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from goodput.api.modelgroup import ModelGroup
from goodput.api.reasons import NoFitReason
from goodput.controllers import naming
from goodput.controllers.groups.agent_sidecar import AGENT_CONTAINER_NAME
from goodput.controllers.groups.dynamic_resources import (
    DeviceClassView,
    ResourceSliceView,
    SliceDevice,
    allocated_devices,
    class_devices,
    class_placement,
    inventory_note,
    parse_device_class,
    parse_resource_slice,
    selects,
    with_class_devices,
)
from goodput.controllers.groups.observation import gpu_claim, parse_pod, pod_accelerator, pod_gpus
from goodput.controllers.groups.placement import (
    GroupShape,
    Inventory,
    NodeInventory,
    NoFit,
    Placed,
    PlacementRules,
    place_group,
)
from goodput.controllers.groups.pods import ENGINE_CONTAINER_NAME, render_group
from goodput.controllers.groups.template import group_template, placement_rules, spec_problems

DRIVER = "gpu.example.com"
GPU_CLASS = DeviceClassView(
    "gpu.example.com",
    (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",),
)
RESOURCE = naming.device_class_resource(GPU_CLASS.name)
CLIQUE = "nvidia.com/gpu.clique"


def slice_body(node: str, devices: list[dict[str, Any]], generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
            **spec,
        },
    }


def gpu(name: str, kind: str = "gpu", **attributes: Any) -> dict[str, Any]:
    values = {"type": {"string": kind}, **{key: {"string": value} for key, value in attributes.items()}}
    return {"name": name, "attributes": values, "capacity": {"memory": {"value": "80Gi"}}}


def node_slice(node: str, gpus: int, migs: int = 0, generation: int = 1) -> ResourceSliceView:
    devices = [gpu(f"gpu-{i}") for i in range(gpus)] + [gpu(f"mig-{i}", "mig") for i in range(migs)]
    view = parse_resource_slice(slice_body(node, devices, generation))
    assert view is not None
    return view


def device(**attributes: Any) -> SliceDevice:
    return SliceDevice(
        DRIVER, "pool", "d0", tuple(sorted((DRIVER, name, value) for name, value in attributes.items()))
    )


@dataclass(frozen=True)
class SelectCase:
    name: str
    selectors: tuple[str, ...]
    device: SliceDevice
    expected: bool | None


SELECT_CASES = [
    SelectCase("every selector accepts", GPU_CLASS.selectors, device(type="gpu"), True),
    SelectCase("a MIG device is not a whole GPU", GPU_CLASS.selectors, device(type="mig"), False),
    SelectCase("another driver's device", ("device.driver == 'other.example.com'",), device(), False),
    SelectCase("no selector: the class takes every device", (), device(), True),
    SelectCase(
        "all selectors must accept",
        ("device.driver == 'gpu.example.com'", "device.attributes['gpu.example.com'].index == 3"),
        device(index=2),
        False,
    ),
    SelectCase(
        "a missing attribute cannot be read", ("device.attributes['x.io'].model == 'a'",), device(), None
    ),
    SelectCase(
        "Kubernetes' quantity() is not available",
        ("device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0",),
        device(),
        None,
    ),
    SelectCase("a selector that is not a boolean", ("device.driver",), device(), None),
]


@pytest.mark.parametrize("case", SELECT_CASES, ids=lambda case: case.name)
def test_selects(case: SelectCase) -> None:
    assert selects(case.selectors, case.device) is case.expected


def test_a_slice_names_its_attributes_by_domain() -> None:
    body = slice_body(
        "n0", [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "x.io/rack": {"int": 4}}}]
    )

    view = parse_resource_slice(body)

    assert view is not None and view.node_name == "n0" and view.pool == "n0"
    assert view.devices[0].attributes == ((DRIVER, "type", "gpu"), ("x.io", "rack", 4))
    assert selects(("device.attributes['x.io'].rack == 4",), view.devices[0]) is True


def test_slices_not_tied_to_one_node_are_not_counted() -> None:
    network = slice_body("n0", [gpu("gpu-0")])
    del network["spec"]["nodeName"]
    network["spec"]["allNodes"] = True
    assert parse_resource_slice(network) is None


def test_a_node_counts_the_devices_its_class_selects_and_no_claim_holds() -> None:
    slices = [node_slice("n0", gpus=4, migs=7), node_slice("n1", gpus=8)]
    held = [
        (DRIVER, "n0", "gpu-0"),
        (DRIVER, "n0", "mig-3"),
        (DRIVER, "n1", "gpu-5"),
        (DRIVER, "n1", "gpu-6"),
    ]

    devices = class_devices(GPU_CLASS, slices, held)

    assert devices.total_by_node == {"n0": 4, "n1": 8}
    assert {(claim.node_name, claim.gpus, claim.resource) for claim in devices.claims} == {
        ("n0", 1, RESOURCE),
        ("n1", 2, RESOURCE),
    }, "a held MIG device is not a GPU of this class"
    assert devices.unreadable_devices == 0


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    devices = class_devices(
        GPU_CLASS, [node_slice("n0", gpus=8, generation=1), node_slice("n0", 6, generation=2)], []
    )
    assert devices.total_by_node == {"n0": 6}


def test_a_class_that_cannot_be_read_counts_nothing_and_says_how_much() -> None:
    unreadable = DeviceClassView(
        "big.example.com", ("device.capacity['gpu.example.com'].memory.isGreaterThan(1)",)
    )
    devices = class_devices(unreadable, [node_slice("n0", gpus=8)], [])
    assert devices.total_by_node == {} and devices.unreadable_devices == 8
    missing = class_devices(None, [node_slice("n0", gpus=8)], [])
    assert not missing.class_found and missing.total_by_node == {}


def test_device_classes_and_claims_are_read_from_their_objects() -> None:
    body = {"metadata": {"name": "gpu.example.com"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    assert parse_device_class(body) == DeviceClassView("gpu.example.com", ("true",))
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpus", "driver": DRIVER, "pool": "n0", "device": "gpu-1"}]
                }
            }
        }
    }
    assert allocated_devices(claim) == ((DRIVER, "n0", "gpu-1"),)
    assert allocated_devices({"status": {}}) == ()


def test_a_group_is_placed_only_where_the_class_has_free_devices() -> None:
    nodes = [
        NodeInventory("n0", ((CLIQUE, "a"),), 8),
        NodeInventory("n1", ((CLIQUE, "b"),), 8),
    ]
    devices = class_devices(
        GPU_CLASS, [node_slice("n0", 2), node_slice("n1", 2, migs=4)], [(DRIVER, "n0", "gpu-0")]
    )
    inventory = Inventory(tuple(with_class_devices(nodes, devices, GPU_CLASS.name)), devices.claims)
    rules = PlacementRules(CLIQUE, gpu_resource=RESOURCE)

    two = place_group(inventory, GroupShape(1, 2, RESOURCE), rules)
    assert isinstance(two, Placed) and two.domain == "b", (
        "n0 has one free device; n1's MIG devices do not count"
    )
    after = inventory.with_group(CLIQUE, "b", GroupShape(1, 2, RESOURCE))
    full = place_group(after, GroupShape(1, 2, RESOURCE), rules)
    assert isinstance(full, NoFit) and full.reason == NoFitReason.INSUFFICIENT_GPUS
    assert "needs 2 GPUs of DeviceClass 'gpu.example.com'" in full.message, full.message
    assert isinstance(place_group(after, GroupShape(1, 1, RESOURCE), rules), Placed)


DRA_MODEL_GROUP = {
    "apiVersion": "goodput.dev/v1alpha1",
    "kind": "ModelGroup",
    "metadata": {"name": "llama", "namespace": "serving", "uid": "u1"},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0", "gpuDeviceClassName": GPU_CLASS.name},
        "parallelism": {"tensor": 4, "pipeline": 2, "gpusPerPod": 4},
        "readiness": {"ncclCheck": "Required"},
        "maxReplicas": 4,
    },
}


def dra_template() -> Any:
    return group_template(ModelGroup.model_validate(DRA_MODEL_GROUP), "goodput:agent")


def test_every_rank_claims_its_gpus_and_shares_the_claim_with_its_agent() -> None:
    template = dra_template()
    manifests = render_group(template, "g0", "a")

    for pod in manifests.pods:
        spec = pod["spec"]
        assert spec["resourceClaims"] == [
            {"name": naming.POD_CLAIM_NAME, "resourceClaimTemplateName": template.claim_template_name}
        ]
        engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER_NAME)
        agent = next(c for c in spec["initContainers"] if c["name"] == AGENT_CONTAINER_NAME)
        assert (
            engine["resources"]["claims"] == agent["resources"]["claims"] == [{"name": naming.POD_CLAIM_NAME}]
        )
        assert not any("/" in name for name in engine["resources"]["requests"]), "no device-plugin GPU"
    claim_template = manifests.claim_template
    assert claim_template is not None and claim_template["metadata"]["name"] == template.claim_template_name
    (request,) = claim_template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": naming.POD_CLAIM_NAME,
        "exactly": {"deviceClassName": GPU_CLASS.name, "allocationMode": "ExactCount", "count": 4},
    }
    assert claim_template["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_a_new_class_or_count_is_a_new_template_and_a_new_revision() -> None:
    template = dra_template()
    other_class = replace(template, gpu_device_class="mig.example.com")
    plugin = replace(template, gpu_device_class=None)
    assert other_class.claim_template_name != template.claim_template_name
    assert len({template.revision, other_class.revision, plugin.revision}) == 3
    assert plugin.claim_template_name is None and render_group(plugin, "g0", "a").claim_template is None
    assert replace(template, gpus_per_pod=8).claim_template_name != template.claim_template_name


def test_a_ranks_devices_are_counted_until_its_claim_is_allocated() -> None:
    pod = render_group(dra_template(), "g0", "a").pods[0]
    assert pod_accelerator(pod) == RESOURCE and pod_gpus(pod, RESOURCE) == 4
    pending = gpu_claim(pod)
    assert pending is not None and (pending.resource, pending.gpus, pending.domain) == (RESOURCE, 4, "a")
    view = parse_pod(pod)
    assert view is not None and view.gpus == 4
    bound = {**pod, "spec": {**pod["spec"], "nodeName": "n0"}}
    assert gpu_claim(bound) is None, "a bound pod's devices are its allocated claim's"


def test_the_spec_check_waits_for_devices_instead_of_calling_the_shape_impossible() -> None:
    model_group = ModelGroup.model_validate(DRA_MODEL_GROUP)
    rules = placement_rules(model_group.spec)
    assert rules.gpu_resource == RESOURCE
    nodes = [NodeInventory("n0", ((CLIQUE, "a"),), 8)]
    assert spec_problems(model_group, nodes) == (), "no devices published yet: capacity to come"
    small = class_devices(GPU_CLASS, [node_slice("n0", 2)], [])
    problems = spec_problems(model_group, with_class_devices(nodes, small, GPU_CLASS.name))
    assert len(problems) == 1 and problems[0].startswith("spec.parallelism")


def test_a_no_fit_names_the_device_class_placement_could_not_count() -> None:
    nodes = (NodeInventory("n0", ((CLIQUE, "a"),), 8),)
    rules = PlacementRules(CLIQUE, gpu_resource=RESOURCE)
    counted, devices = class_placement(nodes, GPU_CLASS.name, None, [node_slice("n0", 8)], [])
    decision = place_group(
        Inventory(tuple(counted), devices.claims, devices.note), GroupShape(1, 1, RESOURCE), rules
    )
    assert isinstance(decision, NoFit)
    assert decision.message.endswith(
        f"DeviceClass '{GPU_CLASS.name}' (spec.engine.gpuDeviceClassName) does not exist"
    ), decision.message
    unreadable = DeviceClassView("big", ("device.capacity['gpu.example.com'].memory.isGreaterThan(1)",))
    assert inventory_note(class_devices(unreadable, [node_slice("n0", 3)], []), "big").startswith(
        "3 device(s)"
    )
    assert inventory_note(class_devices(GPU_CLASS, [node_slice("n0", 3)], []), GPU_CLASS.name) == ""
