"""The autoscaler's tick against an in-memory API server and a metrics source the test controls.

The API server keeps one ModelGroup: merge patches with resourceVersion preconditions, and
the status by server-side apply with field managers (`server_side_apply`); the metrics source
returns the `GroupMetrics` a test sets, or fails as a Prometheus that is down does. What is
checked is what the operator writes, and when not.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import kopf
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from server_side_apply import AppliedStatus

from goodput.api.labels import ANNOTATION_LAST_RESCALE
from goodput.controllers.autoscale.model import GatewayObservation, GroupMetrics
from goodput.controllers.events import EventRecord
from goodput.controllers.ownership import GROUP_STATUS
from goodput.controllers.pools import PoolKey
from goodput.estimators.attainment import Histogram
from goodput.operator.autoscaler import STATE_ANNOTATION, Autoscaler, AutoscalerSettings
from goodput.operator.autoscaler_daemon import is_bound
from goodput.operator.autoscaler_metrics import AutoscalerMetrics
from goodput.operator.autoscaler_record import staggered_refresh_seconds, with_own_status
from goodput.operator.kube import KubeError, KubeUnreachableError
from goodput.operator.metrics_source import MetricsReading, MetricsUnavailableError
from goodput.operator.promql import SeriesLabels, Windows
from goodput.operator.settings import Settings

NAMESPACE, NAME = "serving", "llama"
START = 1_800_000_000.0


def model_group_body(replicas: int = 1, ready: int = 1, **spec: Any) -> dict[str, Any]:
    groups = [
        {"name": f"g{index}", "state": "Ready", "createdAt": "2027-01-15T08:00:00Z"} for index in range(ready)
    ]
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "generation": 4, "resourceVersion": "100"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": 4,
            "policyRef": {"name": "chat"},
            "profile": {"gpu": "h100-80g", "maxNumSeqs": 2, "maxNumBatchedTokens": 2048},
            **spec,
        },
        "status": {"readyGroups": ready, "groups": groups},
    }


def policy_body(
    name: str = "chat", *, revision: str = "r1", mode: str = "Active", window: int = 60
) -> dict[str, Any]:
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "SLOPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "revision": revision,
            "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.05}],
            "goodput": {"windowSeconds": 30},
            "autoscaling": {
                "mode": mode,
                "intervalSeconds": 10,
                "signals": {"goodput": {"enabled": False}},
                # A step limit below maxReplicas, so that an overloaded group meets it.
                "scaleUp": {"policies": [{"type": "Groups", "value": 2, "periodSeconds": 10}]},
                "scaleDown": {
                    "stabilizationWindowSeconds": window,
                    "policies": [{"type": "Groups", "value": 1, "periodSeconds": 10}],
                },
            },
        },
    }


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class MemoryApi:
    """One ModelGroup behind GET, PATCH (the count with its record) and server-side apply (status)."""

    body: dict[str, Any]
    writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    """Writes ('object') whose next one answers 409 whatever its precondition."""
    failure: KubeError | None = None
    applied: AppliedStatus = field(default_factory=AppliedStatus)
    gets: int = 0

    def __post_init__(self) -> None:
        # The status the test starts from is the group controller's, at the version the test gave.
        version = self.body["metadata"]["resourceVersion"]
        self.group_controller_applies(self.body.get("status") or {})
        self.body["metadata"]["resourceVersion"] = version

    def group_controller_applies(self, status: Mapping[str, Any]) -> None:
        self.apply_custom_status(
            "modelgroups",
            NAMESPACE,
            NAME,
            {"metadata": {"name": NAME, "namespace": NAMESPACE}, "status": status},
            field_manager=GROUP_STATUS.field_manager,
        )

    def apply_custom_status(
        self, plural: str, namespace: str, name: str, body: Mapping[str, Any], *, field_manager: str
    ) -> Any:
        assert (plural, namespace, name) == ("modelgroups", NAMESPACE, NAME)
        assert body["metadata"] == {"name": NAME, "namespace": NAMESPACE}
        if field_manager != GROUP_STATUS.field_manager:
            self.writes.append(("status", copy.deepcopy(dict(body))))
        self.applied.status = self.body.setdefault("status", {})
        self.applied.apply(body, field_manager)
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def request(self, verb: str, resource: str, path: str, body: Any = None, **_: Any) -> Any:
        assert (verb, path) == (
            "GET",
            f"/apis/goodput.dev/v1alpha1/namespaces/{NAMESPACE}/modelgroups/{NAME}",
        )
        self.gets += 1
        return copy.deepcopy(self.body)

    def patch_custom(
        self,
        plural: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> Any:
        kind = subresource or "object"
        assert kind == "object", "the count is written on the object with its record; status by apply"
        if kind in self.conflicts:
            self.conflicts.remove(kind)
            raise KubeError(409, "Conflict", "the object has been modified")
        if self.failure is not None:
            raise self.failure
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != self.body["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        self.writes.append((kind, copy.deepcopy(dict(patch))))
        if "spec" in patch:
            self.body["spec"]["replicas"] = patch["spec"]["replicas"]
            self.body["metadata"]["generation"] += 1
        merge(self.body["metadata"], {k: v for k, v in patch["metadata"].items() if k != "resourceVersion"})
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return {"metadata": {"resourceVersion": self.body["metadata"]["resourceVersion"]}}

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [patch for written, patch in self.writes if written == kind]


@dataclass
class Metrics:
    """What Prometheus would say, per group; `down` makes it fail as an unreachable server does."""

    groups: dict[str, GroupMetrics] = field(default_factory=dict)
    down: bool = False
    reads: list[Windows] = field(default_factory=list)
    gateway: GatewayObservation | None = None

    async def read(self, namespace: str, model_group: str, windows: Windows) -> MetricsReading:
        self.reads.append(windows)
        if self.down:
            raise MetricsUnavailableError(
                "Prometheus at http://prometheus:9090 is unreachable: Connection refused"
            )
        return MetricsReading(dict(self.groups), self.gateway)


IDLE = GroupMetrics(age_seconds=2.0)
OVERLOADED = GroupMetrics(
    age_seconds=2.0,
    waiting_requests=40.0,
    running_requests=2.0,
    kv_usage_fraction=0.01,
    prompt_tokens_per_second=1536.0,
    generation_tokens_per_second=384.0,
    prompt_tokens_sum=256.0,
    prompt_tokens_count=1.0,
    generation_tokens_sum=64.0,
    generation_tokens_count=1.0,
)


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    api: MemoryApi
    metrics: Metrics
    policies: dict[tuple[str, str], list[dict[str, Any]]]
    clock: Clock = field(default_factory=Clock)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    events: list[EventRecord] = field(default_factory=list)
    autoscaler: Autoscaler | None = None

    def __post_init__(self) -> None:
        self.autoscaler = self.new_autoscaler()

    def new_autoscaler(self) -> Autoscaler:
        """A fresh process: no memory but what the ModelGroup holds."""
        self.registry = CollectorRegistry()
        settings = AutoscalerSettings(state_refresh_seconds=30.0)
        return Autoscaler(
            self.api, self.metrics, AutoscalerMetrics(self.registry), settings, clock=self.clock
        )

    def tick(self, at: float | None = None, watched: Mapping[str, Any] | None = None) -> Any:
        """One tick; with `watched`, on that copy of the ModelGroup (as kopf's watch delivered it)."""
        if at is not None:
            self.clock.now = START + at
        assert self.autoscaler is not None
        return asyncio.run(self.autoscaler.tick(NAMESPACE, NAME, self.policies, self.post, watched=watched))

    def watched(self) -> dict[str, Any]:
        """The ModelGroup as a watch that has caught up delivers it."""
        return copy.deepcopy(self.api.body)

    def post(self, events: Sequence[EventRecord]) -> None:
        self.events.extend(events)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.api.body.get("status") or {})

    def condition(self, kind: str) -> tuple[str, str] | None:
        found = next((c for c in self.status.get("conditions", []) if c["type"] == kind), None)
        return None if found is None else (found["status"], found["reason"])

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def harness(
    body: dict[str, Any] | None = None, groups: dict[str, GroupMetrics] | None = None, **policies: Any
) -> Harness:
    chosen = {(NAMESPACE, "chat"): [policy_body(**policies)]}
    return Harness(
        MemoryApi(body or model_group_body()), Metrics(groups if groups is not None else {"g0": IDLE}), chosen
    )


