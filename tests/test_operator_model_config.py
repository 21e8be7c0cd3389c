"""The config.json a ModelGroup's `profile.modelConfigRef` names, read from its ConfigMap by the
operator (goodput.operator.model_config_source), and what the autoscaler does with it."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_autoscaler import IDLE, NAMESPACE, Harness, MemoryApi, Metrics, model_group_body, policy_body

from goodput.api.modelgroup import ModelGroupSpec
from goodput.operator.kube import KubeError, KubeUnreachableError
from goodput.operator.model_config_source import ModelConfigReader, configmap_path
from goodput.simulator.published import QWEN3_30B_A3B

QWEN3_MOE = dict(QWEN3_30B_A3B)
REFERENCED_PROFILE = {"gpu": "h100-80g", "maxNumSeqs": 64, "modelConfigRef": {"name": "qwen3-config"}}


def configmap(data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "qwen3-config"}, "data": data}


@dataclass
class ConfigMaps:
    """GET of ConfigMaps by path: a body, or the KubeError the API server would answer."""

    objects: dict[str, dict[str, Any] | KubeError] = field(default_factory=dict)
    gets: list[str] = field(default_factory=list)

    async def fetch(self, path: str) -> Any:
        self.gets.append(path)
        found = self.objects.get(path, KubeError(404, "NotFound", f"configmaps {path} not found"))
        if isinstance(found, KubeError):
            raise found
        return copy.deepcopy(found)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def spec(profile: dict[str, Any] = REFERENCED_PROFILE) -> ModelGroupSpec:
    return ModelGroupSpec.model_validate(model_group_body(profile=profile)["spec"])


PATH = configmap_path(NAMESPACE, "qwen3-config")


@pytest.mark.parametrize(
    ("stored", "mentions"),
    [
        (None, ("'qwen3-config'", "does not exist", "kubectl create configmap qwen3-config")),
        (configmap({"model.json": "{}"}), ("has no key 'config.json'", "model.json", "modelConfigRef.key")),
        (configmap({"config.json": "{not json"}), ("is not JSON",)),
        (configmap({"config.json": "[1, 2]"}), ("not a JSON object",)),
        (KubeError(403, "Forbidden", "configmaps is forbidden"), ("may not be read", "get on configmaps")),
    ],
    ids=["missing", "wrong-key", "not-json", "not-an-object", "forbidden"],
)
def test_a_configmap_that_holds_no_config_json_says_what_to_do(
    stored: Any, mentions: tuple[str, ...]
) -> None:
    maps = ConfigMaps({PATH: stored} if stored is not None else {})
    result = asyncio.run(ModelConfigReader(maps.fetch, clock=Clock()).read(NAMESPACE, spec()))
    assert isinstance(result, str)
    assert all(text in result for text in mentions), result


def test_a_config_json_is_read_once_per_refresh_and_a_problem_retried_sooner() -> None:
    maps, clock = ConfigMaps(), Clock()
    reader = ModelConfigReader(maps.fetch, clock=clock, refresh_seconds=300, retry_seconds=30)

    assert isinstance(asyncio.run(reader.read(NAMESPACE, spec())), str)
    maps.objects[PATH] = configmap({"config.json": json.dumps(QWEN3_MOE)})
    clock.now = 10
    assert isinstance(asyncio.run(reader.read(NAMESPACE, spec())), str), "still the cached answer"
    clock.now = 31
    assert asyncio.run(reader.read(NAMESPACE, spec())) == QWEN3_MOE, "created: read within the retry"
    clock.now = 300
    assert asyncio.run(reader.read(NAMESPACE, spec())) == QWEN3_MOE
    assert len(maps.gets) == 2
    assert asyncio.run(reader.read(NAMESPACE, spec({"gpu": "h100-80g"}))) is None
    assert len(maps.gets) == 2, "a profile without modelConfigRef reads nothing"


def test_a_moment_without_an_answer_keeps_the_last_config_json() -> None:
    maps, clock = ConfigMaps({PATH: configmap({"config.json": json.dumps(QWEN3_MOE)})}), Clock()
    reader = ModelConfigReader(maps.fetch, clock=clock, refresh_seconds=300, retry_seconds=30)
    assert asyncio.run(reader.read(NAMESPACE, spec())) == QWEN3_MOE

    maps.objects[PATH] = KubeUnreachableError("GET: connection refused")
    clock.now = 301
    assert asyncio.run(reader.read(NAMESPACE, spec())) == QWEN3_MOE
    fresh = ModelConfigReader(maps.fetch, clock=clock)
    unread = asyncio.run(fresh.read(NAMESPACE, spec()))
    assert isinstance(unread, str) and "could not be read" in unread


@dataclass
class ApiWithConfigMaps(MemoryApi):
    """The autoscaler tests' API server, which also answers GETs of the namespace's ConfigMaps."""

    configmaps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def request(self, verb: str, resource: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        if resource != "configmaps":
            return super().request(verb, resource, path, body, **kwargs)
        assert verb == "GET"
        if path not in self.configmaps:
            raise KubeError(404, "NotFound", f'configmaps "{path.rsplit("/", 1)[-1]}" not found')
        return copy.deepcopy(self.configmaps[path])


def harness_with(configmaps: dict[str, dict[str, Any]]) -> Harness:
    body = model_group_body(profile=REFERENCED_PROFILE, model={"name": "Qwen/Qwen3-30B-A3B"})
    api = ApiWithConfigMaps(body, configmaps=configmaps)
    return Harness(api, Metrics({"g0": IDLE}), {(NAMESPACE, "chat"): [policy_body()]})


def test_a_missing_configmap_stops_the_autoscaler_with_a_condition_naming_it() -> None:
    h = harness_with({})
    h.tick()

    assert h.condition("ScalingActive") == ("False", "InvalidSpec")
    scaling = next(c for c in h.status["conditions"] if c["type"] == "ScalingActive")
    assert (
        "ConfigMap 'qwen3-config'" in scaling["message"] and "kubectl create configmap" in scaling["message"]
    )
    assert h.api.of("scale") == [], "nothing is scaled on a made-up figure"


def test_the_configmaps_config_json_prices_the_model_and_the_autoscaler_decides() -> None:
    h = harness_with({PATH: configmap({"config.json": json.dumps(QWEN3_MOE)})})
    outcome = h.tick()

    assert h.condition("ScalingActive") == ("True", "SignalsComputed")
    assert outcome.active is not None
    assert h.autoscaler is not None
    (memory,) = h.autoscaler.memories.values()
    (profile,) = memory.profiles.values()
    assert profile.step_model.expert_read_seconds > 0, "priced as the mixture of experts it reads"
