"""What a client may hold of the gateway: nesting, connection time, connections per address, body
bytes and memory; and that a client that keeps to the limits is served meanwhile.

The rules are pure state tested with times passed in; the wiring is tested through the gateway as
`goodput gateway` serves it, on real loopback sockets, with limits of a fraction of a second.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import pytest
from test_gateway import MODEL, Rig, completion, rig, run, sample
from virtual_time import run_virtual
from waiting import until

from goodput.gateway.connections import ClientCounts, HeadDeadline
from goodput.gateway.limits import MIB, BodyBudget, ClientLimits
from goodput.gateway.requests import MAX_JSON_DEPTH, BadRequestError, json_depth_exceeds, parse_body

SHORT = ClientLimits(header_timeout_seconds=0.2, body_timeout_seconds=0.2, keepalive_timeout_seconds=0.3)
# How long a test waits for something that should happen within a fraction of a second.
PATIENCE_SECONDS = 2.0


def closed(r: Rig, reason: str) -> float:
    return sample(r.gateway, "goodput_gateway_connections_closed_total", model_group=MODEL, reason=reason)


def refused(r: Rig, code: str) -> float:
    return sample(r.gateway, "goodput_gateway_bodies_refused_total", model_group=MODEL, code=code)


async def connect(r: Rig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = urlsplit(r.url)
    return await asyncio.open_connection(url.hostname, url.port)


def head(method: str, path: str, **headers: str | int) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: status, headers (lower-cased names), body by Content-Length."""
    status_line = await asyncio.wait_for(reader.readline(), PATIENCE_SECONDS)
    assert status_line, "the connection closed without an answer"
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


def now() -> float:
    """The running loop's clock: the one the gateway's timeouts count on (virtual under run_virtual)."""
    return asyncio.get_running_loop().time()


async def seconds_until_closed(reader: asyncio.StreamReader, started: float) -> float:
    """How long after `started` the gateway closed the connection (EOF or reset), reading and
    dropping anything it sent first; fails if it stays open for PATIENCE_SECONDS."""
    try:
        async with asyncio.timeout(PATIENCE_SECONDS):
            while await reader.read(65536):
                pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {PATIENCE_SECONDS}s") from None
    return now() - started


async def trickle(writer: asyncio.StreamWriter, pieces: list[bytes], gap_seconds: float) -> None:
    """Send `pieces` one by one, `gap_seconds` apart, until they run out or the gateway hangs up."""
    for piece in pieces:
        if writer.is_closing():
            return
        try:
            writer.write(piece)
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(gap_seconds)


# --- nesting --------------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "raw",
    [
        nested(100_000).encode(),
        json.dumps({"model": MODEL, "messages": "NESTED"}).replace('"NESTED"', nested(100_000)).encode(),
    ],
    ids=["100,000 nested arrays", "100,000 nested arrays as the messages"],
)
def test_a_deeply_nested_body_gets_400_naming_the_nesting_and_the_next_request_is_served(raw: bytes) -> None:
    async def main() -> None:
        async with rig() as r:
            headers = {"Content-Type": "application/json"}
            for path in ("/v1/completions", "/v1/chat/completions"):
                response = await r.session.post(r.url + path, data=raw, headers=headers)
                assert response.status == 400
                assert "nests" in (await response.json())["error"]["message"]
            assert (await r.post(completion())).status == 200
            assert r.upstreams["g1"].received[0].body["prompt"] == "Hello there"

    run(main)