# --- acting and recording ------------------------------------------------------------------------


def test_an_overloaded_group_scales_out_with_the_decision_in_the_same_write_and_is_recorded() -> None:
    h = harness(groups={"g0": OVERLOADED})
    outcome = h.tick()
    assert outcome.interval_seconds == 10
    # The next tick lands on the interval's grid, where every ModelGroup with this interval ticks.
    assert (START + 3.0 + outcome.delay_seconds(START + 3.0)) % 10 == pytest.approx(0.0, abs=1e-6)
    assert outcome.active is not None and outcome.active.desired_groups > 1
    (scale,) = h.api.of("object")
    note = json.loads(scale["metadata"]["annotations"][ANNOTATION_LAST_RESCALE])
    assert scale == {
        "metadata": {"resourceVersion": "100", "annotations": {ANNOTATION_LAST_RESCALE: mock.ANY}},
        "spec": {"replicas": outcome.active.desired_groups},
    }
    assert (note["fromReplicas"], note["toReplicas"], note["policyRevision"]) == (
        1,
        outcome.active.desired_groups,
        "r1",
    )
    assert all("detail" not in proposal for proposal in note["proposals"]), "the inputs stay in status"
    # One apply of the autoscaler's own fields and conditions; the group controller's are not in it.
    (status,) = h.api.of("status")
    assert set(status["status"]) == {
        "lastDecision",
        "decisions",
        "feasibility",
        "capacity",
        "autoscalerState",
        "conditions",
    }
    assert {c["type"] for c in status["status"]["conditions"]} == {
        "ScalingActive",
        "MetricsAvailable",
        "DecisionLimited",
        "SLOAttainable",
    }
    assert h.api.applied.owner_of_condition("ScalingActive") == {"goodput-autoscaler"}
    assert h.status["groups"] == model_group_body()["status"]["groups"], "the group controller's stay"
    last = h.status["lastDecision"]
    assert (last["fromReplicas"], last["toReplicas"], last["policyRevision"]) == (
        1,
        h.api.body["spec"]["replicas"],
        "r1",
    )
    assert h.status["decisions"] == [last]
    assert h.condition("ScalingActive") == ("True", "SignalsComputed")
    assert h.condition("MetricsAvailable") == ("True", "MetricsFresh")
    # 40 waiting requests ask for more than the step policy allows (2 groups per period).
    assert [event.reason for event in h.events] == ["SuccessfulRescale", "ScaleUpLimit"]
    assert set(h.api.body["metadata"]["annotations"]) == {ANNOTATION_LAST_RESCALE}, "nothing else"
    assert (
        h.sample(
            "goodput_autoscaler_decisions_total",
            namespace=NAMESPACE,
            model_group=NAME,
            policy="active",
            mode="Active",
            reason=outcome.active.reason,
        )
        == 1.0
    )
    assert h.sample(
        "goodput_autoscaler_desired_groups", namespace=NAMESPACE, model_group=NAME, policy="active"
    ) == (outcome.active.desired_groups)
    for stage in ("metrics", "decide", "total"):
        assert h.sample("goodput_autoscaler_decision_duration_seconds_count", stage=stage) == 1.0


