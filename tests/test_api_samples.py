"""The samples in manifests/samples/ against the models.

Valid samples must parse and round-trip unchanged. Invalid samples carry `# expect: <message>`;
the API server's verdict is checked in e2e/test_crds.py, and here the models must agree: a sample
broken by a rule with a Python twin must fail with the same message, one broken by a schema
constraint must fail too, and one broken only by a transition rule (which needs the old object)
must parse document by document.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from goodput.api import modelgroup, slopolicy
from goodput.api.base import CelRule, SpecModel, StatusModel
from goodput.api.crd import MODEL_GROUP, SLO_POLICY, apply_defaults, openapi_schema
from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy

SAMPLES = Path(__file__).resolve().parent.parent / "manifests" / "samples"
VALID = sorted(SAMPLES.glob("*.yaml"))
INVALID = sorted((SAMPLES / "invalid").glob("*.yaml"))
MODELS: dict[str, type[ModelGroup] | type[SloPolicy]] = {"ModelGroup": ModelGroup, "SLOPolicy": SloPolicy}
CUSTOM_RESOURCES = {"ModelGroup": MODEL_GROUP, "SLOPolicy": SLO_POLICY}


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def expected_message(path: Path) -> str:
    match = re.search(r"^# expect: (.+)$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} must say what the API server answers, in a '# expect: ...' line"
    return match.group(1).strip()


def all_cel_rules() -> list[CelRule]:
    models = [
        value
        for module in (modelgroup, slopolicy)
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, SpecModel | StatusModel)
    ]
    return [rule for model in models for rule in model.cel_rules]


def rule_with_message(expected: str) -> CelRule | None:
    matches = [rule for rule in all_cel_rules() if expected in rule.message]
    assert len(matches) <= 1, f"{expected!r} matches several rules"
    return matches[0] if matches else None


def without_empty(value: Any) -> Any:
    """Nulls, empty lists and empty objects removed: Kubernetes does not tell them from absent."""
    if isinstance(value, dict):
        members = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in members.items() if item not in (None, [], {})}
    if isinstance(value, list):
        return [without_empty(item) for item in value]
    return value


def test_the_samples_a_user_needs_exist() -> None:
    kinds = [documents(path)[0]["kind"] for path in VALID]

    assert kinds.count("ModelGroup") >= 2
    assert kinds.count("SLOPolicy") >= 2
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", VALID, ids=lambda path: path.name)
def test_valid_sample_round_trips_unchanged(path: Path) -> None:
    (document,) = documents(path)

    resource = MODELS[document["kind"]].model_validate(document)

    assert resource.model_dump(mode="json", exclude_unset=True) == document


@pytest.mark.parametrize("path", VALID, ids=lambda path: path.name)
def test_api_server_defaulting_gives_the_same_object_as_the_models_defaults(path: Path) -> None:
    (document,) = documents(path)
    model = MODELS[document["kind"]]

    defaulted_by_schema = apply_defaults(openapi_schema(CUSTOM_RESOURCES[document["kind"]]), document)
    defaulted_by_model = model.model_validate(document).model_dump(mode="json", exclude_none=True)

    assert without_empty(defaulted_by_schema) == without_empty(defaulted_by_model)
    assert model.model_validate(defaulted_by_schema) == model.model_validate(document)


def test_the_70b_sample_is_two_pods_of_eight_gpus() -> None:
    (document,) = documents(SAMPLES / "modelgroup-llama-70b-tp8-pp2.yaml")

    spec = ModelGroup.model_validate(document).spec

    assert (spec.parallelism.gpus_per_group, spec.parallelism.pods_per_group) == (16, 2)


def test_samples_bind_to_the_sample_policies() -> None:
    policies = {documents(path)[0]["metadata"]["name"] for path in VALID if "slopolicy" in path.name}
    references = [
        ModelGroup.model_validate(documents(path)[0]).spec.policy_ref
        for path in VALID
        if "modelgroup" in path.name
    ]

    assert {reference.name for reference in references if reference is not None} <= policies


@pytest.mark.parametrize("path", INVALID, ids=lambda path: path.name)
def test_invalid_sample_is_rejected_by_the_models_as_by_the_api_server(path: Path) -> None:
    expected = expected_message(path)
    *earlier, last = documents(path)
    model = MODELS[last["kind"]]
    rule = rule_with_message(expected)

    for document in earlier:
        model.model_validate(document)
    if earlier or (rule is not None and rule.check is None):
        # A transition rule: each object is fine alone, only the change is not.
        assert rule is not None and rule.check is None, (
            f"{path.name}: several documents need a transition rule"
        )
        model.model_validate(last)
    elif rule is not None:
        with pytest.raises(ValidationError, match=re.escape(rule.message)):
            model.model_validate(last)
    else:
        with pytest.raises(ValidationError):
            model.model_validate(last)


def test_every_rule_with_a_message_is_exercised_by_an_invalid_sample() -> None:
    expectations = [expected_message(path) for path in INVALID]
    untested = [
        rule.message
        for rule in all_cel_rules()
        if not any(expected in rule.message for expected in expectations)
    ]

    assert untested == []
