"""Publishing: only what changed is written, transitions keep their time, a refusing API server is
retried with backoff, and the agent's rounds publish what its sources say."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from goodput.agent import main as agent_main
from goodput.agent.emulated import EmulatedBackend
from goodput.agent.metrics import AgentMetrics
from goodput.agent.publish import (
    PodCondition,
    PublishBackoff,
    Publisher,
    annotation_changes,
    condition_changes,
)
from goodput.api import labels
from goodput.api.reasons import Reason
from goodput.testbed.cluster.controlplane import free_port

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
GPU = labels.CONDITION_GPU_HEALTHY


def pod_with(*conditions: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"annotations": annotations or {}}, "status": {"conditions": list(conditions)}}


def test_an_unchanged_condition_is_not_written() -> None:
    pod = pod_with({"type": GPU, "status": "True", "reason": "GpuHealthy", "message": "ok"})

    assert condition_changes(pod, [PodCondition(GPU, "True", "GpuHealthy", "ok")], NOW) == []


def test_a_new_message_keeps_the_transition_time_and_a_flip_moves_it() -> None:
    earlier = "2026-07-01T11:00:00Z"
    pod = pod_with(
        {
            "type": GPU,
            "status": "True",
            "reason": "GpuHealthy",
            "message": "ok",
            "lastTransitionTime": earlier,
        },
        {"type": "Ready", "status": "True"},
    )

    warned = condition_changes(pod, [PodCondition(GPU, "True", "GpuThrottled", "GPU 0: throttled")], NOW)
    failed = condition_changes(pod, [PodCondition(GPU, "False", "GpuXidCritical", "GPU 0: XID 79")], NOW)

    assert [c["lastTransitionTime"] for c in warned] == [earlier]
    assert [c["lastTransitionTime"] for c in failed] == ["2026-07-01T12:00:00Z"]
    assert [c["type"] for c in failed] == [GPU]  # the kubelet's conditions are not touched


def test_annotation_changes_are_only_the_differences() -> None:
    pod = pod_with(annotations={labels.ANNOTATION_MODEL_REVISION: "main", "other": "x"})

    assert annotation_changes(pod, {labels.ANNOTATION_MODEL_REVISION: "main"}) == {}
    assert annotation_changes(pod, {labels.ANNOTATION_MODEL_REVISION: "v2"}) == {
        labels.ANNOTATION_MODEL_REVISION: "v2"
    }


class FakePod:
    """A pod as the API server keeps it: conditions merge by type, annotations by key."""

    def __init__(self, refusals: int = 0) -> None:
        self.pod: dict[str, Any] = pod_with()
        self.refusals = refusals
        self.writes: list[Mapping[str, Any]] = []

    def _maybe_refuse(self) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            raise RuntimeError("503 Service Unavailable")

    def get(self) -> Mapping[str, Any]:
        self._maybe_refuse()
        return json.loads(json.dumps(self.pod))

    def patch_status(self, body: Mapping[str, Any]) -> None:
        self._maybe_refuse()
        self.writes.append(body)
        current = {c["type"]: c for c in self.pod["status"]["conditions"]}
        for condition in body["status"]["conditions"]:
            current[condition["type"]] = condition
        self.pod["status"]["conditions"] = list(current.values())

    def patch(self, body: Mapping[str, Any]) -> None:
        self._maybe_refuse()
        self.writes.append(body)
        self.pod["metadata"]["annotations"].update(body["metadata"]["annotations"])

    def condition(self, kind: str) -> dict[str, str]:
        return next(c for c in self.pod["status"]["conditions"] if c["type"] == kind)


FAST = PublishBackoff(attempts=4, first_seconds=0.01, max_seconds=0.02)


def test_a_refusing_api_server_is_retried_until_it_accepts() -> None:
    fake = FakePod(refusals=3)
    publisher = Publisher(fake, FAST)

    publisher.publish([PodCondition(GPU, "False", "GpuXidCritical", "GPU 1: XID 79")], {}, NOW)

    assert fake.condition(GPU)["status"] == "False"


def test_an_api_server_that_keeps_refusing_is_given_up_on_without_raising() -> None:
    fake = FakePod(refusals=100)

    assert Publisher(fake, FAST).publish([PodCondition(GPU, "True", "GpuHealthy", "ok")], {}, NOW) is None
    assert fake.writes == []


def test_publishing_the_same_verdict_twice_writes_once() -> None:
    fake = FakePod()
    publisher = Publisher(fake, FAST)
    wanted = [PodCondition(GPU, "True", "GpuHealthy", "ok")]

    publisher.publish(wanted, {labels.ANNOTATION_MODEL_REVISION: "main"}, NOW)
    publisher.publish(wanted, {labels.ANNOTATION_MODEL_REVISION: "main"}, NOW + timedelta(seconds=10))

    assert len(fake.writes) == 2  # one condition patch, one annotation patch


def make_agent(tmp_path: Path, fake: FakePod) -> tuple[agent_main.Agent, EmulatedBackend]:
    config = agent_main.parse_args(
        [
            "--namespace=ns", "--pod-name=m-g0-0", "--rank=0", "--pods=1", "--gpus-per-pod=2",
            "--leader-address=127.0.0.1", f"--rendezvous-port={free_port()}", "--model-revision=main",
            "--backend=emulated", "--collective=tcp", "--nccl-bytes=4096", "--nccl-timeout-seconds=60",
            f"--faults-file={tmp_path / 'faults.json'}", f"--checked-file={tmp_path / 'checked'}",
            "--expected-busbw-gb-per-s=0.000001",
        ]
    )  # fmt: skip
    backend = agent_main.make_backend(config)
    assert isinstance(backend, EmulatedBackend)
    agent = agent_main.Agent(config, backend, fake, AgentMetrics(), threading.Event())
    agent.publisher = Publisher(fake, FAST)
    return agent, backend


def test_an_agent_shown_the_nodes_gpus_touches_none_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakePod()
    agent, _ = make_agent(tmp_path, fake)
    (tmp_path / "faults.json").write_text(json.dumps({"node_gpus_shown": 6, "xids": {"5": [79]}}))
    joined: list[object] = []
    monkeypatch.setattr(agent_main.nccl, "run_check", lambda *args, **kwargs: joined.append(args))

    agent.check_nccl()
    agent.round()

    assert joined == [], "no rank joined the rendezvous: no buffer on a GPU that may be a neighbour's"
    nccl_condition = fake.condition(labels.CONDITION_NCCL_HEALTHY)
    assert (nccl_condition["status"], nccl_condition["reason"]) == ("Unknown", Reason.NCCL_CHECK_NOT_RUN)
    assert "sees 8 GPUs but the pod was allocated 2" in nccl_condition["message"]
    gpu = fake.condition(GPU)
    assert (gpu["status"], gpu["reason"]) == ("Unknown", Reason.GPUS_NOT_ISOLATED)


@pytest.mark.timeout(180)
def test_the_agent_publishes_its_checks_and_re_runs_nccl_on_request(tmp_path: Path) -> None:
    fake = FakePod()
    agent, _ = make_agent(tmp_path, fake)

    agent.check_nccl()
    agent.round()
    assert fake.condition(labels.CONDITION_NCCL_HEALTHY)["reason"] == Reason.ALL_REDUCE_PASSED
    assert "all-reduce over 2 GPU(s)" in fake.condition(labels.CONDITION_NCCL_HEALTHY)["message"]
    assert fake.condition(GPU)["status"] == "True"

    (tmp_path / "faults.json").write_text(json.dumps({"xids": {"1": [79]}}))
    agent.round()
    gpu = fake.condition(GPU)
    assert (gpu["status"], gpu["reason"]) == ("False", Reason.GPU_XID_CRITICAL)
    assert "GPU 1: critical XID 79" in gpu["message"]

    writes = len(fake.writes)
    agent.round()
    assert len(fake.writes) == writes  # nothing changed, nothing written

    checks: list[int] = []
    run_check = agent.check_nccl
    agent.check_nccl = lambda: (checks.append(1), run_check())[1]  # type: ignore[method-assign]
    fake.pod["metadata"]["annotations"][labels.ANNOTATION_NCCL_CHECK_REQUEST] = "2026-07-01T12:00:00Z"
    agent.round()
    agent.round()
    assert len(checks) == 1  # one re-check per new value of the annotation
    assert fake.condition(labels.CONDITION_NCCL_HEALTHY)["reason"] == Reason.ALL_REDUCE_PASSED


def test_nvml_missing_is_published_as_unknown_with_the_evidence(tmp_path: Path) -> None:
    fake = FakePod()
    agent, _ = make_agent(tmp_path, fake)
    (tmp_path / "faults.json").write_text(json.dumps({"nvml_error": "NVML Shared Library Not Found"}))

    agent.round()

    gpu = fake.condition(GPU)
    assert (gpu["status"], gpu["reason"]) == ("Unknown", Reason.NVML_UNAVAILABLE)
    assert gpu["message"] == "NVML unavailable: NVML Shared Library Not Found"


REST = ["--gpus-per-pod=1", "--leader-address=h", "--model-revision=m"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--pod-name=p", "--rank=0", "--pods=1", *REST], "--namespace"),
        (["--namespace=n", "--pod-name=p", "--rank=2", "--pods=2", *REST], "--rank 2"),
        (["--namespace=n", "--pod-name=p", "--rank=x", "--pods=2", *REST], "--rank"),
    ],
)
def test_bad_configuration_exits_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("GOODPUT_POD_NAMESPACE", "GOODPUT_POD_NAME", "GOODPUT_RANK", "GOODPUT_GROUP_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit):
        agent_main.parse_args(argv)
    assert named in capsys.readouterr().err