def test_a_held_count_writes_the_record_but_not_the_count() -> None:
    h = harness()
    outcome = h.tick()
    assert outcome.active is not None and outcome.active.desired_groups == 1
    assert h.api.of("object") == []
    assert h.status["lastDecision"]["toReplicas"] == 1 and h.status["decisions"] == []
    assert h.events == []


def test_the_windows_asked_for_are_the_settings_rate_and_the_policy_goodput_window() -> None:
    h = harness()
    h.tick()
    assert h.metrics.reads == [Windows(rate_seconds=30, histogram_seconds=30)]


def test_every_decision_is_one_json_ready_log_record(caplog: pytest.LogCaptureFixture) -> None:
    h = harness(groups={"g0": OVERLOADED})
    with caplog.at_level(logging.INFO, logger="goodput.autoscaler.decisions"):
        h.tick()
    (record,) = [r for r in caplog.records if r.name == "goodput.autoscaler.decisions"]
    fields = vars(record)
    assert (fields["model_group"], fields["namespace"], fields["policy_revision"]) == (NAME, NAMESPACE, "r1")
    assert {"inputs", "estimates", "proposals", "result", "slo_ms"} <= set(fields)
    assert fields["result"]["desired_groups"] == h.api.body["spec"]["replicas"]


def test_advisory_records_without_acting() -> None:
    h = harness(groups={"g0": OVERLOADED}, mode="Advisory")
    h.tick()
    h.tick(at=10)
    assert h.api.of("object") == [] and h.api.body["spec"]["replicas"] == 1
    assert h.status["lastDecision"]["mode"] == "Advisory" and h.status["lastDecision"]["toReplicas"] > 1
    assert len(h.status["decisions"]) == 1
    assert h.condition("ScalingActive") == ("True", "ModeAdvisory")
    assert [event.reason for event in h.events] == ["AdvisoryRescale", "ScaleUpLimit"], "once, not per tick"


def test_frozen_makes_no_decision_and_reads_nothing() -> None:
    h = harness(groups={"g0": OVERLOADED}, mode="Frozen")
    h.tick()
    h.tick(at=10)
    assert h.metrics.reads == [] and h.api.of("object") == []
    assert "lastDecision" not in h.status
    assert h.condition("ScalingActive") == ("False", "ModeFrozen")
    assert [event.reason for event in h.events] == ["ModeFrozen"]


def test_a_shadow_policy_is_recorded_beside_and_cleared_when_unbound() -> None:
    body = model_group_body(shadowPolicyRef={"name": "next"})
    h = harness(body, groups={"g0": OVERLOADED}, mode="Frozen")
    h.policies[(NAMESPACE, "next")] = [policy_body("next", revision="n1")]
    outcome = h.tick()
    assert outcome.shadow is not None and outcome.active is None
    assert h.api.of("object") == []
    shadow = h.status["shadowDecision"]
    assert (shadow["shadow"], shadow["policyRevision"], shadow["mode"]) == (True, "n1", "Advisory")
    assert shadow["toReplicas"] > 1
    assert "AdvisoryRescale" in [event.reason for event in h.events]
    del h.api.body["spec"]["shadowPolicyRef"]
    h.policies[(NAMESPACE, "chat")] = [policy_body()]
    h.tick(at=10)
    assert "shadowDecision" not in h.status


# --- what cannot be seen is not acted on ---------------------------------------------------------


def test_a_prometheus_that_is_down_holds_the_count_and_says_why() -> None:
    h = harness(model_group_body(replicas=3, ready=3), groups={f"g{i}": IDLE for i in range(3)}, window=60)
    h.metrics.down = True
    with pytest.raises(kopf.TemporaryError) as raised:
        h.tick()
    assert raised.value.delay == 10
    assert h.api.of("object") == []
    assert h.condition("MetricsAvailable") == ("False", "MetricsQueryFailed")
    assert h.condition("ScalingActive") == ("False", "MetricsQueryFailed")
    assert [(e.type, e.reason) for e in h.events] == [("Warning", "MetricsQueryFailed")]
    with pytest.raises(kopf.TemporaryError):
        h.tick(at=10)
    assert len(h.events) == 1, "the failure is announced once"
    assert (
        h.sample("goodput_autoscaler_metrics_query_failures_total", namespace=NAMESPACE, model_group=NAME)
        == 2.0
    )


