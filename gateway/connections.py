"""The gateway's connections: closed when they hold the gateway without sending a request.

aiohttp closes a connection idle between requests after its `keepalive_timeout`, and nothing else:
a client that sends one header line every few seconds, or opens connections and sends nothing, keeps
them until the process runs out of file descriptors. Each connection is wrapped here
(`GuardedProtocol` around aiohttp's own protocol): a request's head must arrive whole within
`header_timeout_seconds` (from the connection's opening, or from the next request's first byte on a
kept-alive connection), and one client address may hold at most `max_connections_per_client`
connections. The body's own deadline and size are `limits.read_body`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from goodput.gateway.limits import ClientLimits

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HEADER_TIMEOUT = "header_timeout"
CLIENT_CONNECTION_LIMIT = "client_connection_limit"
# How long a connection cut off after its answer still takes (and drops) what the client sends.
CUT_OFF_LINGER_SECONDS = 2.0


def cut_off(transport: asyncio.BaseTransport | None) -> None:
    """End a connection whose answer is written: the end of the stream now, the socket closed
    CUT_OFF_LINGER_SECONDS later. Closing at once while the client is still writing (a body too slow
    to arrive) resets the connection, and a reset can reach the client before it has read the
    answer; a half close lets it read the answer whole and see the end, and the bytes it still sends
    are taken and dropped until the socket closes."""
    if transport is None or transport.is_closing():
        return
    # Duck-typed: uvloop's transports are not registered as asyncio's transport classes.
    if getattr(transport, "can_write_eof", lambda: False)():
        cast(asyncio.WriteTransport, transport).write_eof()
        asyncio.get_running_loop().call_later(CUT_OFF_LINGER_SECONDS, transport.close)
    else:
        transport.close()


@dataclass(slots=True)
class HeadDeadline:
    """When a connection must have delivered a whole request head: pure state, times passed in.

    A new connection starts with a deadline (it was opened to send a request); once a request is
    being handled there is none (its body has its own); after it, the connection may idle (aiohttp's
    keep-alive timeout bounds that), and the next request's first byte starts a new deadline. After
    an answer that closes the connection no request follows: the bytes still arriving are the
    refused body's rest, which aiohttp drains for at most its lingering time, then closes."""

    timeout_seconds: float
    deadline: float | None = None
    in_request: bool = False

    @classmethod
    def opened(cls, timeout_seconds: float, now: float) -> HeadDeadline:
        return cls(timeout_seconds, now + timeout_seconds)

    def bytes_arrived(self, now: float) -> None:
        if self.deadline is None and not self.in_request:
            self.deadline = now + self.timeout_seconds

    def request_started(self) -> None:
        self.in_request = True
        self.deadline = None

    def request_finished(self, closing: bool = False) -> None:
        self.in_request = closing

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


