"""The real collective: NCCL through the `vllm` package's own wrapper, as the vLLM image carries it.

`StatelessProcessGroup` is a TCP-store rendezvous that needs no torch.distributed world, and
`PyNcclCommunicator` is vLLM's ctypes binding of NCCL on top of it, so the check changes nothing
about how vLLM itself starts. A group of one GPU has nothing to all-reduce with: its rank still
allocates, fills, synchronises and checks its buffer on the device, with torch alone. Imported only
inside a check's rank process (torch and CUDA stay out of the agent); the process ends after the
check, which returns its GPU memory to the driver.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from goodput.agent.nccl import CollectiveError, RankSpec


class VllmCollective:
    def __init__(self, spec: RankSpec) -> None:
        import torch

        self._torch: Any = torch
        self._spec = spec
        self._device = torch.device(f"cuda:{spec.device}")
        torch.cuda.set_device(self._device)
        self._communicator: Any = None
        if spec.world_size == 1:
            return  # one GPU: nothing to all-reduce with (vLLM disables its communicator too)
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        create = StatelessProcessGroup.create
        options: dict[str, Any] = {}
        if "store_timeout" in inspect.signature(create).parameters:
            options["store_timeout"] = int(spec.rendezvous_timeout_seconds)
        self._group = create(
            host=spec.leader_host, port=spec.port, rank=spec.rank, world_size=spec.world_size, **options
        )
        self._communicator = PyNcclCommunicator(self._group, device=self._device)
        if getattr(self._communicator, "available", True) is False:
            raise CollectiveError("vLLM's NCCL communicator could not load the NCCL library")
        self._communicator.disabled = False  # vLLM up to 0.6.4 creates it disabled

    def all_reduce(self, size_bytes: int) -> float:
        torch = self._torch
        tensor = torch.full(
            (max(1, size_bytes // 4),), float(self._spec.rank + 1), dtype=torch.float32, device=self._device
        )
        torch.cuda.synchronize(self._device)
        start = time.perf_counter()
        result = self._communicator.all_reduce(tensor) if self._communicator is not None else None
        torch.cuda.synchronize(self._device)
        elapsed = time.perf_counter() - start
        total = tensor if result is None else result  # older vLLM reduces in place and returns None
        expected = self._spec.world_size * (self._spec.world_size + 1) / 2
        if not bool(torch.all(total == expected).item()):
            raise CollectiveError(f"NCCL all-reduce returned {float(total[0].item())}, expected {expected}")
        del tensor, total, result
        return elapsed

    def close(self) -> None:
        torch = self._torch
        del self._communicator
        torch.cuda.empty_cache()