def test_after_a_blind_spot_the_scale_down_window_starts_again() -> None:
    h = harness(model_group_body(replicas=3, ready=3), groups={f"g{i}": IDLE for i in range(3)}, window=60)
    h.tick(at=0)  # the first decision seeds the window with 3
    h.metrics.down = True
    for at in (10, 20, 30, 40, 50, 60):
        with pytest.raises(kopf.TemporaryError):
            h.tick(at=at)
    h.metrics.down = False
    back = h.tick(at=70)
    assert back.active is not None and back.active.desired_groups == 3  # the seed would have expired
    assert h.tick(at=125).active.desired_groups == 3  # type: ignore[union-attr]
    assert h.tick(at=131).active.desired_groups == 2  # type: ignore[union-attr]


def test_a_missing_policy_is_reported_once_and_nothing_is_read() -> None:
    h = harness()
    h.policies.clear()
    h.tick()
    h.tick(at=15)
    assert h.metrics.reads == []
    assert h.condition("ScalingActive") == ("False", "PolicyNotFound")
    assert [e.reason for e in h.events] == ["PolicyNotFound"]


def test_a_policy_the_operator_would_not_accept_is_not_acted_on() -> None:
    h = harness(window=5)  # a scale-down window shorter than the interval
    h.tick()
    assert h.condition("ScalingActive") == ("False", "PolicyNotAccepted")
    assert h.api.of("object") == []


# --- racing other writers ------------------------------------------------------------------------


def test_a_count_changed_by_someone_else_meanwhile_wins() -> None:
    h = harness(groups={"g0": OVERLOADED})
    h.api.conflicts.append("object")
    outcome = h.tick()
    assert outcome.interval_seconds == 1.0
    assert outcome.delay_seconds(START + 7.3) == 1.0  # a retry soon, not at the next interval boundary
    assert h.api.writes == [] and h.events == []
    assert h.autoscaler is not None and not h.autoscaler.memories[PoolKey(NAMESPACE, NAME)].active.started


def test_the_group_controllers_status_written_meanwhile_is_neither_sent_nor_erased() -> None:
    h = harness(groups={"g0": OVERLOADED})
    h.tick()
    first = h.status["decisions"]
    assert h.api.body["spec"]["replicas"] == 3
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "GroupsNotReady",
        "message": "1/3 groups ready",
        "lastTransitionTime": "2027-01-15T08:00:00Z",
    }
    groups = model_group_body(ready=3)["status"]["groups"]
    h.api.group_controller_applies({"readyGroups": 3, "groups": groups, "conditions": [ready]})
    h.metrics.groups = {f"g{i}": OVERLOADED for i in range(3)}
    h.tick(at=70)  # past the scale-up period of the first change
    second = h.api.of("status")[-1]["status"]
    assert "groups" not in second and "Ready" not in {c["type"] for c in second["conditions"]}
    assert h.status["groups"] == groups and h.condition("Ready") == ("False", "GroupsNotReady")
    assert [(e["fromReplicas"], e["toReplicas"]) for e in h.status["decisions"]] == [(3, 4), (1, 3)]
    assert h.status["decisions"][1:] == first


def test_conditions_of_both_controllers_coexist_over_many_decisions() -> None:
    h = harness(model_group_body(replicas=2, ready=2), groups={f"g{i}": IDLE for i in range(2)}, window=60)
    limited = {
        "type": "ScalingLimited",
        "status": "True",
        "reason": "InsufficientGPUs",
        "message": "no domain has 8 free GPUs",
        "lastTransitionTime": "2027-01-15T08:00:00Z",
    }
    for tick in range(20):
        h.tick(at=10 * tick)
        if tick % 3 == 0:  # the group controller writes between decisions, its own part only
            h.api.group_controller_applies({**model_group_body(ready=2)["status"], "conditions": [limited]})
    owners = {c["type"]: h.api.applied.owner_of_condition(c["type"]) for c in h.status["conditions"]}
    assert owners == {
        "ScalingLimited": {"goodput-groups"},
        "ScalingActive": {"goodput-autoscaler"},
        "MetricsAvailable": {"goodput-autoscaler"},
        "DecisionLimited": {"goodput-autoscaler"},
        "SLOAttainable": {"goodput-autoscaler"},
    }
    assert h.condition("ScalingLimited") == ("True", "InsufficientGPUs")


@pytest.mark.parametrize(
    "failure",
    [
        KubeError(403, "Forbidden", "cannot patch modelgroups/scale"),
        KubeUnreachableError("PATCH .../scale: MaxRetryError: connection refused"),
    ],
    ids=["refused", "no answer"],
)
def test_a_failed_scale_write_is_announced_and_retried_at_the_interval(failure: KubeError) -> None:
    h = harness(groups={"g0": OVERLOADED})
    h.api.failure = failure
    with pytest.raises(kopf.TemporaryError) as raised:
        h.tick()
    assert raised.value.delay == 10
    assert [e.reason for e in h.events] == ["FailedRescale"]
    assert "lastDecision" not in h.status


