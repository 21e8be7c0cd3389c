"""The CRDs in a real API server: install, validation (schema and CEL), defaults, explain, scale, columns.

Fixtures come from e2e/conftest.py: `cluster` (the local control plane), `goodput_crds` (crds/
applied and Established) and `namespace` (a fresh namespace per test).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.api.base import wire_dict
from goodput.api.conditions import Condition
from goodput.api.labels import leader_label_selector
from goodput.api.modelgroup import ModelGroup, ModelGroupSpec, ModelGroupStatus, Parallelism, ScalingDecision
from goodput.api.reasons import ConditionType, Reason, Signal
from goodput.api.slopolicy import SloPolicy
from goodput.testbed.cluster.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("goodput_crds")]

SAMPLES = Path(__file__).resolve().parent.parent / "manifests" / "samples"
VALID = sorted(SAMPLES.glob("*.yaml"))
INVALID = sorted((SAMPLES / "invalid").glob("*.yaml"))
MODELS: dict[str, type[ModelGroup] | type[SloPolicy]] = {"ModelGroup": ModelGroup, "SLOPolicy": SloPolicy}
LLAMA_8B = SAMPLES / "modelgroup-llama-8b-tp1.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def expected_message(path: Path) -> str:
    match = re.search(r"^# expect: (.+)$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} has no '# expect:' line"
    return match.group(1).strip()


def get_json(cluster: Any, namespace: str, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(cluster.kubectl("get", "-n", namespace, *args, "-o", "json").stdout)
    return result


def apply(cluster: Any, namespace: str, document: dict[str, Any], *, check: bool = True) -> Any:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document), check=check)


def test_crds_are_established_with_their_short_names(cluster: Any) -> None:
    for crd in ("modelgroups.goodput.dev", "slopolicies.goodput.dev"):
        established = cluster.kubectl(
            "get", "crd", crd, "-o", 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
        ).stdout
        assert established == "True", crd

    resources = cluster.kubectl("api-resources", "--api-group=goodput.dev", "--no-headers").stdout
    rows = {line.split()[0]: line.split() for line in resources.splitlines()}
    assert rows["modelgroups"][1] == "mg"
    assert rows["slopolicies"][1] == "slo"


@pytest.mark.parametrize("path", VALID, ids=lambda path: path.name)
def test_valid_sample_is_accepted_and_defaulted_as_the_models_default_it(
    cluster: Any, namespace: str, path: Path
) -> None:
    (document,) = documents(path)

    apply(cluster, namespace, document)

    kind, name = document["kind"], document["metadata"]["name"]
    live = get_json(cluster, namespace, f"{kind.lower()}/{name}")
    model = MODELS[kind]
    assert model.model_validate(live).spec == model.model_validate(document).spec
    assert live["status"]["observedGeneration"] == -1


@pytest.mark.parametrize("path", INVALID, ids=lambda path: path.name)
def test_invalid_sample_is_rejected_with_its_message(cluster: Any, namespace: str, path: Path) -> None:
    *earlier, last = documents(path)
    for document in earlier:
        apply(cluster, namespace, document)

    result = apply(cluster, namespace, last, check=False)

    assert result.returncode != 0, f"{path.name} was accepted"
    assert expected_message(path) in result.stderr


def explained(cluster: Any, field: str) -> str:
    result = cluster.kubectl("explain", field, check=False)
    return " ".join(result.stdout.split()) if result.returncode == 0 else ""


def test_kubectl_explain_shows_the_field_descriptions(cluster: Any) -> None:
    parallelism = ModelGroupSpec.model_fields["parallelism"]

    text = wait_for(
        lambda: explained(cluster, "modelgroup.spec.parallelism"),
        timeout_seconds=60,
        describe="the ModelGroup schema to be published for kubectl explain",
    )

    assert " ".join(str(parallelism.description).split()) in text
    for name, field in Parallelism.model_fields.items():
        assert str(field.alias) in text, name
        assert " ".join(str(field.description).split()) in text, name


def test_kubectl_scale_writes_spec_replicas_within_the_bounds(cluster: Any, namespace: str) -> None:
    (document,) = documents(LLAMA_8B)
    apply(cluster, namespace, document)
    target = f"modelgroup/{document['metadata']['name']}"

    cluster.kubectl("scale", "-n", namespace, target, "--replicas=3")
    assert get_json(cluster, namespace, target)["spec"]["replicas"] == 3

    too_many = cluster.kubectl("scale", "-n", namespace, target, "--replicas=9", check=False)
    assert too_many.returncode != 0
    assert "`replicas` must be less than or equal to `maxReplicas`" in too_many.stderr
    assert get_json(cluster, namespace, target)["spec"]["replicas"] == 3


def test_lowering_max_replicas_below_the_running_count_is_accepted(cluster: Any, namespace: str) -> None:
    (document,) = documents(LLAMA_8B)
    apply(cluster, namespace, document)
    target = f"modelgroup/{document['metadata']['name']}"
    cluster.kubectl("scale", "-n", namespace, target, "--replicas=6")

    cluster.kubectl("patch", "-n", namespace, target, "--type=merge", "-p", '{"spec": {"maxReplicas": 4}}')

    spec = get_json(cluster, namespace, target)["spec"]
    assert (spec["replicas"], spec["maxReplicas"]) == (6, 4)


def test_status_written_from_the_models_is_stored_and_feeds_the_scale_subresource(
    cluster: Any, namespace: str
) -> None:
    (document,) = documents(LLAMA_8B)
    apply(cluster, namespace, document)
    name = document["metadata"]["name"]
    now = ModelGroup.model_validate(
        get_json(cluster, namespace, f"modelgroup/{name}")
    ).metadata.creation_timestamp
    assert now is not None
    decision = ScalingDecision(
        time=now,
        from_replicas=1,
        to_replicas=2,
        reason=Reason.DESIRED_WITHIN_RANGE,
        signal=Signal.QUEUE_WORK,
        policy_revision="interactive-2026-07-16.3",
        mode="Active",
    )
    status = ModelGroupStatus(
        observed_generation=1,
        replicas=1,
        label_selector=leader_label_selector(name),
        desired_groups=2,
        ready_groups=1,
        warming_groups=1,
        last_decision=decision,
        decisions=(decision,),
        conditions=(
            Condition(
                type=ConditionType.READY,
                status="False",
                reason=Reason.GROUPS_NOT_READY,
                message="1 of 2 groups ready",
                observed_generation=1,
                last_transition_time=now,
            ),
        ),
    )

    cluster.kubectl(
        "patch",
        "-n",
        namespace,
        f"modelgroup/{name}",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": wire_dict(status)}),
    )

    live = ModelGroup.model_validate(get_json(cluster, namespace, f"modelgroup/{name}"))
    assert live.status == status
    scale = get_json(cluster, namespace, f"modelgroup/{name}", "--subresource=scale")
    assert scale["status"] == {
        "replicas": 1,
        "selector": "goodput.dev/model-group=llama-8b,goodput.dev/rank=0",
    }


def header_and_rows(output: str) -> tuple[list[str], list[list[str]]]:
    lines = output.strip().splitlines()
    return lines[0].split(), [line.split() for line in lines[1:]]


def test_kubectl_get_shows_the_printer_columns(cluster: Any, namespace: str) -> None:
    for path in VALID:
        apply(cluster, namespace, documents(path)[0])

    header, rows = header_and_rows(cluster.kubectl("get", "mg", "-n", namespace).stdout)
    assert header == ["NAME", "DESIRED", "READY", "UPDATED", "DRAINING", "POLICY", "AGE"]
    by_name = {row[0]: row for row in rows}
    assert by_name["llama-8b"][1] == "2"
    assert by_name["llama-8b"][5] == "interactive"
    assert by_name["llama-70b"][5] == "batch"

    wide_header, _ = header_and_rows(cluster.kubectl("get", "mg", "-n", namespace, "-o", "wide").stdout)
    assert wide_header == [
        *header,
        "PLACING",
        "PROVISIONING",
        "WARMING",
        "OUTDATED",
        "MAX",
        "DECISION",
        "REASON",
    ]

    slo_header, slo_rows = header_and_rows(cluster.kubectl("get", "slo", "-n", namespace).stdout)
    assert slo_header == ["NAME", "REVISION", "MODE", "ACCEPTED", "AGE"]
    assert {row[0]: row[1:3] for row in slo_rows}["batch"] == ["batch-2026-07-01.1", "Active"]

    everything = cluster.kubectl("get", "goodput", "-n", namespace, "-o", "name").stdout.split()
    assert len(everything) == len(VALID)
