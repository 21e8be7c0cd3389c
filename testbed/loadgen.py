"""An open-loop load generator: a request trace replayed as real streaming HTTP requests.

Requests are sent at the trace's times whatever the responses do (open loop): a slow server makes
requests pile up, as real users would, instead of slowing the offered load down. Each request is
a streaming `/v1/completions` (or chat) call; the client measures time to first token (TTFT), the
gaps between content chunks (ITL as a client sees it), time per output token after the first
(TPOT) and end-to-end latency, and classifies every request: ok, aborted (finish_reason 'abort'),
cut (the stream ended without `data: [DONE]`), error (an error event or HTTP status), connect
error, timeout, or not sent (concurrency limit, deadline).

Bounded: at most `max_requests`, sending stops after `duration_seconds`, each request gives up
after `request_timeout_seconds`, and the run ends by `duration + request timeout` at the latest.
Targets must be this machine: loopback, or an address the kernel routes through a veth pair (the
local cluster's pod network); anything else is refused before a byte is sent.

Prompts are made to be counted exactly by the emulator's tokenizer (one token per word): a Mooncake
request's prefix blocks become identical runs of words, so shared prefixes hit the server's prefix
cache; other prompts start with a word unique to the request, so they share nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import socket
import subprocess
import time
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from goodput.simulator.workload import Workload

log = logging.getLogger(__name__)

PREFIX_WORDS_PER_TRACE_BLOCK = 512
"""Mooncake's hash ids name 512-token blocks; each becomes 512 equal words."""
DEFAULT_MAX_REQUESTS = 10_000
DEFAULT_DURATION_SECONDS = 300.0
DEFAULT_REQUEST_TIMEOUT_SECONDS = 120.0
DEFAULT_CONCURRENCY_LIMIT = 1024
SEND_LEAD_SECONDS = 0.05
"""The first request is scheduled this long after the start, so setup does not count as lag."""

OUTCOMES = ("ok", "rejected", "aborted", "cut", "error", "http_error", "connect_error", "timeout")
"""`rejected`: refused by an admission gate (HTTP 429, with `Retry-After`); sent, answered at once."""
FAILED_OUTCOMES = ("aborted", "cut", "error", "http_error", "connect_error", "timeout")
"""Sent and not answered whole: every outcome but `ok` and `rejected`."""
TENANT_HEADER = "X-Goodput-Tenant"
GROUP_HEADER = "X-Goodput-Group"
"""The gateway names the group that served a request; a leader reached directly is its own group."""


class UnsafeTargetError(ValueError):
    """A target that is not on this machine; the load generator sends nothing to it."""


# ---------------------------------------------------------------------------------------- targets
def _ip_json(*args: str) -> list[dict[str, Any]]:
    try:
        result = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=5, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    if result.returncode != 0:
        return []
    try:
        data = json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        return []
    return [entry for entry in data if isinstance(entry, dict)]


def route_device(address: str) -> str | None:
    """The interface the kernel would send `address` through (`ip route get`)."""
    routes = _ip_json("route", "get", address)
    return str(routes[0].get("dev")) if routes and routes[0].get("dev") else None


def device_kind(device: str) -> str | None:
    """The link type of an interface ('veth', 'loopback' has none, …) (`ip -d link show`)."""
    links = _ip_json("-d", "link", "show", "dev", device)
    if not links:
        return None
    info = links[0].get("linkinfo") or {}
    return str(info.get("info_kind")) if info.get("info_kind") else None


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """Which addresses are on this machine: loopback, or private addresses routed through a veth.

    A veth pair is a purely local device: its other end is always in a network namespace of this
    machine (the cluster harness routes the pod range through one). The lookups are injectable for tests.
    """

    route_device: Callable[[str], str | None] = route_device
    device_kind: Callable[[str], str | None] = device_kind

    def check(self, host: str) -> None:
        """Raise UnsafeTargetError unless every address `host` resolves to is on this machine."""
        for address in _resolve(host):
            ip = ipaddress.ip_address(address)
            if ip.is_loopback:
                continue
            if not ip.is_private:
                raise UnsafeTargetError(
                    f"refusing to send to {host} ({address}): only loopback and the local cluster's pod "
                    "network are allowed"
                )
            device = self.route_device(address)
            kind = self.device_kind(device) if device else None
            if kind != "veth":
                raise UnsafeTargetError(
                    f"refusing to send to {host} ({address}): it is routed through "
                    f"{device or 'no interface'} ({kind or 'not a veth'}); only loopback and the local "
                    "cluster's pod network (routed into its network namespace through a veth pair) "
                    "are allowed"
                )


