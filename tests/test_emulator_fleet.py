"""The fleet emulator's reconcile loop against an in-memory API server, serving on loopback.

The fake API keeps pods, applies the emulator's patches the way the API server would (annotations
merged, conditions merged by type) and feeds them back through the watch, so these tests follow the
same loop as a real cluster: pod event -> plan -> server lifecycle and health reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from waiting import eventually, until

from goodput.controllers import naming
from goodput.testbed.cluster.controlplane import free_port
from goodput.testbed.emulator import EmulatorSettings, FleetEmulator
from goodput.testbed.emulator_kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, WatchEvent
from goodput.testbed.emulator_netns import ListenerFactory


class FakeKube:
    """Pods in memory; patches are applied and announced on the watch."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self._events: asyncio.Queue[WatchEvent] = asyncio.Queue()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        if path == "/api/v1/pods":
            return {
                "metadata": {"resourceVersion": "1"},
                "items": [copy.deepcopy(p) for p in self.pods.values()],
            }
        return None  # no ModelGroup objects: the emulator falls back to the pod's flags

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]:
        self.patches.append((path, content_type, dict(body)))
        parts = path.split("/")
        pod = self.pods[(parts[4], parts[6])]
        if path.endswith("/status"):
            conditions = pod["status"].setdefault("conditions", [])
            for new in body["status"]["conditions"]:
                conditions[:] = [c for c in conditions if c["type"] != new["type"]] + [new]
        else:
            pod["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        self.announce("MODIFIED", pod)
        return pod

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent]:
        while True:
            yield await self._events.get()

    def announce(self, kind: str, pod: dict[str, Any]) -> None:
        self._events.put_nowait(WatchEvent(kind, copy.deepcopy(pod)))

    def update(self, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        pod = self.pods[(namespace, name)]
        change(pod)
        self.announce("MODIFIED", pod)

    def conditions(self, name: str) -> dict[str, str]:
        pod = self.pods[("ns", name)]
        return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}


def make_pod(
    name: str, rank: int, port: int, *, shutdown_timeout: float = 0.0, load_seconds: float = 0.3
) -> dict[str, Any]:
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    args = ["m", "--revision", "rev-7", "--shutdown-timeout", str(shutdown_timeout), "--port", str(port)]
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": {
                naming.LABEL_MODEL_GROUP: "mg",
                naming.LABEL_GROUP: "g0",
                naming.LABEL_RANK: str(rank),
            },
            "annotations": {
                "sim.goodput.dev/load-seconds": str(load_seconds),
                "sim.goodput.dev/nccl-check-seconds": "0.2",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "command": ["vllm", "serve"],
                    "args": args if rank == 0 else [*args, "--headless"],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": started}}}],
        },
    }