# --- restarts -------------------------------------------------------------------------------------


def test_a_restart_keeps_the_scale_down_window() -> None:
    h = harness(model_group_body(replicas=3, ready=3), groups={f"g{i}": IDLE for i in range(3)}, window=60)
    for at in (0, 10, 20, 30, 40, 50):
        assert h.tick(at=at).active.desired_groups == 3  # type: ignore[union-attr]
    saved = copy.deepcopy(h.api.body)
    h.autoscaler = h.new_autoscaler()
    assert h.tick(at=65).active.desired_groups == 2  # type: ignore[union-attr]

    # Without the saved state, a new process would have to watch for a whole window first.
    state = saved["status"].pop("autoscalerState")
    h.api.body = copy.deepcopy(saved)
    h.autoscaler = h.new_autoscaler()
    assert h.tick(at=65).active.desired_groups == 3  # type: ignore[union-attr]

    # An object an older operator wrote keeps its state in an annotation: read once, never written.
    saved["metadata"]["annotations"] = {STATE_ANNOTATION: state, "team": "serving"}
    h.api.body = saved
    h.autoscaler = h.new_autoscaler()
    assert h.tick(at=65).active.desired_groups == 2  # type: ignore[union-attr]
    annotations = dict(h.api.body["metadata"]["annotations"])
    assert annotations.pop(ANNOTATION_LAST_RESCALE) and annotations == {
        STATE_ANNOTATION: state,
        "team": "serving",
    }
    assert all(STATE_ANNOTATION not in p["metadata"]["annotations"] for p in h.api.of("object"))
    assert h.status["autoscalerState"] != state


def _stopped_after_the_scale_write(h: Harness) -> None:
    """The operator dies after its scale write and before its status write (the status apply fails
    as a killed process's would never be sent)."""

    def killed(*_: Any, **__: Any) -> Any:
        raise KubeUnreachableError("the operator was stopped")

    h.api.apply_custom_status = killed  # type: ignore[method-assign]
    with pytest.raises(kopf.TemporaryError):
        h.tick(watched=h.watched())
    del h.api.apply_custom_status
    h.events.clear()