def _resolve(host: str) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as error:
        raise UnsafeTargetError(f"cannot resolve {host}: {error}") from None
    return sorted({str(info[4][0]) for info in infos})


def parse_target(url: str) -> str:
    """A base URL `http://host:port` (path dropped); only plain HTTP is spoken."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"target {url!r}: expected http://HOST:PORT")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{parts.port or 80}"


def target_host(base_url: str) -> str:
    return urlsplit(base_url).hostname or ""


class TargetPool:
    """The base URLs requests go to, round robin; a Service's ready endpoints can replace them."""

    def __init__(self, base_urls: Sequence[str], policy: TargetPolicy) -> None:
        self._policy = policy
        self._checked: set[str] = set()
        self._urls: list[str] = []
        self._next = 0
        self.replace(base_urls)

    def replace(self, base_urls: Sequence[str]) -> None:
        """Use these targets from now on; each new host is checked before it is used."""
        for url in base_urls:
            host = target_host(url)
            if host not in self._checked:
                self._policy.check(host)
                self._checked.add(host)
        self._urls = list(base_urls)

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self._urls)

    def pick(self) -> str | None:
        if not self._urls:
            return None
        self._next = (self._next + 1) % len(self._urls)
        return self._urls[self._next]


def ready_endpoints(slices: Iterable[dict[str, Any]], port_name: str | None = None) -> list[str]:
    """Base URLs of the ready endpoints in a Service's EndpointSlices (`port_name`: that port, else
    the one named 'http', else the first)."""
    urls: list[str] = []
    for endpoint_slice in slices:
        ports = endpoint_slice.get("ports") or []
        port = _choose_port(ports, port_name)
        if port is None:
            continue
        for endpoint in endpoint_slice.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is not True:
                continue
            for address in (endpoint.get("addresses") or [])[:1]:
                host = f"[{address}]" if ":" in address else address
                urls.append(f"http://{host}:{port}")
    return sorted(set(urls))


def _choose_port(ports: Sequence[dict[str, Any]], port_name: str | None) -> int | None:
    if port_name is not None:
        chosen = [p for p in ports if p.get("name") == port_name or str(p.get("port")) == port_name]
    else:
        chosen = [p for p in ports if p.get("name") == "http"] or list(ports[:1])
    return int(chosen[0]["port"]) if chosen and chosen[0].get("port") else None


# ---------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    send_at_seconds: float
    """Offset from the start of the run."""
    prompt_tokens: int
    output_tokens: int
    prefix_blocks: tuple[int, ...] | None = None
    tenant: str | None = None
    """Sent as `X-Goodput-Tenant` (a gateway's fairness); None: no header."""


def plan_requests(
    workload: Workload,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    max_output_tokens: int | None = None,
) -> list[PlannedRequest]:
    """The requests to send: the first `max_requests` arriving within `duration_seconds`."""
    arrivals = workload.arrival_seconds
    count = min(int(np.searchsorted(arrivals, duration_seconds, side="left")), max(0, max_requests))
    blocks = workload.prefix_blocks
    plan = []
    for index in range(count):
        output = int(workload.output_tokens[index])
        if max_output_tokens is not None:
            output = min(output, max_output_tokens)
        plan.append(
            PlannedRequest(
                index=index,
                send_at_seconds=float(arrivals[index]),
                prompt_tokens=int(workload.input_tokens[index]),
                output_tokens=max(1, output),
                prefix_blocks=blocks[index] if blocks is not None else None,
            )
        )
    return plan


def render_prompt(request: PlannedRequest, run_id: str) -> str:
    """A prompt of exactly `prompt_tokens` words: shared prefix blocks first, then filler unique to the
    request (its first word), so only the trace's shared prefixes are shared."""
    parts: list[str] = []
    remaining = request.prompt_tokens
    for block in request.prefix_blocks or ():
        if remaining <= 0:
            break
        words = min(PREFIX_WORDS_PER_TRACE_BLOCK, remaining)
        parts.append(f"h{block} " * words)
        remaining -= words
    if remaining > 0:
        parts.append(f"r{run_id}-{request.index} ")
        parts.append("w " * (remaining - 1))
    return "".join(parts)


