"""What each group of one ModelGroup holds of its LoRA adapters, and the loads that change it.

The gateway is the only one that loads and unloads adapters (through vLLM's runtime API,
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`), so it knows what each engine holds
from its own calls, and learns what a group already held when it first sees the group (the engine's
`/v1/models` lists each adapter with `parent` set to the base model). Routing decides from a frozen
view of this book (`controllers.requests.adapters.choose_adapter_group`); the book then records the
decision at once (the adapter counts as loaded and busy, the evicted one as gone), so the next
request routed in the same instant sees it, and runs the engine calls in the background. Requests
routed to a load in progress wait for that one load: an adapter is loaded once per group.

A load that fails marks the adapter failed on that group until the backoff ends; every request
waiting for that load gets the failure (`AdapterLoadError`, answered 502 `adapter_load_failed` with
the engine's message), none is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from goodput.api import vllm_names
from goodput.controllers.requests.adapters import (
    AdapterPlacement,
    AdapterPolicy,
    AdapterRoute,
    GroupAdapters,
    decayed_uses,
)

log = logging.getLogger("goodput.gateway")

ENGINE_MESSAGE_CHARS = 512


class AdapterLoadError(Exception):
    """An adapter did not load into a group; the message names both and quotes the engine."""

    def __init__(self, adapter: str, group: str, detail: str) -> None:
        super().__init__(f"adapter {adapter!r} failed to load on group {group}: {detail}")
        self.adapter = adapter
        self.group = group


@dataclass(slots=True)
class _GroupHoldings:
    loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)  # least recently used first
    in_flight: Counter[str] = field(default_factory=Counter)
    loading: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    failed_until: dict[str, float] = field(default_factory=dict)
    last_used: dict[str, float] = field(default_factory=dict)
    uses: dict[str, float] = field(default_factory=dict)  # recent uses as of last_used

    def view(self, now: float, half_life_seconds: float) -> GroupAdapters:
        busy = {name for name, count in self.in_flight.items() if count > 0} | set(self.loading)
        recent = {
            name: decayed_uses(count, now - self.last_used[name], half_life_seconds)
            for name, count in self.uses.items()
        }
        return GroupAdapters(
            tuple(self.loaded), frozenset(busy), dict(self.failed_until), dict(self.last_used), recent
        )

    def used(self, adapter: str, now: float, half_life_seconds: float) -> None:
        before = self.uses.get(adapter, 0.0)
        elapsed = now - self.last_used.get(adapter, now)
        self.uses[adapter] = decayed_uses(before, elapsed, half_life_seconds) + 1.0
        self.last_used[adapter] = now

    def forget(self, adapter: str) -> None:
        self.loaded.pop(adapter, None)
        self.last_used.pop(adapter, None)
        self.uses.pop(adapter, None)


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """One finished engine call of the book, for the metrics: `action` is 'load' or 'unload'."""

    adapter: str
    group: str
    action: str
    succeeded: bool


class AdapterBook:
    """One ModelGroup's adapters per group: held (in LRU order), in use, loading, failed."""

    def __init__(self, on_outcome: Callable[[LoadOutcome], None] = lambda _: None) -> None:
        self._groups: dict[str, _GroupHoldings] = {}
        self._on_outcome = on_outcome
        self._calls: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    def holdings(self, now: float, half_life_seconds: float) -> dict[str, GroupAdapters]:
        return {name: group.view(now, half_life_seconds) for name, group in self._groups.items()}

    def holders(self, adapter: str) -> list[str]:
        return [name for name, group in self._groups.items() if adapter in group.loaded]

    def keep_groups(self, names: set[str]) -> None:
        """Forget groups that left; a group that comes back is learnt again from its engine."""
        for name in list(self._groups):
            if name not in names:
                self._groups.pop(name)

    def learn(self, group: str, models: Any, base_model: str) -> None:
        """The adapters an engine's `/v1/models` lists (entries whose `parent` is the base model),
        added to what the book knows of the group (its own loads stay)."""
        holdings = self._groups.setdefault(group, _GroupHoldings())
        for entry in models.get("data", []) if isinstance(models, dict) else []:
            if (
                isinstance(entry, dict)
                and entry.get("parent") == base_model
                and isinstance(entry.get("id"), str)
            ):
                holdings.loaded.setdefault(entry["id"], None)

    def reserve(
        self,
        route: AdapterRoute,
        adapter: str,
        call: EngineCall,
        *,
        policy: AdapterPolicy,
        now: float,
    ) -> None:
        """Record a routing decision at once and start its engine calls: the adapter is in use on
        the group (and loading there unless held), the evicted one is gone."""
        holdings = self._groups.setdefault(route.group, _GroupHoldings())
        holdings.in_flight[adapter] += 1
        holdings.used(adapter, now, policy.use_half_life_seconds)
        if route.placement is AdapterPlacement.HELD:
            holdings.loaded.move_to_end(adapter)
            return
        if route.evict is not None:
            holdings.forget(route.evict)
        holdings.loaded[adapter] = None
        holdings.failed_until.pop(adapter, None)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        holdings.loading[adapter] = future
        source = policy.sources.get(adapter, adapter)
        task = asyncio.get_running_loop().create_task(
            self._load(
                call,
                holdings,
                route,
                adapter,
                source=source,
                failed_until=now + policy.failure_backoff_seconds,
            ),
            name=f"load-adapter-{adapter}",
        )
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def release(self, group: str, adapter: str) -> None:
        """A request for `adapter` left `group`: the adapter may be evicted once nothing uses it."""
        holdings = self._groups.get(group)
        if holdings is not None and holdings.in_flight[adapter] > 0:
            holdings.in_flight[adapter] -= 1

    async def ready(self, group: str, adapter: str) -> None:
        """Wait until `adapter` is loaded on `group` (at once when it was held); AdapterLoadError when
        the load failed."""
        holdings = self._groups.get(group)
        future = holdings.loading.get(adapter) if holdings is not None else None
        if future is not None:
            await asyncio.shield(future)

    async def _load(
        self,
        call: EngineCall,
        holdings: _GroupHoldings,
        route: AdapterRoute,
        adapter: str,
        *,
        source: str,
        failed_until: float,
    ) -> None:
        future = holdings.loading[adapter]
        try:
            if route.evict is not None:
                await call.post(vllm_names.Lora.UNLOAD_PATH, route.evict, None)
                self._on_outcome(LoadOutcome(route.evict, route.group, "unload", True))
            await call.post(vllm_names.Lora.LOAD_PATH, adapter, source)
        except AdapterLoadError as error:
            self._on_outcome(LoadOutcome(adapter, route.group, "load", False))
            holdings.forget(adapter)
            holdings.failed_until[adapter] = failed_until
            log.warning("%s", error)
            future.set_exception(error)
            future.exception()  # retrieved here: a load nobody waits for is not an unhandled error
        else:
            self._on_outcome(LoadOutcome(adapter, route.group, "load", True))
            future.set_result(None)
        finally:
            holdings.loading.pop(adapter, None)


@dataclass(frozen=True, slots=True)
class EngineCall:
    """vLLM's runtime adapter API on one group's leader."""

    session: aiohttp.ClientSession
    base_url: str
    group: str

    async def post(self, path: str, adapter: str, source: str | None) -> None:
        """200 is success; an unload the engine answers 404 found the adapter gone, which is what it
        wanted; anything else raises AdapterLoadError with the engine's message."""
        body = {"lora_name": adapter} if source is None else {"lora_name": adapter, "lora_path": source}
        try:
            async with self.session.post(self.base_url + path, json=body) as response:
                status = response.status
                text = "" if status == 200 else await response.text()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise AdapterLoadError(adapter, self.group, f"{path}: {error or type(error).__name__}") from error
        if status == 200 or (path == vllm_names.Lora.UNLOAD_PATH and status == 404):
            return
        detail = text
        with contextlib.suppress(ValueError, TypeError, KeyError):
            detail = str(json.loads(text)["error"]["message"])
        raise AdapterLoadError(
            adapter, self.group, f"{path} answered {status}: {detail[:ENGINE_MESSAGE_CHARS]}"
        )
