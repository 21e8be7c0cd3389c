"""The relay copies bytes both ways between a listening address and a loopback port, and closes a
client whose target does not answer."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from waiting import connection_once_listening

from goodput.testbed.cluster import relay
from goodput.testbed.cluster.controlplane import free_ports


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data.upper())
        await writer.drain()
    writer.close()


async def _through_relay(payloads: list[bytes], *, target_listening: bool) -> list[bytes]:
    relay_port, target_port = free_ports(2)
    target = await asyncio.start_server(_echo, "127.0.0.1", target_port) if target_listening else None
    serving = asyncio.create_task(relay.serve(None, "127.0.0.1", relay_port, target_port))
    try:
        reader, writer = await connection_once_listening("127.0.0.1", relay_port)
        answers = []
        for payload in payloads:
            writer.write(payload)
            await writer.drain()
            answers.append(await asyncio.wait_for(reader.read(1024), 5))
        writer.close()
        return answers
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        if target is not None:
            target.close()


def test_bytes_pass_both_ways_unchanged_by_the_relay() -> None:
    answers = asyncio.run(_through_relay([b"hello", b"tls records"], target_listening=True))
    assert answers == [b"HELLO", b"TLS RECORDS"]


def test_a_client_is_closed_when_the_target_does_not_listen() -> None:
    answers = asyncio.run(_through_relay([b"anyone?"], target_listening=False))
    assert answers == [b""]


@pytest.mark.parametrize("listen", ["10.1.255.0", "10.1.255.0:https", ":6443"])
def test_the_listen_address_needs_a_host_and_a_numeric_port(
    listen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        relay.main(["goodput-x", listen, "8443"])
    assert "expected HOST:PORT" in capsys.readouterr().err