# ---------------------------------------------------------------------------------------- results
@dataclass(slots=True)
class RequestResult:
    index: int
    target: str
    scheduled_at: float
    """Loop time the request should have been sent."""
    sent_at: float
    outcome: str = "ok"
    status: int | None = None
    ttft_seconds: float | None = None
    e2e_seconds: float | None = None
    completion_tokens: int = 0
    chunks: int = 0
    finish_reason: str | None = None
    detail: str = ""
    group: str | None = None
    """The group that served it, as the gateway's `X-Goodput-Group` said; None without a gateway."""

    @property
    def send_lag_seconds(self) -> float:
        return self.sent_at - self.scheduled_at


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        data = np.asarray(values, dtype=np.float64)
        if data.size == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(int(data.size), float(data.mean()), float(p50), float(p90), float(p99), float(data.max()))

    def as_dict(self) -> dict[str, float | int | None]:
        def clean(value: float) -> float | None:
            return None if math.isnan(value) else round(value, 6)

        return {
            "count": self.count,
            "mean": clean(self.mean),
            "p50": clean(self.p50),
            "p90": clean(self.p90),
            "p99": clean(self.p99),
            "max": clean(self.max),
        }


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What a run offered, what happened to it, and the latencies the client saw."""

    planned: int
    sent: int
    not_sent_concurrency_limit: int
    not_sent_deadline: int
    not_sent_no_target: int
    outcomes: dict[str, int]
    wall_seconds: float
    send_span_seconds: float
    achieved_send_rate_per_second: float
    completed_rate_per_second: float
    completion_tokens: int
    ttft_seconds: Distribution
    itl_seconds: Distribution
    tpot_seconds: Distribution
    e2e_seconds: Distribution
    send_lag_seconds: Distribution
    by_target: dict[str, int]
    cpu_seconds: float
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "sent": self.sent,
            "not_sent": {
                "concurrency_limit": self.not_sent_concurrency_limit,
                "deadline": self.not_sent_deadline,
                "no_target": self.not_sent_no_target,
            },
            "outcomes": self.outcomes,
            "wall_seconds": round(self.wall_seconds, 3),
            "send_span_seconds": round(self.send_span_seconds, 3),
            "achieved_send_rate_per_second": round(self.achieved_send_rate_per_second, 2),
            "completed_rate_per_second": round(self.completed_rate_per_second, 2),
            "completion_tokens": self.completion_tokens,
            "ttft_seconds": self.ttft_seconds.as_dict(),
            "itl_seconds": self.itl_seconds.as_dict(),
            "tpot_seconds": self.tpot_seconds.as_dict(),
            "e2e_seconds": self.e2e_seconds.as_dict(),
            "send_lag_seconds": self.send_lag_seconds.as_dict(),
            "by_target": self.by_target,
            "cpu_seconds": round(self.cpu_seconds, 3),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        def ms(distribution: Distribution, name: str) -> str:
            if distribution.count == 0:
                return f"{name}: -"
            return (
                f"{name} ms: p50 {distribution.p50 * 1e3:.1f}  p90 {distribution.p90 * 1e3:.1f}  "
                f"p99 {distribution.p99 * 1e3:.1f}  max {distribution.max * 1e3:.1f}"
            )

        outcome_text = ", ".join(f"{name} {count}" for name, count in self.outcomes.items() if count)
        return "\n".join(
            [
                f"sent {self.sent}/{self.planned} in {self.send_span_seconds:.1f} s "
                f"({self.achieved_send_rate_per_second:.1f}/s); outcomes: {outcome_text or 'none'}",
                f"not sent: concurrency limit {self.not_sent_concurrency_limit}, "
                f"deadline {self.not_sent_deadline}, no ready target {self.not_sent_no_target}",
                ms(self.ttft_seconds, "TTFT"),
                ms(self.itl_seconds, "ITL (chunk gaps)"),
                ms(self.tpot_seconds, "TPOT"),
                ms(self.e2e_seconds, "E2E"),
                ms(self.send_lag_seconds, "send lag"),
                f"client CPU {self.cpu_seconds:.2f} s over {self.wall_seconds:.1f} s wall",
            ]
        )


def build_report(
    results: Sequence[RequestResult],
    itl_gaps: Sequence[float],
    *,
    planned: int,
    not_sent: Counter[str],
    wall_seconds: float,
    cpu_seconds: float,
    notes: Sequence[str] = (),
) -> LoadReport:
    """Fold per-request results into the run's report (pure)."""
    outcomes = Counter(result.outcome for result in results)
    sent_times = [result.sent_at for result in results]
    span = (max(sent_times) - min(sent_times)) if len(sent_times) > 1 else 0.0
    ok = [result for result in results if result.outcome == "ok"]
    ends = [result.sent_at + result.e2e_seconds for result in ok if result.e2e_seconds is not None]
    completed_span = (max(ends) - min(sent_times)) if ends and sent_times else 0.0
    tpot = [
        (result.e2e_seconds - result.ttft_seconds) / (result.completion_tokens - 1)
        for result in ok
        if result.e2e_seconds is not None and result.ttft_seconds is not None and result.completion_tokens > 1
    ]
    return LoadReport(
        planned=planned,
        sent=len(results),
        not_sent_concurrency_limit=not_sent["concurrency_limit"],
        not_sent_deadline=not_sent["deadline"],
        not_sent_no_target=not_sent["no_target"],
        outcomes={name: outcomes.get(name, 0) for name in OUTCOMES},
        wall_seconds=wall_seconds,
        send_span_seconds=span,
        achieved_send_rate_per_second=(len(results) - 1) / span if span > 0 else 0.0,
        completed_rate_per_second=len(ok) / completed_span if completed_span > 0 else 0.0,
        completion_tokens=sum(result.completion_tokens for result in results),
        ttft_seconds=Distribution.of([r.ttft_seconds for r in results if r.ttft_seconds is not None]),
        itl_seconds=Distribution.of(itl_gaps),
        tpot_seconds=Distribution.of(tpot),
        e2e_seconds=Distribution.of([r.e2e_seconds for r in ok if r.e2e_seconds is not None]),
        send_lag_seconds=Distribution.of([result.send_lag_seconds for result in results]),
        by_target=dict(sorted(Counter(result.target for result in results).items())),
        cpu_seconds=cpu_seconds,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------- the run
@dataclass(frozen=True, slots=True)
class LoadSettings:
    endpoint: str = "completions"
    """'completions' (/v1/completions) or 'chat' (/v1/chat/completions)."""
    model: str | None = None
    """The model field of each request; None leaves it out (the server's only model)."""
    duration_seconds: float = DEFAULT_DURATION_SECONDS
    concurrency_limit: int = DEFAULT_CONCURRENCY_LIMIT
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    run_id: str = "0"
    refresh_targets: Callable[[], Awaitable[Sequence[str]]] | None = field(default=None, compare=False)
    """An async callable returning fresh base URLs (a Service's ready endpoints), polled every
    `refresh_interval_seconds` while sending; None: the targets are fixed."""
    refresh_interval_seconds: float = 2.0


class LoadGenerator:
    """Sends a plan of requests open loop to a pool of targets and collects what the client saw."""

    def __init__(self, pool: TargetPool, settings: LoadSettings) -> None:
        self._pool = pool
        self._settings = settings
        self._results: list[RequestResult] = []
        self._itl_gaps = array("d")
        self._not_sent: Counter[str] = Counter()
        self._in_flight = 0
        path = "/v1/chat/completions" if settings.endpoint == "chat" else "/v1/completions"
        self._path = path

    @property
    def results(self) -> tuple[RequestResult, ...]:
        """What the client saw of each request sent so far, in completion order."""
        return tuple(self._results)

    async def run(self, plan: Sequence[PlannedRequest], *, notes: Sequence[str] = ()) -> LoadReport:
        settings = self._settings
        loop = asyncio.get_running_loop()
        started_wall = time.monotonic()
        started_cpu = time.process_time()
        connector = aiohttp.TCPConnector(
            limit=settings.concurrency_limit, limit_per_host=0, ttl_dns_cache=300
        )
        timeout = aiohttp.ClientTimeout(total=settings.request_timeout_seconds, sock_connect=5.0)
        tasks: set[asyncio.Task[None]] = set()
        refresher: asyncio.Task[None] | None = None
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            if settings.refresh_targets is not None:
                refresher = asyncio.create_task(self._refresh_targets())
            start = loop.time() + SEND_LEAD_SECONDS
            send_deadline = start + settings.duration_seconds
            try:
                for position, request in enumerate(plan):
                    scheduled = start + request.send_at_seconds
                    if scheduled > send_deadline:
                        self._not_sent["deadline"] += len(plan) - position
                        break
                    delay = scheduled - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if self._in_flight >= settings.concurrency_limit:
                        self._not_sent["concurrency_limit"] += 1
                        continue
                    target = self._pool.pick()
                    if target is None:
                        self._not_sent["no_target"] += 1
                        continue
                    self._in_flight += 1
                    task = asyncio.create_task(self._send(session, target, request, scheduled))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                if refresher is not None:
                    refresher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await refresher
                if tasks:  # each request is bounded by its own timeout; this bound is a backstop
                    await asyncio.wait(tasks, timeout=settings.request_timeout_seconds + 5.0)
                stragglers = list(tasks)
                for task in stragglers:
                    task.cancel()
                await asyncio.gather(*stragglers, return_exceptions=True)
        return build_report(
            self._results,
            self._itl_gaps,
            planned=len(plan),
            not_sent=self._not_sent,
            wall_seconds=time.monotonic() - started_wall,
            cpu_seconds=time.process_time() - started_cpu,
            notes=notes,
        )

    async def _refresh_targets(self) -> None:
        """Poll the target source while sending (the run cancels this task when sending ends)."""
        refresh = self._settings.refresh_targets
        if refresh is None:
            return
        while True:
            await asyncio.sleep(self._settings.refresh_interval_seconds)
            try:
                self._pool.replace(await refresh())
            except UnsafeTargetError:
                raise
            except Exception as error:  # a failed refresh keeps the last known endpoints
                log.warning("refreshing the targets failed: %r", error)

    def _body(self, request: PlannedRequest) -> dict[str, Any]:
        prompt = render_prompt(request, self._settings.run_id)
        body: dict[str, Any] = {
            "max_tokens": request.output_tokens,
            "min_tokens": request.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self._settings.model is not None:
            body["model"] = self._settings.model
        if self._settings.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    async def _read_stream(
        self, response: aiohttp.ClientResponse, result: RequestResult, sent: float
    ) -> bool:
        """Follow the server-sent events into `result` (first token, chunk gaps, usage, finish
        reason, an in-stream error); True when the stream ended with `[DONE]`."""
        loop = asyncio.get_running_loop()
        last: float | None = None
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                return True
            event = json.loads(payload)
            if "error" in event:
                result.outcome = "error"
                result.detail = str(event["error"])[:200]
            usage = event.get("usage")
            if usage:
                result.completion_tokens = int(usage.get("completion_tokens") or 0)
            choice = (event.get("choices") or (None,))[0]
            if choice is None:
                continue
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content")
            if text:
                now = loop.time()
                if last is None:
                    result.ttft_seconds = now - sent
                else:
                    self._itl_gaps.append(now - last)
                last = now
                result.chunks += 1
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
        return False

    async def _send(
        self, session: aiohttp.ClientSession, target: str, request: PlannedRequest, scheduled: float
    ) -> None:
        loop = asyncio.get_running_loop()
        body = self._body(request)
        sent = loop.time()
        result = RequestResult(index=request.index, target=target, scheduled_at=scheduled, sent_at=sent)
        try:
            headers = {TENANT_HEADER: request.tenant} if request.tenant is not None else None
            async with session.post(target + self._path, json=body, headers=headers) as response:
                result.status = response.status
                result.group = response.headers.get(GROUP_HEADER)
                if response.status != 200:
                    result.outcome = "rejected" if response.status == 429 else "http_error"
                    result.detail = (await response.text())[:200]
                    return
                done = await self._read_stream(response, result, sent)
            result.e2e_seconds = loop.time() - sent
            if result.outcome == "ok":
                if result.finish_reason == "abort":
                    result.outcome = "aborted"
                elif not done:
                    result.outcome = "cut"
        except TimeoutError:
            result.outcome = "timeout"
        except asyncio.CancelledError:
            result.outcome = "timeout"  # outlived the run's own deadline
            raise
        except aiohttp.ClientConnectorError as error:
            result.outcome = "connect_error"
            result.detail = str(error)[:200]
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
            result.outcome = "cut"
            result.detail = repr(error)[:200]
        except (aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError) as error:
            result.outcome = "error"
            result.detail = repr(error)[:200]
        finally:
            self._in_flight -= 1
            self._results.append(result)