def test_a_rescale_whose_operator_stopped_before_recording_it_is_recorded_by_the_next() -> None:
    h = harness(groups={"g0": OVERLOADED})
    _stopped_after_the_scale_write(h)
    scaled_to = h.api.body["spec"]["replicas"]
    assert scaled_to > 1 and "lastDecision" not in h.status, "the count changed, its record did not land"

    h.autoscaler = h.new_autoscaler()
    h.metrics.down = True  # the next operator's first tick cannot even decide
    with pytest.raises(kopf.TemporaryError):
        h.tick(at=10)
    (recorded,) = h.status["decisions"]
    decided_at = datetime.fromtimestamp(START, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (recorded["fromReplicas"], recorded["toReplicas"], recorded["time"]) == (1, scaled_to, decided_at)
    assert h.status["lastDecision"] == recorded
    (event,) = [e for e in h.events if e.reason == "SuccessfulRescale"]
    assert (
        f"New size: {scaled_to} (from 1)" in event.message
        and "recorded after an operator restart" in event.message
    )

    h.metrics.down = False
    h.events.clear()
    h.tick(at=20)
    assert "SuccessfulRescale" not in [e.reason for e in h.events], "recorded once"
    assert h.status["decisions"][-1] == recorded


def test_a_rescale_recorded_before_the_restart_is_not_recorded_again() -> None:
    h = harness(groups={"g0": OVERLOADED})
    h.tick()
    history = h.status["decisions"]
    h.autoscaler = h.new_autoscaler()
    h.events.clear()
    h.metrics.down = True
    with pytest.raises(kopf.TemporaryError):
        h.tick(at=10)
    assert h.status["decisions"] == history
    assert "SuccessfulRescale" not in [e.reason for e in h.events]


@pytest.mark.parametrize(
    "note",
    [
        pytest.param("", id="empty"),
        pytest.param("{not json", id="unreadable"),
        pytest.param('{"time": 3}', id="incomplete"),
    ],
)
def test_a_rescale_note_that_cannot_be_read_records_nothing(note: str) -> None:
    h = harness()
    h.api.body["metadata"]["annotations"] = {ANNOTATION_LAST_RESCALE: note}
    h.tick()
    assert "decisions" not in h.status or h.status["decisions"] == []
    assert "SuccessfulRescale" not in [e.reason for e in h.events]


def test_the_state_is_saved_when_it_changes_and_refreshed_while_it_holds() -> None:
    h = harness()

    def saved_states() -> list[str]:
        states = [status["status"]["autoscalerState"] for status in h.api.of("status")]
        return [state for i, state in enumerate(states) if i == 0 or states[i - 1] != state]

    h.tick(at=0)
    h.tick(at=10)
    h.tick(at=20)
    assert len(saved_states()) == 1, "an unchanged recommendation is not rewritten within the refresh"
    h.tick(at=30)
    assert len(saved_states()) == 2


# --- settings and helpers -------------------------------------------------------------------------


def autoscaler_settings(environ: dict[str, str]) -> AutoscalerSettings:
    return AutoscalerSettings.from_settings(Settings.from_sources({}, environ))


def test_settings_come_from_the_operators_settings() -> None:
    settings = autoscaler_settings(
        {
            "GOODPUT_PROMETHEUS_URL": "http://prometheus.monitoring:9090/",
            "GOODPUT_PROMETHEUS_TIMEOUT_SECONDS": "2.5",
            "GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS": "30",
            "GOODPUT_AUTOSCALER_STATE_REFRESH_SECONDS": "20",
            "GOODPUT_PROMETHEUS_LABEL_GROUP": "replica_group",
        }
    )
    assert settings.prometheus_url == "http://prometheus.monitoring:9090"
    assert (
        settings.prometheus_timeout_seconds,
        settings.rate_window_seconds,
        settings.state_refresh_seconds,
    ) == (
        2.5,
        30.0,
        20.0,
    )
    assert settings.labels == SeriesLabels(group="replica_group")
    assert autoscaler_settings({}) == AutoscalerSettings()
    with pytest.raises(ValueError, match="positive"):
        autoscaler_settings({"GOODPUT_PROMETHEUS_TIMEOUT_SECONDS": "0"})
    with pytest.raises(ValueError, match="label name"):
        autoscaler_settings({"GOODPUT_PROMETHEUS_LABEL_GROUP": "replica-group"})


@pytest.mark.parametrize(
    ("spec", "bound"),
    [({"policyRef": {"name": "a"}}, True), ({"shadowPolicyRef": {"name": "b"}}, True), ({}, False)],
    ids=["a policy", "a shadow policy only", "no policy"],
)
def test_which_model_groups_the_autoscaler_runs_for(spec: dict[str, Any], bound: bool) -> None:
    assert is_bound(spec) is bound


def test_forgetting_a_model_group_drops_its_memory_and_series() -> None:
    h = harness(groups={"g0": OVERLOADED})
    h.tick()
    assert h.autoscaler is not None
    h.autoscaler.forget(NAMESPACE, NAME)
    assert h.autoscaler.memories == {}
    assert (
        h.sample("goodput_autoscaler_desired_groups", namespace=NAMESPACE, model_group=NAME, policy="active")
        is None
    )


def test_a_revision_bump_is_named_by_the_next_decision_and_its_series() -> None:
    h = harness()
    h.tick()
    h.policies[(NAMESPACE, "chat")] = [policy_body(revision="r2")]
    outcome = h.tick(at=10)
    assert outcome.active is not None and outcome.active.policy_revision == "r2"
    assert h.status["lastDecision"]["policyRevision"] == "r2"
    info = {
        "namespace": NAMESPACE,
        "model_group": NAME,
        "policy": "active",
        "slopolicy": "chat",
        "mode": "Active",
    }
    assert h.sample("goodput_autoscaler_policy_info", **info, revision="r2") == 1.0
    assert h.sample("goodput_autoscaler_policy_info", **info, revision="r1") is None


# --- feasibility: SLOAttainable, status.feasibility, its Events and series --------------------------

PROMPT_BOUNDS = (100.0, 1000.0, 10_000.0, 20_000.0, 50_000.0, 100_000.0, 131_072.0)


def with_prompts(metrics: GroupMetrics, prompts: list[int]) -> GroupMetrics:
    return dataclasses.replace(metrics, prompt_tokens=Histogram.from_observations(PROMPT_BOUNDS, prompts))


def condition_message(h: Harness, kind: str) -> str:
    return next(c["message"] for c in h.status["conditions"] if c["type"] == kind)


def test_prompts_no_group_can_serve_in_time_raise_slo_attainable_false_not_groups() -> None:
    """40 requests wait, and every prompt of the window was 100k tokens: an idle H100 needs far
    more than the 1 s TTFT for them, so the fleet does not grow, and the condition says why."""
    h = harness(groups={"g0": with_prompts(OVERLOADED, [100_000] * 50)})
    outcome = h.tick()
    assert outcome.active is not None and outcome.active.desired_groups == 1
    assert h.api.of("object") == []
    assert h.condition("SLOAttainable") == ("False", "InfeasibleDemand")
    message = condition_message(h, "SLOAttainable")
    threshold = h.status["feasibility"][0]["longestFeasiblePromptTokens"]
    assert f"longer than {threshold} tokens" in message
    assert "tensor parallelism of about" in message and "(now 1)" in message
    assert h.status["feasibility"] == [
        {"name": "chat", "longestFeasiblePromptTokens": threshold, "infeasibleShare": 1.0}
    ]
    assert [event.reason for event in h.events] == ["SLOUnattainable"]
    labels = {"namespace": NAMESPACE, "model_group": NAME, "class": "chat"}
    assert h.sample("goodput_autoscaler_infeasible_share", **labels) == 1.0
    assert h.sample("goodput_autoscaler_feasible_prompt_tokens", **labels) == threshold
    h.tick(at=10)
    assert [event.reason for event in h.events] == ["SLOUnattainable"]  # announced once


def test_the_condition_clears_with_an_event_when_the_long_prompts_stop() -> None:
    h = harness(groups={"g0": with_prompts(IDLE, [100_000] * 50)})
    h.tick()
    h.metrics.groups = {"g0": with_prompts(IDLE, [500] * 50)}
    h.tick(at=10)
    assert h.condition("SLOAttainable") == ("True", "DemandFeasible")
    assert [(event.type, event.reason) for event in h.events] == [
        ("Warning", "SLOUnattainable"),
        ("Normal", "SLOAttainable"),
    ]


def test_a_class_no_request_can_meet_names_the_class_and_field_and_never_pins_the_maximum() -> None:
    h = harness(groups={"g0": OVERLOADED})
    h.policies[(NAMESPACE, "chat")][0]["spec"]["classes"][0]["ttftSeconds"] = 0.0001
    outcome = h.tick()
    assert outcome.active is not None and outcome.active.desired_groups == 1
    assert h.condition("SLOAttainable") == ("False", "ClassUnattainable")
    message = condition_message(h, "SLOAttainable")
    assert "class chat" in message and "ttftSeconds=0.0001" in message
    assert h.status["feasibility"][0]["unmetField"] == "ttftSeconds"


def test_without_prompt_lengths_the_condition_is_unknown_and_scale_in_is_not_held() -> None:
    h = harness(model_group_body(replicas=2, ready=2), groups={"g0": IDLE, "g1": IDLE}, window=0)
    outcome = h.tick()
    assert h.condition("SLOAttainable") == ("Unknown", "FeasibilityUnknown")
    assert outcome.active is not None and outcome.active.desired_groups == 1
    assert h.events and all(event.reason != "SLOUnattainable" for event in h.events)


def test_attainment_is_reported_against_offered_and_against_the_attainable_ceiling() -> None:
    """80 of 100 first tokens in time; the 20 others were 100k-token prompts no group serves in time."""
    ttft = Histogram.from_observations((0.5, 1.0, 2.5, 10.0), [0.3] * 80 + [5.0] * 20)
    observed = dataclasses.replace(
        with_prompts(IDLE, [500] * 80 + [100_000] * 20), ttft=ttft, finished_requests=100.0
    )
    h = harness(groups={"g0": observed})
    h.tick()
    (chat,) = h.status["feasibility"]
    assert chat["infeasibleShare"] == pytest.approx(0.2)
    assert chat["attainmentOffered"] == pytest.approx(0.8)
    assert chat["attainmentAttainable"] == pytest.approx(1.0)
    for basis, value in (("offered", 0.8), ("attainable", 1.0)):
        sample = h.sample(
            "goodput_autoscaler_attainment_ratio", namespace=NAMESPACE, model_group=NAME, basis=basis
        )
        assert sample == pytest.approx(value)


# --- at fleet size: the watched object, and writes only when something changed --------------------


def test_a_tick_on_the_watched_model_group_reads_nothing_from_the_api_server() -> None:
    h = harness(groups={"g0": OVERLOADED})
    outcome = h.tick(watched=h.watched())
    assert h.api.gets == 0
    assert outcome.active is not None and h.api.body["spec"]["replicas"] == outcome.active.desired_groups
    (scale,) = h.api.of("object")
    assert scale["metadata"]["resourceVersion"] == "100", "conditional on the version the watch showed"


def test_a_watch_behind_the_last_status_write_does_not_lose_the_decision_it_recorded() -> None:
    h = harness(groups={"g0": OVERLOADED})
    before = h.watched()
    h.tick(at=0, watched=before)
    recorded = h.status["decisions"]
    assert len(recorded) == 1 and recorded[0]["toReplicas"] > 1
    # The next tick comes before the watch delivered the write: it sees the object as it was (one
    # group wanted, no record), the scale-out's groups not created yet and the load gone.
    h.metrics.groups = {"g0": IDLE}
    h.tick(at=10, watched=copy.deepcopy(before))
    assert h.status["decisions"] == recorded, "the history is the one written, not the stale copy's"
    assert h.status["groups"] == before["status"]["groups"], "the group controller's fields stay"
    # Minutes behind (the watch of a busy operator): still never an older record.
    h.tick(at=300, watched=copy.deepcopy(before))
    assert h.status["decisions"] == recorded
    assert h.status["lastDecision"]["time"] > recorded[0]["time"]


def test_the_same_decision_again_is_not_rewritten_until_its_record_is_due_for_a_refresh() -> None:
    h = harness()
    h.tick(at=0, watched=h.watched())
    h.tick(at=10, watched=h.watched())
    h.tick(at=20, watched=h.watched())
    assert len(h.api.of("status")) == 1, "held at one group, nothing new to record"
    first = h.status["lastDecision"]["time"]
    h.tick(at=30, watched=h.watched())
    assert len(h.api.of("status")) == 2 and h.status["lastDecision"]["time"] != first, "refreshed"
    h.metrics.groups = {"g0": OVERLOADED}
    h.tick(at=35, watched=h.watched())
    assert len(h.api.of("status")) == 3 and h.status["lastDecision"]["toReplicas"] > 1, "a new decision"


OWN = {
    "lastDecision": {"toReplicas": 3},
    "conditions": [{"type": "ScalingActive", "status": "True"}],
}
ECHO_CASES = {
    "the watch shows the write: taken as it is": (
        {"readyGroups": 1, **OWN, "conditions": [{"type": "Ready", "status": "True"}, *OWN["conditions"]]},
        OWN,
        (
            {
                "readyGroups": 1,
                **OWN,
                "conditions": [{"type": "Ready", "status": "True"}, *OWN["conditions"]],
            },
            True,
        ),
    ),
    "the watch lags: the autoscaler's part as written, the group controller's as watched": (
        {
            "readyGroups": 2,
            "lastDecision": {"toReplicas": 1},
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "ScalingActive", "status": "False"},
            ],
        },
        OWN,
        (
            {
                "readyGroups": 2,
                "lastDecision": {"toReplicas": 3},
                "conditions": [{"type": "Ready", "status": "False"}, *OWN["conditions"]],
            },
            False,
        ),
    ),
    "a field the write removed stays removed": (
        {"readyGroups": 1, "shadowDecision": {"toReplicas": 2}, **OWN},
        OWN,
        ({"readyGroups": 1, **OWN}, False),
    ),
}


