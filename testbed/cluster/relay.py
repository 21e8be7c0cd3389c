"""A TCP relay from an address inside the harness's network namespace to a port on the host's loopback.

The API server reaches an extension API server only at its Service's endpoint, which must be a pod-like
address; KEDA's metrics adapter must itself reach the API server on the host's loopback. The adapter
therefore listens on loopback, and this relay accepts at the pod-like address (its listening socket
made inside the namespace, as the emulator makes its pods' sockets) and copies bytes both ways; TLS
passes through untouched. Run: python -m goodput.testbed.cluster.relay NETNS HOST:PORT TARGET_PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from goodput.testbed.cluster.config import LOOPBACK
from goodput.testbed.emulator_netns import ListenerFactory

COPY_CHUNK_BYTES = 65_536
CONNECT_TIMEOUT_SECONDS = 5.0


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(COPY_CHUNK_BYTES):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _relay(
    target_port: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.wait_for(
            asyncio.open_connection(LOOPBACK, target_port), CONNECT_TIMEOUT_SECONDS
        )
    except (TimeoutError, OSError):
        client_writer.close()
        return
    await asyncio.gather(_copy(client_reader, upstream_writer), _copy(upstream_reader, client_writer))


async def serve(netns: str | None, host: str, port: int, target_port: int) -> None:
    """Relay until SIGTERM or SIGINT (or cancelled); `netns` None listens in this process's own."""
    listeners = ListenerFactory(netns)
    try:
        sock = await listeners.open(host, port)
    finally:
        listeners.close()
    server = await asyncio.start_server(lambda r, w: _relay(target_port, r, w), sock=sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m goodput.testbed.cluster.relay", description=__doc__)
    parser.add_argument("netns", help="network namespace to listen in")
    parser.add_argument("listen", type=_host_port, help="HOST:PORT inside that namespace")
    parser.add_argument("target_port", type=int, help="port on the host's loopback to relay to")
    args = parser.parse_args(argv)
    host, port = args.listen
    asyncio.run(serve(args.netns, host, port, args.target_port))


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


if __name__ == "__main__":
    main()