def test_nesting_up_to_the_bound_is_read_and_one_level_more_is_refused() -> None:
    within = {"model": MODEL, "prompt": "x", "tools": json.loads(nested(MAX_JSON_DEPTH - 1))}
    assert parse_body(json.dumps(within).encode())["tools"]
    beyond = json.dumps({"model": MODEL, "prompt": "x", "tools": json.loads(nested(MAX_JSON_DEPTH))})
    with pytest.raises(BadRequestError, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        parse_body(beyond.encode())


def test_brackets_inside_strings_and_side_by_side_do_not_count_as_nesting() -> None:
    text = json.dumps({"prompt": '[[[{ "quoted \\" [[[' * 100, "list": [[1], {"a": [2]}] * 1000})
    assert not json_depth_exceeds(text.encode(), limit=4)  # the object, the list, {"a": ...}, [2]
    assert json_depth_exceeds(text.encode(), limit=3)


# --- connections ----------------------------------------------------------------------------------


def test_the_head_deadline_starts_at_opening_and_again_at_the_next_requests_first_byte() -> None:
    head_deadline = HeadDeadline.opened(10.0, now=100.0)
    assert not head_deadline.expired(109.9) and head_deadline.expired(110.0)
    head_deadline.request_started()
    head_deadline.bytes_arrived(120.0)  # the body: its own deadline, not the head's
    assert not head_deadline.expired(1000.0)
    head_deadline.request_finished()
    assert not head_deadline.expired(2000.0)  # idle between requests: keep-alive's bound, not this
    head_deadline.bytes_arrived(2000.0)
    head_deadline.bytes_arrived(2005.0)  # later bytes of the same head do not extend it
    assert not head_deadline.expired(2009.9) and head_deadline.expired(2010.0)


def test_after_an_answer_that_closes_the_connection_the_rest_of_its_body_starts_no_head_deadline() -> None:
    head_deadline = HeadDeadline.opened(10.0, now=100.0)
    head_deadline.request_started()
    head_deadline.request_finished(closing=True)  # a refused body: aiohttp drains it, then closes
    head_deadline.bytes_arrived(101.0)
    assert not head_deadline.expired(1000.0)


def test_a_client_address_holds_at_most_its_cap_and_gets_its_seats_back() -> None:
    counts = ClientCounts(limit=2)
    assert counts.admit("10.0.0.1") and counts.admit("10.0.0.1")
    assert not counts.admit("10.0.0.1")
    assert counts.admit("10.0.0.2")  # another client is not affected
    counts.closed("10.0.0.1")
    assert counts.admit("10.0.0.1")
    for _ in range(2):
        counts.closed("10.0.0.1")
    counts.closed("10.0.0.2")
    assert counts.open == {}
    assert all(ClientCounts(limit=0).admit("10.0.0.1") for _ in range(1000))  # 0: no cap


@pytest.mark.parametrize(
    "sent",
    [[], [b"POST /v1/completions HTTP/1.1\r\n"] + [b"X-Slow: 1\r\n"] * 100],
    ids=["nothing sent", "one header line every 50 ms"],
)
def test_a_connection_without_a_whole_head_is_closed_at_the_header_timeout(sent: list[bytes]) -> None:
    async def main() -> None:
        async with rig(limits=SHORT) as r:
            started = now()
            reader, writer = await connect(r)
            sender = asyncio.create_task(trickle(writer, sent, 0.05))
            elapsed = await seconds_until_closed(reader, started)
            assert SHORT.header_timeout_seconds <= elapsed < 1.0
            assert closed(r, "header_timeout") == 1
            await sender
            assert (await r.post(completion())).status == 200

    run_virtual(main)


def test_a_kept_alive_connection_may_idle_past_the_header_timeout_and_closes_at_the_keepalive_timeout() -> (
    None
):
    limits = ClientLimits(header_timeout_seconds=0.2, keepalive_timeout_seconds=0.6)

    async def main() -> None:
        async with rig(limits=limits) as r:
            reader, writer = await connect(r)
            writer.write(head("GET", "/healthz"))
            assert (await read_answer(reader))[0] == 200
            # On the virtual clock: idle past the header timeout, within the keep-alive timeout.
            await asyncio.sleep(0.3)
            writer.write(head("GET", "/healthz"))
            assert (await read_answer(reader))[0] == 200
            answered = now()
            elapsed = await seconds_until_closed(reader, answered)
            assert limits.keepalive_timeout_seconds - 0.05 <= elapsed < 1.5
            assert closed(r, "header_timeout") == 0
            writer.close()

    run_virtual(main)


def test_connections_past_the_per_client_cap_are_closed_as_they_open_and_the_client_is_still_served() -> None:
    async def main() -> None:
        async with rig(limits=ClientLimits(max_connections_per_client=2)) as r:
            held = [await connect(r) for _ in range(2)]
            reader, _ = await connect(r)
            assert await seconds_until_closed(reader, now()) < 0.5
            assert closed(r, "client_connection_limit") == 1
            assert not any(writer.is_closing() for _, writer in held)
            held[0][1].close()
            await seats_taken(r, 1)
            response = await r.post(completion())  # the pool's connection takes the freed seat
            assert response.status == 200
            await r.session.close()
            held[1][1].close()
            await seats_taken(r, 0)
            assert r.guard.clients.open == {}

    run(main)


async def seats_taken(r: Rig, count: int) -> None:
    """Wait until the gateway counts `count` connections open from 127.0.0.1."""
    await until(
        lambda: r.guard.clients.open.get("127.0.0.1", 0) == count,
        f"{count} connections open from 127.0.0.1",
        timeout_seconds=PATIENCE_SECONDS,
    )


# --- bodies ---------------------------------------------------------------------------------------


def test_a_body_declared_past_the_limit_is_refused_before_any_of_it_is_sent() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await connect(r)
            writer.write(
                head("POST", "/v1/completions", Content_Type="application/json", Content_Length=42 * MIB)
            )
            status, headers, body = await read_answer(reader)
            assert status == 413 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "BodyTooLarge"
            assert r.front.bodies.held_bytes == 0
            writer.close()
            assert (await r.post(completion())).status == 200

    run(main)


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    limits = ClientLimits(max_body_bytes=1024, body_budget_bytes=4096)

    async def main() -> None:
        async with rig(limits=limits) as r:
            reader, writer = await connect(r)
            writer.write(head("POST", "/v1/completions", Transfer_Encoding="chunked"))
            for _ in range(2):
                writer.write(b"258\r\n" + b" " * 600 + b"\r\n")  # 600 bytes a chunk; no last chunk
            status, _, body = await read_answer(reader)
            assert status == 413 and "passed 1200 bytes" in json.loads(body)["error"]["message"]
            assert refused(r, "BodyTooLarge") == 1
            assert r.front.bodies.held_bytes == 0
            writer.close()

    run(main)


@pytest.mark.parametrize(
    ("gap_seconds", "pieces"), [(0.0, 1), (0.05, 60)], ids=["stalled", "one byte per 50 ms"]
)
def test_a_body_not_whole_by_the_body_timeout_gets_408_and_its_connection_is_closed(
    gap_seconds: float, pieces: int
) -> None:
    async def main() -> None:
        async with rig(limits=SHORT) as r:
            reader, writer = await connect(r)
            writer.write(head("POST", "/v1/completions", Content_Type="application/json", Content_Length=100))
            sender = asyncio.create_task(trickle(writer, [b" "] * pieces, gap_seconds))
            started = now()
            status, headers, _ = await read_answer(reader)
            assert status == 408 and headers["connection"] == "close"
            assert SHORT.body_timeout_seconds - 0.05 <= now() - started < 1.0
            assert await seconds_until_closed(reader, started) < 1.0
            sender.cancel()
            assert refused(r, "BodyTimeout") == 1
            assert r.front.bodies.held_bytes == 0
            assert (await r.post(completion())).status == 200

    run(main)


def padded_completion(size_bytes: int) -> bytes:
    """A valid completion request of exactly `size_bytes` bytes."""
    bare = json.dumps(completion(prompt=""))
    return json.dumps(completion(prompt="x" * (size_bytes - len(bare)))).encode()


def test_bodies_in_flight_share_one_budget_and_one_that_does_not_fit_gets_503_with_retry_after() -> None:
    limits = ClientLimits(max_body_bytes=1024, body_budget_bytes=1536, body_timeout_seconds=PATIENCE_SECONDS)

    async def main() -> None:
        async with rig(limits=limits) as r:
            first = padded_completion(1000)
            reader, writer = await connect(r)
            writer.write(
                head("POST", "/v1/completions", Content_Type="application/json", Content_Length=1000)
            )
            writer.write(first[:900])
            await writer.drain()
            await until(lambda: r.front.bodies.held_bytes >= 900, "the gateway holds the first body's bytes")
            refused = await r.session.post(
                r.url + "/v1/completions",
                data=padded_completion(700),
                headers={"Content-Type": "application/json"},
            )
            assert refused.status == 503 and refused.headers["Retry-After"] == "1"
            assert (await refused.json())["error"]["code"] == "BodyBudget"
            writer.write(first[900:])
            assert (await read_answer(reader))[0] == 200
            writer.close()
            assert r.front.bodies.held_bytes == 0
            retried = await r.session.post(
                r.url + "/v1/completions",
                data=padded_completion(700),
                headers={"Content-Type": "application/json"},
            )
            assert retried.status == 200
            assert r.front.bodies.held_bytes == 0

    run(main)


def test_a_lease_gives_back_every_byte_it_took_however_its_request_ends() -> None:
    budget = BodyBudget(capacity_bytes=100)
    with pytest.raises(RuntimeError), budget.lease() as lease:
        assert lease.take(60) and lease.take(30)
        assert not lease.take(11) and budget.held_bytes == 90
        raise RuntimeError("the request failed")
    assert budget.held_bytes == 0 and budget.free_bytes == 100


def test_limits_that_could_never_serve_a_body_are_refused() -> None:
    with pytest.raises(ValueError, match="within body_budget_bytes"):
        ClientLimits(max_body_bytes=2 * MIB, body_budget_bytes=MIB)
    with pytest.raises(ValueError, match="header_timeout_seconds must be positive"):
        ClientLimits(header_timeout_seconds=0)


def test_the_gateway_options_set_every_client_limit_and_refuse_an_impossible_one() -> None:
    import argparse

    from goodput.gateway.cli import add_arguments, client_limits

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert client_limits(parser.parse_args([])) == ClientLimits()
    flags = "--header-timeout-seconds 1 --body-timeout-seconds 2 --keepalive-timeout-seconds 3 "
    flags += "--max-connections-per-client 4 --max-body-mib 0.5 --body-budget-mib 8"
    assert client_limits(parser.parse_args(flags.split())) == ClientLimits(
        1.0, 2.0, 3.0, 4, MIB // 2, 8 * MIB
    )
    with pytest.raises(SystemExit, match="within body_budget_bytes"):
        client_limits(parser.parse_args(["--max-body-mib", "256"]))


# --- logs -----------------------------------------------------------------------------------------


def test_an_oversized_header_is_one_warning_line_not_an_error_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with rig() as r:
            for _ in range(3):
                reader, writer = await connect(r)
                writer.write(
                    b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
                )
                assert (await read_answer(reader))[0] == 400
                writer.close()
            assert (await r.post(completion())).status == 200

    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        run(main)
    records = [record for record in caplog.records if record.name == "aiohttp.server"]
    assert [record.levelno for record in records] == [logging.WARNING] * 3
    assert all(record.exc_info is None for record in records)
    assert "Got more than" in records[0].getMessage() and "\n" not in records[0].getMessage()
