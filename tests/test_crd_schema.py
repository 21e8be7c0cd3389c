"""The rendered CRDs: what the API server and a platform team rely on, checked without a cluster."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.api import modelgroup, slopolicy
from goodput.api.base import SpecModel, StatusModel
from goodput.api.crd import (
    CUSTOM_RESOURCES,
    MODEL_GROUP,
    SLO_POLICY,
    CustomResource,
    apply_defaults,
    openapi_schema,
    render_crd,
    render_crds,
    to_openapi,
)
from goodput.operator.cmd_crds import stale_files

CRDS_DIR = Path(__file__).resolve().parent.parent / "crds"
RESOURCE_IDS = [resource.kind for resource in CUSTOM_RESOURCES]
TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (`.spec.classes[].name`); `[*]` marks map values."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}[*]")


def node_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in re.findall(r"\.([A-Za-z0-9]+)(\[\])?", path):
        node = node["properties"][part[0]]
        if part[1]:
            node = node["items"]
    return node


@pytest.fixture(params=CUSTOM_RESOURCES, ids=RESOURCE_IDS)
def resource(request: pytest.FixtureRequest) -> CustomResource:
    value: CustomResource = request.param
    return value


def test_schema_is_structural(resource: CustomResource) -> None:
    for path, node in walk(openapi_schema(resource)):
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert node.get("type") in TYPES, f"{path or 'root'} has no type"
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "not", "nullable", "title", "$defs", "const"):
            assert forbidden not in node, f"{path}: {forbidden}"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "x-kubernetes-preserve-unknown-fields" not in node, f"{path}: no free-form subtrees"


def test_every_field_has_a_description(resource: CustomResource) -> None:
    undocumented = [
        path
        for path, node in walk(openapi_schema(resource))
        # List items and map values are described by their field; metadata by Kubernetes.
        if not path.endswith(("[]", "[*]")) and path != ".metadata" and not node.get("description")
    ]

    assert undocumented == []


def test_defaults_are_valid_and_equal_the_models_defaults(resource: CustomResource) -> None:
    schema = openapi_schema(resource)

    for path, node in walk(schema):
        if "default" not in node:
            continue
        default = node["default"]
        if node["type"] == "object":
            assert isinstance(default, dict), path
            assert set(default) <= set(node.get("properties", {})), f"{path}: default has unknown fields"
        elif node["type"] == "array":
            assert isinstance(default, list), path
            assert all(set(item) <= set(node["items"]["properties"]) for item in default), path
        elif "enum" in node:
            assert default in node["enum"], path
        else:
            python_types: dict[str, type | tuple[type, ...]] = {
                "string": str,
                "integer": int,
                "number": (int, float),
                "boolean": bool,
            }
            python_type = python_types[node["type"]]
            assert isinstance(default, python_type), path
            assert node.get("minimum", default) <= default <= node.get("maximum", default), path

    # The API server's defaulting of the smallest valid object gives the model's own defaults.
    minimal = {
        "ModelGroup": {
            "model": {"name": "m"},
            "engine": {"image": "i"},
            "parallelism": {"gpusPerPod": 1},
            "maxReplicas": 2,
        },
        "SLOPolicy": {"revision": "r", "classes": [{"name": "c", "ttftSeconds": 1, "itlSeconds": 1}]},
    }[resource.kind]
    defaulted = apply_defaults(schema, {"spec": minimal})
    model = resource.model.model_validate({"spec": minimal})
    assert resource.model.model_validate(defaulted) == model
    assert defaulted["status"]["observedGeneration"] == -1


def test_object_defaults_are_written_once_on_the_fields() -> None:
    spec = openapi_schema(SLO_POLICY)["properties"]["spec"]

    assert spec["properties"]["goodput"]["default"] == {}
    assert (
        spec["properties"]["autoscaling"]["properties"]["scaleDown"]["properties"][
            "stabilizationWindowSeconds"
        ]["default"]
        == 300
    )
    # Rules of an object are checked against its default as written, so that default is spelt out.
    signals = spec["properties"]["autoscaling"]["properties"]["signals"]
    assert signals["default"]["queueWork"] == {
        "enabled": True,
        "drainTargetSeconds": 10.0,
        "safetyFactor": 1.2,
    }


def rule_locations(resource: CustomResource) -> dict[str, list[str]]:
    return {
        path: [rule["rule"] for rule in node["x-kubernetes-validations"]]
        for path, node in walk(openapi_schema(resource))
        if "x-kubernetes-validations" in node
    }


def test_every_model_rule_is_in_the_schema_where_its_model_is() -> None:
    models = [
        value
        for module in (modelgroup, slopolicy)
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, SpecModel | StatusModel) and value.cel_rules
    ]
    rendered = {
        rule for resource in CUSTOM_RESOURCES for rules in rule_locations(resource).values() for rule in rules
    }

    for model in models:
        for rule in model.cel_rules:
            assert rule.rule in rendered, f"{model.__name__}: {rule.rule}"


@pytest.mark.parametrize(
    ("resource", "path", "fragment"),
    [
        (MODEL_GROUP, ".spec", "self.minReplicas <= self.maxReplicas"),
        (MODEL_GROUP, ".spec", "self.replicas <= self.maxReplicas"),
        (MODEL_GROUP, ".spec", "self.replicas >= self.minReplicas"),
        (MODEL_GROUP, ".spec", "self.warmReplicas <= self.maxReplicas"),
        (MODEL_GROUP, ".spec.parallelism", "(self.tensor * self.pipeline) % self.gpusPerPod == 0"),
        (MODEL_GROUP, ".spec.parallelism", "self == oldSelf"),
        (MODEL_GROUP, ".spec.engine", "--(tensor|pipeline|data)[-_]parallel[-_]size"),
        (SLO_POLICY, ".spec.classes[]", "self.attainment > 0.0 && self.attainment <= 1.0"),
        (SLO_POLICY, ".spec.classes[]", "self.ttftSeconds > 0.0"),
        (SLO_POLICY, ".spec", "self.revision != oldSelf.revision"),
    ],
    ids=[
        "min-le-max",
        "replicas-le-max",
        "replicas-ge-min",
        "warm-le-max",
        "pods-divide",
        "parallelism-immutable",
        "engine-flags",
        "attainment-range",
        "positive-ttft",
        "revision-bump",
    ],
)
def test_the_promised_rules_are_enforced_at_their_field(
    resource: CustomResource, path: str, fragment: str
) -> None:
    assert any(fragment in rule for rule in rule_locations(resource)[path])


def test_parallelism_is_required_so_its_immutability_cannot_be_sidestepped() -> None:
    spec = openapi_schema(MODEL_GROUP)["properties"]["spec"]

    # A transition rule does not fire when an optional field is removed or added.
    assert "parallelism" in spec["required"]
    assert "gpusPerPod" in spec["properties"]["parallelism"]["required"]


def test_replica_bound_rules_also_run_on_create() -> None:
    spec = openapi_schema(MODEL_GROUP)["properties"]["spec"]

    bound_rules = [rule for rule in spec["x-kubernetes-validations"] if rule.get("fieldPath") == ".replicas"]
    assert len(bound_rules) == 2
    assert all(rule["optionalOldSelf"] for rule in bound_rules)


def test_values_touched_by_rules_are_bounded_for_the_cost_budget(resource: CustomResource) -> None:
    for rule_path in rule_locations(resource):
        for path, node in walk(node_at(openapi_schema(resource), rule_path), rule_path):
            if node.get("type") == "array":
                assert "maxItems" in node, path
            if node.get("type") == "string":
                assert "maxLength" in node or "enum" in node, path
            if node.get("type") == "object" and "additionalProperties" in node:
                assert "maxProperties" in node, path


def test_no_object_loses_its_content_to_pruning(resource: CustomResource) -> None:
    """An object with neither properties nor typed values is pruned empty by the API server: a map
    whose keys the schema tried to constrain (labels, annotations) would vanish without an error."""
    for path, node in walk(openapi_schema(resource)):
        if node.get("type") == "object" and path not in ("", ".metadata"):
            assert "properties" in node or "additionalProperties" in node, f"{path} would be pruned empty"


def test_rule_messages_name_their_field_in_back_quotes(resource: CustomResource) -> None:
    for path, node in walk(openapi_schema(resource)):
        for rule in node.get("x-kubernetes-validations", []):
            assert re.search(r"`[A-Za-z0-9.]+`", rule["message"]), f"{path}: {rule['message']}"
            assert "must" in rule["message"], f"{path}: {rule['message']}"


@pytest.mark.parametrize(
    ("path", "list_keys"),
    [
        (".status.conditions", ["type"]),
        (".status.groups", ["name"]),
        (".spec.engine.env", ["name"]),
        (".spec.placement.nodeSelector", ["key"]),
    ],
    ids=["conditions", "groups", "env", "node-selector"],
)
def test_named_lists_of_model_groups_merge_by_key(path: str, list_keys: list[str]) -> None:
    node = node_at(openapi_schema(MODEL_GROUP), path)

    assert node["x-kubernetes-list-type"] == "map"
    assert node["x-kubernetes-list-map-keys"] == list_keys
    assert set(list_keys) <= set(node["items"]["required"])


def test_slo_classes_are_a_list_map_by_name_so_names_are_unique() -> None:
    classes = node_at(openapi_schema(SLO_POLICY), ".spec.classes")

    assert (classes["x-kubernetes-list-type"], classes["x-kubernetes-list-map-keys"]) == ("map", ["name"])
    assert classes["minItems"] == 1


def test_conditions_have_the_metav1_condition_schema(resource: CustomResource) -> None:
    condition = node_at(openapi_schema(resource), ".status.conditions[]")

    assert condition["required"] == ["type", "status", "lastTransitionTime", "reason", "message"]
    properties = condition["properties"]
    assert properties["type"]["maxLength"] == 316
    assert properties["status"]["enum"] == ["True", "False", "Unknown"]
    assert (properties["observedGeneration"]["format"], properties["observedGeneration"]["minimum"]) == (
        "int64",
        0,
    )
    assert (properties["lastTransitionTime"]["type"], properties["lastTransitionTime"]["format"]) == (
        "string",
        "date-time",
    )
    assert (properties["reason"]["minLength"], properties["reason"]["maxLength"]) == (1, 1024)
    assert properties["reason"]["pattern"] == "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    assert properties["message"]["maxLength"] == 32768


def test_model_group_has_status_and_scale_subresources() -> None:
    version = render_crd(MODEL_GROUP)["spec"]["versions"][0]

    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.labelSelector",
        },
    }
    schema = version["schema"]["openAPIV3Schema"]
    # The selector must be a string for HPA; the replica counts integers.
    assert node_at(schema, ".status.labelSelector")["type"] == "string"
    assert (
        node_at(schema, ".spec.replicas")["type"] == node_at(schema, ".status.replicas")["type"] == "integer"
    )


def test_slo_policy_has_a_status_subresource_and_no_scale() -> None:
    assert render_crd(SLO_POLICY)["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    ("resource", "short_name", "plural"),
    [(MODEL_GROUP, "mg", "modelgroups"), (SLO_POLICY, "slo", "slopolicies")],
    ids=RESOURCE_IDS,
)
def test_names(resource: CustomResource, short_name: str, plural: str) -> None:
    crd = render_crd(resource)

    assert crd["metadata"]["name"] == f"{plural}.goodput.dev"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == [short_name]
    assert crd["spec"]["names"]["categories"] == ["goodput"]
    versions = crd["spec"]["versions"]
    assert [(v["name"], v["served"], v["storage"]) for v in versions] == [("v1alpha1", True, True)]


def test_model_group_printer_columns() -> None:
    columns = render_crd(MODEL_GROUP)["spec"]["versions"][0]["additionalPrinterColumns"]

    default_view = [column["name"] for column in columns if column.get("priority", 0) == 0]
    wide_only = [column["name"] for column in columns if column.get("priority", 0) == 1]
    assert default_view == ["Desired", "Ready", "Updated", "Draining", "Policy", "Age"]
    assert {"Placing", "Warming", "Outdated", "Reason"} <= set(wide_only)


def test_slo_policy_printer_columns_show_the_revision_in_force() -> None:
    columns = render_crd(SLO_POLICY)["spec"]["versions"][0]["additionalPrinterColumns"]

    assert [column["name"] for column in columns if column.get("priority", 0) == 0] == [
        "Revision",
        "Mode",
        "Accepted",
        "Age",
    ]
    # A column shows only the first value a JSONPath finds, so none may point into a list but by key.
    assert not any("[*]" in column["jsonPath"] for column in columns)


def test_printer_columns_point_at_fields_of_the_schema(resource: CustomResource) -> None:
    schema = openapi_schema(resource)
    for column in render_crd(resource)["spec"]["versions"][0]["additionalPrinterColumns"]:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            continue
        field_path = re.sub(r"\[\?\(@\.type==\"\w+\"\)\]", "[]", column["jsonPath"])
        node = node_at(schema, field_path)
        expected_type = {"integer": "integer", "string": "string"}[column["type"]]
        assert node["type"] == expected_type, column["name"]


def test_rendering_is_deterministic_and_the_committed_files_are_current() -> None:
    first, second = render_crds(), render_crds()

    assert first == second
    assert stale_files(CRDS_DIR, first) == [], "crds/ is stale: run `goodput crds`"


def test_rendered_files_are_the_crds_as_yaml() -> None:
    for resource in CUSTOM_RESOURCES:
        text = render_crds()[resource.file_name]
        assert text.startswith("# Generated by `goodput crds`")
        assert yaml.safe_load(text) == render_crd(resource)


@pytest.mark.parametrize(
    ("json_schema", "openapi"),
    [
        (
            {
                "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "default": None,
                "description": "n",
            },
            {"type": "integer", "description": "n", "minimum": 1},
        ),
        (
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
        ),
        (
            {"$ref": "#/$defs/Thing", "description": "field text wins", "default": {"size": 3}},
            {
                "type": "object",
                "description": "field text wins",
                "default": {},
                "properties": {"size": {"type": "integer", "default": 3}},
            },
        ),
        (
            {"type": "array", "items": {"type": "string"}, "default": []},
            {"type": "array", "items": {"type": "string"}},
        ),
        (
            {"const": "ModelGroup", "type": "string", "title": "Kind", "description": "a\n   b"},
            {"type": "string", "description": "a b", "enum": ["ModelGroup"]},
        ),
    ],
    ids=[
        "optional-becomes-absent",
        "exclusive-bound-is-boolean",
        "ref-inlined-default-shortened",
        "empty-list-default-dropped",
        "const-title-and-wrapped-text",
    ],
)
def test_json_schema_to_openapi(json_schema: dict[str, Any], openapi: dict[str, Any]) -> None:
    definitions = {
        "Thing": {
            "type": "object",
            "title": "Thing",
            "description": "class text",
            "additionalProperties": False,
            "properties": {"size": {"type": "integer", "default": 3}},
        },
    }

    assert to_openapi(json_schema, definitions) == openapi


def test_a_union_that_kubernetes_cannot_express_is_refused() -> None:
    with pytest.raises(ValueError, match="union"):
        to_openapi({"anyOf": [{"type": "integer"}, {"type": "string"}]}, {})