@pytest.mark.parametrize(("watched", "written", "expected"), ECHO_CASES.values(), ids=ECHO_CASES.keys())
def test_the_status_decided_on_carries_the_autoscalers_last_write(
    watched: dict[str, Any], written: dict[str, Any], expected: tuple[dict[str, Any], bool]
) -> None:
    assert with_own_status(watched, written) == expected


def test_a_status_written_after_the_watched_copy_costs_no_decision() -> None:
    h = harness(groups={"g0": OVERLOADED})
    watched = h.watched()
    h.api.group_controller_applies({"readyGroups": 1, "groups": watched["status"]["groups"]})
    outcome = h.tick(watched=watched)
    assert not outcome.conflict and outcome.active is not None
    (scale,) = h.api.of("object")
    assert scale["metadata"]["resourceVersion"] == "101", "decided again on a fresh read"
    assert h.api.body["spec"]["replicas"] == outcome.active.desired_groups > 1
    assert h.api.gets == 1 and len(h.metrics.reads) == 1, "one read of the object, the metrics read once"


def test_a_count_changed_by_someone_else_after_the_watched_copy_wins() -> None:
    h = harness(groups={"g0": OVERLOADED})
    watched = h.watched()
    # `kubectl scale --replicas=2` lands between the watch's copy and the decision's write.
    h.api.body["spec"]["replicas"] = 2
    h.api.body["metadata"]["generation"] += 1
    h.api.body["metadata"]["resourceVersion"] = "101"
    outcome = h.tick(watched=watched)
    assert outcome.conflict and outcome.delay_seconds(START + 7.3) == 1.0
    assert h.api.writes == [] and h.events == [] and h.api.body["spec"]["replicas"] == 2


