"""HTTP calls to a group's leader: the warm-up completion and the read of its vLLM /metrics.

Both go to the leader pod's IP and port directly (the production path, not through a Service):
the warm-up proves the whole group produces tokens at its shape; the metrics tell a draining group
when its last request has finished, and tell scale-in which ready group holds the least.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from goodput.api import vllm_names
from goodput.controllers.groups.drain import LeaderReading, LeaderSample, ProbeFailure
from goodput.controllers.groups.model import WarmupOutcome, WarmupRequest

PROBE_TIMEOUT_SECONDS = 3.0
# The samples read (vLLM's names); every series is summed over the engines (DP ranks).
_RUNNING = vllm_names.NUM_REQUESTS_RUNNING
_WAITING = vllm_names.NUM_REQUESTS_WAITING
_FINISHED = vllm_names.total(vllm_names.REQUEST_SUCCESS)
_KV_USAGE = vllm_names.KV_CACHE_USAGE_PERC
_PREFIX_QUERIES = vllm_names.total(vllm_names.PREFIX_CACHE_QUERIES)
_PREFIX_HITS = vllm_names.total(vllm_names.PREFIX_CACHE_HITS)


def generated_tokens(answer: object) -> int:
    """Tokens an OpenAI-style completion answer reports (usage, else the returned text is non-empty)."""
    if not isinstance(answer, dict):
        return 0
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("text"):
        return 1
    return 0


def parse_leader_metrics(exposition: str, at: datetime) -> LeaderSample | None:
    """A leader's load from its /metrics page; None when it has no request gauge (not vLLM, or
    started with --disable-log-stats)."""
    sums: defaultdict[str, float] = defaultdict(float)
    aborted = 0.0
    seen: set[str] = set()
    try:
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                if sample.name == _FINISHED and sample.labels.get("finished_reason") == "abort":
                    aborted += sample.value
                elif sample.name == _KV_USAGE:
                    sums[_KV_USAGE] = max(sums[_KV_USAGE], sample.value)
                else:
                    sums[sample.name] += sample.value
                seen.add(sample.name)
    except ValueError:
        return None
    if _RUNNING not in seen and _WAITING not in seen:
        return None
    queries = sums[_PREFIX_QUERIES]
    return LeaderSample(
        at=at,
        running=round(sums[_RUNNING]),
        waiting=round(sums[_WAITING]),
        finished_total=round(sums[_FINISHED]),
        aborted_total=round(aborted),
        kv_cache_usage=sums[_KV_USAGE] if _KV_USAGE in seen else None,
        prefix_cache_hit_ratio=sums[_PREFIX_HITS] / queries if queries > 0 else None,
    )


async def warm_up(session: aiohttp.ClientSession, request: WarmupRequest) -> WarmupOutcome:
    """Send the warm-up completion; it passes only if the leader answered with generated tokens."""
    try:
        timeout = aiohttp.ClientTimeout(total=request.timeout_seconds)
        async with session.post(request.url, json=request.body(), timeout=timeout) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                return WarmupOutcome(False, datetime.now(UTC), f"HTTP {response.status}: {text}")
            tokens = generated_tokens(await response.json(content_type=None))
    except (TimeoutError, aiohttp.ClientError, ValueError) as error:
        return WarmupOutcome(False, datetime.now(UTC), f"{type(error).__name__}: {error}".rstrip(": "))
    if tokens == 0:
        return WarmupOutcome(False, datetime.now(UTC), "the completion returned no tokens")
    return WarmupOutcome(True, datetime.now(UTC), f"{tokens} token(s)")


async def read_leader(session: aiohttp.ClientSession, url: str) -> LeaderReading:
    """The leader's load now, or why it could not be read."""
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
        async with session.get(url, timeout=timeout) as response:
            if response.status != 200:
                return ProbeFailure(datetime.now(UTC), f"HTTP {response.status}")
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError) as error:
        return ProbeFailure(datetime.now(UTC), f"{type(error).__name__}: {error}".rstrip(": "))
    at = datetime.now(UTC)
    sample = parse_leader_metrics(text, at)
    return sample if sample is not None else ProbeFailure(at, "no vLLM request metrics on the page")
