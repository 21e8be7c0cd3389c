"""The gateway's event loop, collector and stream relay: `goodput gateway` runs on uvloop, its
connection guard and relay behave there as on asyncio's own loop, a relayed stream reads as the
engine wrote it, its head sent at once even when the engine's first token is still to come, and once
started the gateway freezes what start-up built and collects young objects less often."""

from __future__ import annotations

import argparse
import asyncio
import gc
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from test_gateway import MODEL, completion, rig, run, sample
from test_gateway_limits import connect, seats_taken, seconds_until_closed

from goodput.gateway import cli
from goodput.gateway.limits import ClientLimits

# Far longer than a test waits for a stream's head: a head that waited for the first token fails.
FIRST_TOKEN_DELAY_SECONDS = 30.0


def run_on_uvloop(test: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(test(), timeout=30))


def test_the_gateway_command_serves_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve(_: argparse.Namespace) -> int:
        loops.append(asyncio.get_running_loop())
        return 0

    monkeypatch.setattr(cli, "_serve", serve)
    assert cli.run(argparse.Namespace()) == 0
    assert len(loops) == 1 and isinstance(loops[0], uvloop.Loop)


def test_on_uvloop_streams_are_relayed_whole_and_a_client_past_its_cap_is_closed() -> None:
    async def main() -> None:
        async with rig(limits=ClientLimits(max_connections_per_client=2), tokens=5) as r:
            body = completion(max_tokens=8, stream=True)
            async with r.session.post(r.url + "/v1/completions", json=body) as response:
                text = (await response.read()).decode()
            events = [line for line in text.splitlines() if line.startswith("data: ")]
            assert response.status == 200 and len(events) == 6 and events[-1] == "data: [DONE]"
            labels = {"model_group": MODEL, "slo_class": "chat"}
            assert sample(r.gateway, "goodput_gateway_time_to_first_token_seconds_count", **labels) == 1
            await seats_taken(r, 1)  # the client session's pooled connection
            held = await connect(r)
            reader, _ = await connect(r)
            assert await seconds_until_closed(reader, asyncio.get_running_loop().time()) < 0.5
            assert sample(
                r.gateway,
                "goodput_gateway_connections_closed_total",
                model_group=MODEL,
                reason="client_connection_limit",
            )
            held[1].close()

    run_on_uvloop(main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_streams_head_reaches_the_client_before_the_engines_first_token(loop: str) -> None:
    async def main() -> None:
        async with rig(tokens=2, token_delay_seconds=FIRST_TOKEN_DELAY_SECONDS) as r:
            body = completion(max_tokens=2, stream=True)
            response = await asyncio.wait_for(r.session.post(r.url + "/v1/completions", json=body), 10)
            assert response.status == 200
            assert response.headers["X-Goodput-Outcome"] == "admitted"
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert not response.content.is_eof()
            response.close()

    (run_on_uvloop if loop == "uvloop" else run)(main)


def test_once_started_the_gateway_freezes_what_start_up_built_and_collects_the_young_less_often() -> None:
    threshold = gc.get_threshold()
    try:
        cli.settle_garbage_collection()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (cli.YOUNG_COLLECTION_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