async def health(port: int) -> int | None:
    """The /health status, or None when the port refuses connections."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/health") as response,
        ):
            return response.status
    except aiohttp.ClientConnectorError:
        return None


@contextlib.asynccontextmanager
async def emulating(kube: FakeKube) -> AsyncIterator[FleetEmulator]:
    stop = asyncio.Event()
    emulator = FleetEmulator(kube, ListenerFactory(None), EmulatorSettings())  # type: ignore[arg-type]
    running = asyncio.create_task(emulator.run(stop))
    try:
        yield emulator
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


def test_a_leader_serves_after_its_load_and_every_rank_reports_health() -> None:
    port = free_port()

    async def main() -> None:
        kube = FakeKube([make_pod("mg-g0-0", 0, port, load_seconds=1.0), make_pod("mg-g0-1", 1, port)])
        started = time.monotonic()
        async with emulating(kube):
            assert await health(port) is None, "refused while loading"
            await eventually(lambda: _is(health(port), 200), "the leader to serve")
            assert time.monotonic() - started >= 0.9
            for name in ("mg-g0-0", "mg-g0-1"):
                await eventually(
                    lambda n=name: _true(kube.conditions(n).get(naming.CONDITION_NCCL_HEALTHY) == "True"),
                    f"NCCLHealthy on {name}",
                )
                annotations = kube.pods[("ns", name)]["metadata"]["annotations"]
                assert annotations[naming.ANNOTATION_MODEL_REVISION] == "rev-7"
            kinds = {(path.rsplit("/", 1)[-1], content_type) for path, content_type, _ in kube.patches}
            assert kinds == {
                ("mg-g0-0", MERGE_PATCH),
                ("mg-g0-1", MERGE_PATCH),
                ("status", STRATEGIC_MERGE_PATCH),
            }
            for name in ("mg-g0-0", "mg-g0-1"):
                await eventually(
                    lambda n=name: _true(kube.conditions(n).get(naming.CONDITION_GPU_HEALTHY) == "True"),
                    f"GPUHealthy on {name}",
                )
            # Per rank: the revision annotation, NCCLHealthy and GPUHealthy.
            assert len(kube.patches) == 6, "each report is written once"
            kube.update(
                "ns",
                "mg-g0-1",
                lambda pod: pod["metadata"]["annotations"].pop(naming.ANNOTATION_MODEL_REVISION),
            )
            await eventually(
                lambda: _true(
                    kube.pods[("ns", "mg-g0-1")]["metadata"]["annotations"].get(
                        naming.ANNOTATION_MODEL_REVISION
                    )
                    == "rev-7"
                ),
                "a removed report written again",
            )

    asyncio.run(main())


@pytest.mark.parametrize("rank", [0, 1], ids=["leader", "follower"])
def test_an_nccl_failure_fault_turns_that_ranks_condition_false(rank: int) -> None:
    port = free_port()

    async def main() -> None:
        kube = FakeKube([make_pod("mg-g0-0", 0, port), make_pod("mg-g0-1", 1, port)])
        async with emulating(kube):
            name = f"mg-g0-{rank}"
            await eventually(
                lambda: _true(kube.conditions(name).get(naming.CONDITION_NCCL_HEALTHY) == "True"),
                "a healthy report first",
            )
            kube.update(
                "ns",
                name,
                lambda pod: pod["metadata"]["annotations"].update({"sim.goodput.dev/fault": "nccl-failure"}),
            )
            await eventually(
                lambda: _true(kube.conditions(name).get(naming.CONDITION_NCCL_HEALTHY) == "False"),
                "NCCLHealthy False",
            )
            other = f"mg-g0-{1 - rank}"
            assert kube.conditions(other)[naming.CONDITION_NCCL_HEALTHY] == "True"
            assert await health(port) == 200, "an NCCL report alone does not stop the leader"

    asyncio.run(main())


def test_engine_death_closes_the_port_and_clearing_the_fault_restarts_with_a_new_load() -> None:
    port = free_port()

    async def main() -> None:
        kube = FakeKube([make_pod("mg-g0-0", 0, port)])
        async with emulating(kube) as emulator:
            await eventually(lambda: _is(health(port), 200), "the leader to serve")
            kube.update(
                "ns",
                "mg-g0-0",
                lambda pod: pod["metadata"]["annotations"].update({"sim.goodput.dev/fault": "engine-death"}),
            )
            await eventually(lambda: _is(health(port), 503), "/health 503")
            await eventually(lambda: _is(health(port), None), "the port to close", timeout_seconds=30)
            kube.update(
                "ns", "mg-g0-0", lambda pod: pod["metadata"]["annotations"].pop("sim.goodput.dev/fault")
            )
            await eventually(lambda: _is(health(port), 200), "the restarted engine to serve")
            assert emulator is not None

    asyncio.run(main())


def test_a_deleted_pod_drains_for_its_shutdown_timeout_then_closes() -> None:
    port = free_port()

    async def main() -> None:
        kube = FakeKube([make_pod("mg-g0-0", 0, port, shutdown_timeout=30.0)])
        async with emulating(kube) as emulator:
            await eventually(lambda: _is(health(port), 200), "the leader to serve")
            async with aiohttp.ClientSession() as session:
                body = {"prompt": "a b c", "max_tokens": 40}
                request = asyncio.create_task(
                    session.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
                )
                await until(
                    lambda: any(leader.server.engine.in_flight for leader in emulator._leaders.values()),
                    "the request is in flight",
                )
                kube.update(
                    "ns",
                    "mg-g0-0",
                    lambda pod: pod["metadata"].update(
                        {"deletionTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
                    ),
                )
                response = await request
                result = await response.json()
                assert result["choices"][0]["finish_reason"] == "length", "in-flight work finishes"
            await eventually(lambda: _is(health(port), None), "the port to close")

    asyncio.run(main())


async def _is(value: Awaitable[int | None], expected: int | None) -> bool:
    return await value == expected


async def _true(value: bool) -> bool:
    return value
