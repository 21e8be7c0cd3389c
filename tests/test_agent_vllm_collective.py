"""The real collective's wiring to vLLM, checked against stand-ins of `vllm` and `torch` (neither is
installed here; bench/gpu_agent_check.py runs the real thing on a GPU): the rendezvous gets the
leader, port, rank and world size, the communicator gets the rank's device, a wrong sum is an error,
and a single GPU needs no communicator."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from goodput.agent.nccl import CollectiveError, RankSpec

CALLS: list[tuple[str, Any]] = []


class FakeGroup:
    @staticmethod
    def create(host: str, port: int, rank: int, world_size: int, store_timeout: int = 300) -> FakeGroup:
        CALLS.append(("create", (host, port, rank, world_size, store_timeout)))
        group = FakeGroup()
        group.world_size = world_size
        return group

    world_size = 0


class FakeCommunicator:
    broken = False

    def __init__(self, group: FakeGroup, device: str) -> None:
        CALLS.append(("communicator", device))
        self.world_size = group.world_size
        self.disabled = True  # as vLLM up to 0.6.4 creates it
        self.available = True

    def all_reduce(self, tensor: np.ndarray) -> np.ndarray | None:
        if self.disabled:
            return None
        if self.broken:
            return tensor
        return np.full_like(tensor, self.world_size * (self.world_size + 1) / 2)


def fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.float32 = np.float32  # type: ignore[attr-defined]
    torch.device = lambda name: name  # type: ignore[attr-defined]
    torch.full = lambda shape, value, dtype, device: np.full(shape, value, dtype=dtype)  # type: ignore[attr-defined]
    torch.all = np.all  # type: ignore[attr-defined]
    cuda = types.SimpleNamespace(
        set_device=lambda device: CALLS.append(("set_device", device)),
        synchronize=lambda device=None: None,
        empty_cache=lambda: CALLS.append(("empty_cache", None)),
    )
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


@pytest.fixture(autouse=True)
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    CALLS.clear()
    FakeCommunicator.broken = False
    modules = {
        "torch": fake_torch(),
        "vllm": types.ModuleType("vllm"),
        "vllm.distributed": types.ModuleType("vllm.distributed"),
        "vllm.distributed.utils": types.ModuleType("vllm.distributed.utils"),
        "vllm.distributed.device_communicators": types.ModuleType("vllm.distributed.device_communicators"),
        "vllm.distributed.device_communicators.pynccl": types.ModuleType("pynccl"),
    }
    modules["vllm.distributed.utils"].StatelessProcessGroup = FakeGroup  # type: ignore[attr-defined]
    modules["vllm.distributed.device_communicators.pynccl"].PyNcclCommunicator = FakeCommunicator  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def spec(rank: int = 1, world: int = 4) -> RankSpec:
    return RankSpec(
        "vllm", "llama-g0.serving.svc", 29510, rank, world, device=rank % 2, rendezvous_timeout_seconds=90
    )


def test_a_rank_meets_the_leader_on_its_device_and_checks_the_sum() -> None:
    from goodput.agent.vllm_collective import VllmCollective

    collective = VllmCollective(spec())
    seconds = collective.all_reduce(1024)
    collective.close()

    assert seconds >= 0
    assert ("create", ("llama-g0.serving.svc", 29510, 1, 4, 90)) in CALLS
    assert ("set_device", "cuda:1") in CALLS and ("communicator", "cuda:1") in CALLS
    assert ("empty_cache", None) in CALLS


def test_a_wrong_sum_is_a_collective_error() -> None:
    from goodput.agent.vllm_collective import VllmCollective

    FakeCommunicator.broken = True
    collective = VllmCollective(spec())

    with pytest.raises(CollectiveError, match=r"returned 2\.0, expected 10\.0"):
        collective.all_reduce(1024)


def test_a_single_gpu_needs_no_rendezvous_or_communicator() -> None:
    from goodput.agent.vllm_collective import VllmCollective

    collective = VllmCollective(spec(rank=0, world=1))
    collective.all_reduce(1024)
    collective.close()

    assert [name for name, _ in CALLS] == ["set_device", "empty_cache"]


def test_a_single_gpu_runs_on_torch_alone_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-GPU check must run where only torch is installed (a GPU machine without vLLM)."""
    from goodput.agent.vllm_collective import VllmCollective

    monkeypatch.setitem(sys.modules, "vllm", None)  # importing vllm now raises ImportError
    monkeypatch.delitem(sys.modules, "vllm.distributed.utils")
    monkeypatch.delitem(sys.modules, "vllm.distributed.device_communicators.pynccl")

    collective = VllmCollective(spec(rank=0, world=1))
    assert collective.all_reduce(1024) >= 0
    collective.close()
