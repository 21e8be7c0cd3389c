"""The emulator's real health agents: the command line each pod's agent gets is one the agent's own
parser reads as that rank of that group, with the pod's NCCL fault; the revision evidence is what
the agent's own cache reading reports as the wanted revision; and the processes start with their
pod, read its GPU faults as they change, and stop (their whole process group) with it."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from waiting import wait_until

from goodput.agent import revision
from goodput.agent.main import _cache_evidence, parse_args
from goodput.testbed import emulator_agents
from goodput.testbed.emulator import EmulatedPod, VllmArgs
from goodput.testbed.emulator_agents import (
    AgentPorts,
    AgentProcesses,
    AgentProcessSettings,
    agent_command,
    write_revision_evidence,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LEADER = EmulatedPod(
    namespace="ns",
    name="mg-g0-0",
    uid="0123456789ab",
    model_group="mg",
    group="g0",
    rank=0,
    vllm=VllmArgs(model=MODEL, revision="rev-1", tensor_parallel=2, port=8000),
    pod_ip="10.200.0.9",
    running=True,
    started_at=100.0,
    gpus=1,
)
PORTS = AgentPorts(rendezvous=40001, metrics=40002)


@dataclass(frozen=True)
class CommandCase:
    name: str
    pod: EmulatedPod
    expected: dict[str, object]


COMMAND_CASES = [
    CommandCase(
        "the leader of a two-pod group watches its engine",
        LEADER,
        {"rank": 0, "pods": 2, "gpus_per_pod": 1, "engine_url": "http://10.200.0.9:8000", "nccl_hang": False},
    ),
    CommandCase(
        "a follower has no engine to watch",
        replace(LEADER, name="mg-g0-1", rank=1),
        {"rank": 1, "pods": 2, "engine_url": None, "nccl_delay_seconds": 0.0},
    ),
    CommandCase(
        "eight GPUs per pod, tensor 8 by pipeline 2: two pods of eight ranks",
        replace(LEADER, vllm=replace(LEADER.vllm, tensor_parallel=8, pipeline_parallel=2), gpus=8),
        {"pods": 2, "gpus_per_pod": 8},
    ),
    CommandCase(
        "nccl-hang: a rank that never sends",
        replace(LEADER, fault="nccl-hang"),
        {"nccl_hang": True},
    ),
    CommandCase(
        "nccl-slow: a rank that waits before each send",
        replace(LEADER, fault="nccl-slow"),
        {"nccl_delay_seconds": 0.2, "nccl_hang": False},
    ),
]


@pytest.mark.parametrize("case", COMMAND_CASES, ids=lambda case: case.name)
def test_the_agents_own_parser_reads_the_command_as_that_rank(case: CommandCase, tmp_path: Path) -> None:
    settings = AgentProcessSettings(kubeconfig="kc", root=tmp_path)
    command = agent_command(case.pod, PORTS, settings, tmp_path / "pod")

    assert command[:3] == [sys.executable, "-m", "goodput.agent"]
    config = parse_args(command[3:])
    assert (config.namespace, config.pod_name, config.model_revision) == ("ns", case.pod.name, "rev-1")
    assert (config.leader_address, config.rendezvous_port, config.metrics_port) == ("127.0.0.1", 40001, 40002)
    assert (config.backend, config.collective) == ("emulated", "tcp")
    assert config.faults_file == tmp_path / "pod" / "faults.json"
    assert config.expected_busbw_gb_per_s == settings.expected_busbw_gb_per_s
    for field, value in case.expected.items():
        assert getattr(config, field) == value, field


@pytest.mark.parametrize("wanted", ["main", "rev-e2e", "v1.2"])
def test_the_revision_evidence_reads_back_as_the_wanted_revision(wanted: str, tmp_path: Path) -> None:
    write_revision_evidence(tmp_path, MODEL, wanted)

    paths, refs = _cache_evidence(tmp_path, MODEL, wanted)

    assert revision.loaded_revision(tuple(paths), wanted, refs) == wanted
    # A mismatch names the loaded commit.
    assert revision.loaded_revision(tuple(paths), "other", refs) == refs[wanted]


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_an_agent_runs_while_its_pod_runs_reads_its_faults_and_stops_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emulator_agents, "agent_command", lambda *_: SLEEPER)
    agents = AgentProcesses(AgentProcessSettings(kubeconfig="kc", root=tmp_path, nccl_timeout_seconds=5))

    agents.sync(replace(LEADER, running=False, started_at=None))
    assert not list(tmp_path.rglob("agent.log")), "no agent before the pod runs"

    agents.sync(LEADER)
    (folder,) = (path.parent for path in tmp_path.rglob("agent.log"))
    assert json.loads((folder / "faults.json").read_text()) == {}
    process = agents._running[LEADER.key].process
    assert process.poll() is None

    xid = '{"xids": {"0": [79]}}'
    agents.sync(replace(LEADER, gpu_faults=xid))
    assert json.loads((folder / "faults.json").read_text()) == {"xids": {"0": [79]}}
    agents.sync(replace(LEADER, gpu_faults=xid))
    assert agents._running[LEADER.key].process is process, "one agent per pod, not one per pass"

    agents.sync(replace(LEADER, deleting=True))
    wait_until(lambda: process.poll() is not None, "SIGTERM stops the agent")
    agents.reap()
    assert agents._stopping == []


def test_a_new_pod_under_the_same_name_gets_a_new_agent_and_the_group_keeps_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emulator_agents, "agent_command", lambda *_: SLEEPER)
    agents = AgentProcesses(AgentProcessSettings(kubeconfig="kc", root=tmp_path))
    follower = replace(LEADER, name="mg-g0-1", rank=1)
    agents.sync(LEADER)
    agents.sync(follower)
    first = agents._running[LEADER.key].process
    port = agents._group_ports[("ns", "mg", "g0")]

    agents.sync(replace(LEADER, uid="ffffffffffff"))

    assert agents._running[LEADER.key].process is not first
    wait_until(lambda: first.poll() is not None, "the first agent stopped")
    assert agents._group_ports[("ns", "mg", "g0")] == port, "the follower still meets the group there"
    agents.stop_all()
    assert agents._running == {} and agents._group_ports == {}