@given(namespace=st.text(min_size=1, max_size=63), name=st.text(min_size=1, max_size=63))
def test_an_unchanged_record_is_refreshed_within_the_setting_and_at_least_half_of_it(
    namespace: str, name: str
) -> None:
    refresh = staggered_refresh_seconds(namespace, name, 60.0)
    assert 30.0 <= refresh <= 60.0
    assert refresh == staggered_refresh_seconds(namespace, name, 60.0), "fixed per ModelGroup"


def test_the_refreshes_of_a_fleet_are_spread_over_the_setting() -> None:
    refreshes = [
        staggered_refresh_seconds(f"ns-{i % 100:03d}", f"llama-8b-{i:04d}", 60.0) for i in range(1000)
    ]
    # Ten 3 s bins over [30, 60]: none holds more than a fifth of the fleet.
    bins = Counter(min(9, int((refresh - 30.0) // 3)) for refresh in refreshes)
    assert len(bins) == 10 and max(bins.values()) < 200


def test_a_decision_is_logged_when_made_and_applied_before_its_status_write_waits_its_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness(groups={"g0": OVERLOADED})
    logged_before_status: list[int] = []
    apply = h.api.apply_custom_status

    def watching_apply(*args: Any, **kwargs: Any) -> Any:
        logged_before_status.append(
            sum(1 for record in caplog.records if record.name == "goodput.autoscaler.decisions")
        )
        return apply(*args, **kwargs)

    h.api.apply_custom_status = watching_apply  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="goodput.autoscaler.decisions"):
        h.tick(watched=h.watched())
    assert h.api.of("object") and logged_before_status == [1]


def test_the_scale_write_and_the_status_apply_run_on_executors_of_their_own() -> None:
    h = harness(groups={"g0": OVERLOADED})
    threads: dict[str, str] = {}
    patch, apply = h.api.patch_custom, h.api.apply_custom_status

    def named(kind: str, call: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            threads[kind] = threading.current_thread().name
            return call(*args, **kwargs)

        return run

    h.api.patch_custom = named("scale", patch)  # type: ignore[method-assign]
    h.api.apply_custom_status = named("status", apply)  # type: ignore[method-assign]
    with (
        ThreadPoolExecutor(1, thread_name_prefix="acting") as acting,
        ThreadPoolExecutor(1, thread_name_prefix="recording") as recording,
    ):
        h.autoscaler = Autoscaler(
            h.api,
            h.metrics,
            AutoscalerMetrics(CollectorRegistry()),
            AutoscalerSettings(),
            clock=h.clock,
            executor=acting,
            record_executor=recording,
        )
        h.tick(watched=h.watched())
    assert threads["scale"].startswith("acting") and threads["status"].startswith("recording")