class ClientCounts:
    """Open connections per client address, and whether one more may open."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def admit(self, address: str) -> bool:
        count = self.open.get(address, 0)
        if self.limit and count >= self.limit:
            return False
        self.open[address] = count + 1
        return True

    def closed(self, address: str) -> None:
        count = self.open.get(address, 0) - 1
        if count > 0:
            self.open[address] = count
        else:
            self.open.pop(address, None)


class GuardedProtocol(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the head deadline and the per-client count around it.

    aiohttp's protocol sees the real transport and every byte; this wrapper only watches the bytes
    arrive and closes the transport when the head deadline passes."""

    def __init__(self, guard: ConnectionGuard, inner_factory: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self.inner_factory = inner_factory
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.address: str | None = None
        self.head: HeadDeadline | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, not registered as one
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if not self.guard.clients.admit(address):
            self.guard.count_close(CLIENT_CONNECTION_LIMIT)
            self.transport.abort()  # refused before aiohttp sees it: nothing was read, nothing to answer
            return
        self.address = address
        self.head = HeadDeadline.opened(self.guard.limits.header_timeout_seconds, self.guard.loop.time())
        self._arm()
        self.inner = self.inner_factory()
        self.guard.connections[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.head is not None and self.head.deadline is None:
            self.head.bytes_arrived(self.guard.loop.time())
            self._arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.inner is None:
            return
        self.guard.connections.pop(self.inner, None)
        if self.address is not None:
            self.guard.clients.closed(self.address)
        self.inner.connection_lost(exc)

    def request_started(self) -> None:
        if self.head is not None:
            self.head.request_started()

    def request_finished(self, closing: bool) -> None:
        if self.head is not None:
            self.head.request_finished(closing)

    def _arm(self) -> None:
        """One timer at the deadline; moved deadlines are caught when it fires (as aiohttp's
        keep-alive timer does), so a request costs no timer churn."""
        if self.timer is None and self.head is not None and self.head.deadline is not None:
            self.timer = self.guard.loop.call_at(self.head.deadline, self._check)

    def _check(self) -> None:
        self.timer = None
        if self.head is None or self.transport is None or self.transport.is_closing():
            return
        if self.head.expired(self.guard.loop.time()):
            self.guard.count_close(HEADER_TIMEOUT)
            self.transport.close()
            return
        self._arm()


class ConnectionGuard:
    """The state every connection of one listening socket shares: the limits, the per-client counts,
    and the live connections by aiohttp's protocol (how a request finds its own)."""

    def __init__(
        self,
        limits: ClientLimits,
        loop: asyncio.AbstractEventLoop,
        count_close: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.limits = limits
        self.loop = loop
        self.count_close = count_close
        self.clients = ClientCounts(limits.max_connections_per_client)
        self.connections: dict[asyncio.Protocol, GuardedProtocol] = {}

    def protocol_factory(
        self, inner_factory: Callable[[], asyncio.Protocol]
    ) -> Callable[[], GuardedProtocol]:
        return lambda: GuardedProtocol(self, inner_factory)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the connection busy while a request is handled: its head has arrived whole."""
        connection = self.connections.get(request.protocol)
        if connection is not None:
            connection.request_started()
        response: web.StreamResponse | None = None
        try:
            response = await handler(request)
            return response
        finally:
            if connection is not None:
                connection.request_finished(closing=response is not None and response.keep_alive is False)


CONNECTION_GUARD = web.AppKey("connection_guard", ConnectionGuard)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are `GuardedProtocol`s around the runner's aiohttp protocol."""

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard, host: str, port: int) -> None:
        super().__init__(runner)
        self.guard = guard
        self.host = host
        self.port = port

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.protocol_factory(server),
            self.host,
            self.port,
            backlog=self._backlog,
            reuse_address=True,
        )


class ClientErrorLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log with a client's malformed request (an oversized header line, a bad request
    line) as one WARNING line: aiohttp logs each with a full ERROR traceback, which any client can
    repeat at will. Errors of the gateway's own keep their traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.warning(f"{msg}: %s", *args, _one_line(exc_info), **kwargs)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def _one_line(error: HttpProcessingError) -> str:
    return f"{error.code} {error.message}".replace("\n", " ")[:300]


async def start_serving(
    app: web.Application,
    host: str,
    port: int,
    limits: ClientLimits,
    count_close: Callable[[str], None] = lambda reason: None,
) -> web.AppRunner:
    """Serve `app` on host:port under `limits`: the runner (its `addresses` name the bound port;
    `cleanup()` stops it; `app[CONNECTION_GUARD]` holds the connections' shared state)."""
    guard = ConnectionGuard(limits, asyncio.get_running_loop(), count_close)
    app[CONNECTION_GUARD] = guard
    app.middlewares.append(guard.middleware)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=limits.keepalive_timeout_seconds,
        logger=ClientErrorLog(logging.getLogger("aiohttp.server"), {}),
    )
    await runner.setup()
    await GuardedSite(runner, guard, host, port).start()
    return runner
