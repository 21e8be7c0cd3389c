"""The API models as the operator uses them: defaults, wire names, validation, derived figures."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from goodput.api.base import wire_dict, wire_name
from goodput.api.labels import leader_label_selector
from goodput.api.modelgroup import (
    ModelGroup,
    ModelGroupSpec,
    ModelGroupStatus,
    Parallelism,
    ScalingDecision,
)
from goodput.api.slopolicy import SloPolicySpec
from goodput.controllers.autoscale.model import ScalingPolicy
from goodput.controllers.compile.scaling import GroupBounds, bounded_scaling_policy


def minimal_model_group_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        "parallelism": {"gpusPerPod": 1},
        "maxReplicas": 4,
    }
    spec.update(overrides)
    return spec


def minimal_policy_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "revision": "r1",
        "classes": [{"name": "chat", "ttftSeconds": 1, "itlSeconds": 0.08}],
    }
    spec.update(overrides)
    return spec


@pytest.mark.parametrize(
    ("python_name", "wire"),
    [
        ("gpus_per_pod", "gpusPerPod"),
        ("e2e_seconds", "e2eSeconds"),
        ("kv_cache", "kvCache"),
        ("capacity_work_seconds_per_second", "capacityWorkSecondsPerSecond"),
        ("model", "model"),
    ],
    ids=["plain", "digit-inside-word", "short-word", "long", "single-word"],
)
def test_wire_names_are_camel_case_with_digits_kept_in_their_word(python_name: str, wire: str) -> None:
    assert wire_name(python_name) == wire


def test_a_minimal_model_groups_defaults_hold_together() -> None:
    """The defaults a minimal ModelGroup gets must work with each other, whatever their values: a
    warm-up fits within start-up, a pod's shutdown within a drain, a group is not scaled in before
    it could have served, and the replica bounds hold `replicas`. (The values themselves are
    published by `goodput crds` in the CRD and docs/api-reference.md, and checked there.)"""
    spec = ModelGroupSpec.model_validate(minimal_model_group_spec())

    assert spec.min_replicas <= spec.replicas <= spec.max_replicas
    assert spec.warm_replicas <= spec.max_replicas
    assert spec.readiness.warmup.timeout_seconds < spec.engine.startup_timeout_seconds
    assert spec.engine.shutdown_timeout_seconds < spec.drain.max_seconds
    assert 0 < spec.placement.schedule_timeout_seconds < spec.engine.startup_timeout_seconds
    assert spec.drain.min_lifetime_seconds <= spec.drain.max_seconds
    assert spec.readiness.warmup.max_tokens >= 1 and spec.readiness.warmup.prompt
    # A default the API server applies must be one the model accepts when it is written out.
    assert ModelGroupSpec.model_validate(spec.model_dump(mode="json", by_alias=True)) == spec
    # Without the health agent nothing answers the NCCL and revision checks: they are off by default.
    assert (spec.readiness.nccl_check, spec.readiness.revision_check) == ("Skip", False)


def test_a_minimal_slo_policys_defaults_are_the_controllers_defaults() -> None:
    """One default behaviour, not two: a minimal SLOPolicy compiles to the decision pipeline's own
    defaults (`ScalingPolicy()`), so a policy that omits a field behaves as the controllers document,
    and the defaults hold together. (The values are published by `goodput crds` in the CRD and
    docs/api-reference.md, and checked there.)"""
    spec = SloPolicySpec.model_validate(minimal_policy_spec())
    compiled = bounded_scaling_policy(GroupBounds(1, 4, 0), spec)
    controllers_default = ScalingPolicy()

    for field_name in ("mode", "interval_seconds", "signals", "scale_up", "scale_down", "staleness"):
        assert getattr(compiled, field_name) == getattr(controllers_default, field_name), field_name
    chat = spec.classes[0]
    assert 0 < chat.percentile <= 1 and 0 < chat.attainment <= 1
    autoscaling = spec.autoscaling
    # HPA's asymmetry: never slower to scale up than to scale down.
    assert (
        autoscaling.scale_up.stabilization_window_seconds
        <= autoscaling.scale_down.stabilization_window_seconds
    )
    # A sample stays fresh for at least one decision, and attainment is judged over several.
    assert autoscaling.metrics.max_age_seconds >= autoscaling.interval_seconds
    assert spec.goodput.window_seconds >= autoscaling.interval_seconds
    # A default the API server applies must be one the model accepts when it is written out.
    assert SloPolicySpec.model_validate(spec.model_dump(mode="json", by_alias=True)) == spec


def test_status_before_the_first_visit_says_never_observed() -> None:
    status = ModelGroupStatus()

    assert status.observed_generation == -1
    assert (status.replicas, status.ready_groups, status.groups, status.conditions) == (0, 0, (), ())


def test_models_accept_python_names_and_write_wire_names() -> None:
    by_python_name = ModelGroupSpec(
        model={"name": "m"},
        engine={"image": "i"},
        parallelism=Parallelism(tensor=8, pipeline=2, gpus_per_pod=8),
        max_replicas=3,
    )

    wire = wire_dict(by_python_name)

    assert wire["parallelism"] == {"tensor": 8, "pipeline": 2, "gpusPerPod": 8}
    assert wire["maxReplicas"] == 3
    assert ModelGroupSpec.model_validate(wire) == by_python_name


@pytest.mark.parametrize(
    ("spec_overrides", "error_fragment"),
    [
        ({"maxReplica": 4}, "Extra inputs are not permitted"),
        ({"parallelism": {"gpusPerPod": 1, "tensors": 2}}, "Extra inputs are not permitted"),
        ({"maxReplicas": 0}, "greater than or equal to 1"),
        ({"engine": {"image": "i", "port": 70000}}, "less than or equal to 65535"),
        ({"placement": {"mode": "Sometimes"}}, "'Required' or 'Preferred'"),
        (
            {"engine": {"image": "i", "resources": {"requests": {"memory": "lots"}}}},
            "not a Kubernetes quantity",
        ),
        ({"policyRef": {"name": "Not_A_Name"}}, "String should match pattern"),
    ],
    ids=[
        "misspelt-field",
        "misspelt-nested-field",
        "no-budget",
        "port-range",
        "unknown-enum",
        "bad-quantity",
        "bad-reference",
    ],
)
def test_model_group_spec_rejects_what_the_schema_rejects(
    spec_overrides: dict[str, Any], error_fragment: str
) -> None:
    with pytest.raises(ValidationError, match=error_fragment):
        ModelGroupSpec.model_validate(minimal_model_group_spec(**spec_overrides))


def test_specs_are_immutable_values() -> None:
    spec = ModelGroupSpec.model_validate(minimal_model_group_spec())

    with pytest.raises(ValidationError, match="frozen"):
        spec.replicas = 3  # type: ignore[misc]
    assert spec == ModelGroupSpec.model_validate(minimal_model_group_spec())


@pytest.mark.parametrize(
    ("quantity", "valid"),
    [
        ("4", True),
        (4, True),
        ("500m", True),
        ("32Gi", True),
        ("1e3", True),
        ("1.5", True),
        ("4 GB", False),
        ("Gi", False),
        ("", False),
    ],
    ids=[
        "string-int",
        "int",
        "milli",
        "binary-suffix",
        "exponent",
        "decimal",
        "space-and-si-word",
        "no-number",
        "empty",
    ],
)
def test_resource_quantities_follow_the_kubernetes_grammar(quantity: int | str, valid: bool) -> None:
    spec = minimal_model_group_spec(engine={"image": "i", "resources": {"limits": {"memory": quantity}}})

    if valid:
        assert ModelGroupSpec.model_validate(spec).engine.resources.limits["memory"] == quantity
    else:
        with pytest.raises(ValidationError):
            ModelGroupSpec.model_validate(spec)


@dataclass(frozen=True)
class ParallelismCase:
    tensor: int
    pipeline: int
    gpus_per_pod: int
    pods_per_group: int


@pytest.mark.parametrize(
    "case",
    [
        ParallelismCase(1, 1, 1, 1),
        ParallelismCase(8, 1, 8, 1),
        ParallelismCase(8, 2, 8, 2),
        ParallelismCase(4, 4, 4, 4),
        ParallelismCase(16, 1, 8, 2),
    ],
    ids=["tp1", "tp8-one-node", "tp8-pp2-two-nodes", "tp4-pp4-four-nodes", "tp16-across-two-nodes"],
)
def test_pods_per_group_splits_the_group_evenly(case: ParallelismCase) -> None:
    parallelism = Parallelism(tensor=case.tensor, pipeline=case.pipeline, gpus_per_pod=case.gpus_per_pod)

    assert parallelism.pods_per_group == case.pods_per_group
    assert parallelism.pods_per_group * parallelism.gpus_per_pod == case.tensor * case.pipeline


@given(
    tensor=st.integers(1, 64),
    pipeline=st.integers(1, 64),
    gpus_per_pod=st.integers(1, 64),
)
def test_parallelism_is_valid_exactly_when_pods_hold_equal_whole_shares(
    tensor: int, pipeline: int, gpus_per_pod: int
) -> None:
    data = {"tensor": tensor, "pipeline": pipeline, "gpusPerPod": gpus_per_pod}
    if (tensor * pipeline) % gpus_per_pod == 0:
        parallelism = Parallelism.model_validate(data)
        assert parallelism.pods_per_group >= 1
        assert parallelism.pods_per_group * gpus_per_pod == tensor * pipeline
    else:
        with pytest.raises(ValidationError, match="must divide the product"):
            Parallelism.model_validate(data)


def test_replicas_outside_bounds_parse_because_only_a_change_to_replicas_is_rejected() -> None:
    # The API server accepts lowering maxReplicas below the running count (the operator then
    # drains down), so the operator must be able to read such an object.
    spec = ModelGroupSpec.model_validate(minimal_model_group_spec(replicas=6, maxReplicas=4))

    assert (spec.replicas, spec.max_replicas) == (6, 4)


def test_status_timestamps_are_utc_whole_seconds_on_the_wire() -> None:
    local = timezone(timedelta(hours=9))
    decision = ScalingDecision(
        time=datetime(2026, 7, 16, 18, 30, 5, 987_654, tzinfo=local),
        from_replicas=2,
        to_replicas=3,
        reason="DesiredWithinRange",
        signal="queueWork",
        policy_revision="r1",
        mode="Active",
    )

    assert decision.time == datetime(2026, 7, 16, 9, 30, 5, tzinfo=UTC)
    assert wire_dict(decision)["time"] == "2026-07-16T09:30:05Z"
    assert ScalingDecision.model_validate(wire_dict(decision)) == decision


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValidationError, match="time zone"):
        ScalingDecision(
            time=datetime(2026, 7, 16, 9, 30),
            from_replicas=2,
            to_replicas=3,
            reason="DesiredWithinRange",
            signal="queueWork",
            policy_revision="r1",
            mode="Active",
        )


def test_status_ignores_fields_it_does_not_know_so_upgrades_can_read_old_status() -> None:
    status = ModelGroupStatus.model_validate({"replicas": 2, "fieldFromAnotherVersion": {"x": 1}})

    assert status.replicas == 2


def test_resource_round_trips_with_metadata_the_api_server_owns() -> None:
    live = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {
            "name": "llama",
            "namespace": "serving",
            "generation": 4,
            "uid": "0c5f",
            "resourceVersion": "981",
            "creationTimestamp": "2026-07-16T09:30:05Z",
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": minimal_model_group_spec(),
        "status": {"observedGeneration": 3, "replicas": 1, "labelSelector": leader_label_selector("llama")},
    }

    group = ModelGroup.model_validate(live)

    assert group.metadata.generation == 4
    assert group.status.label_selector == "goodput.dev/model-group=llama,goodput.dev/rank=0"
    assert group.model_dump(mode="json", exclude_unset=True) == live
