"""A hung engine: requests running and no token moving, for longer than a bound.

vLLM's `/health` answers while a step is stuck inside a collective or a kernel, so the agent
watches the engine's own counters instead (see the vLLM metrics contract): `vllm:num_requests_running`
(gauge), `vllm:generation_tokens_total` and `vllm:prompt_tokens_total` (counters). Progress on
either counter, or an empty running set, restarts the clock; a counter that goes down (the engine
restarted) counts as progress.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from goodput.api import vllm_names
from goodput.api.reasons import Reason

# The samples watched (vLLM's names).
_RUNNING = vllm_names.NUM_REQUESTS_RUNNING
_GENERATION_TOKENS = vllm_names.total(vllm_names.GENERATION_TOKENS)
_PROMPT_TOKENS = vllm_names.total(vllm_names.PROMPT_TOKENS)
HANG_BOUND_SECONDS = 120.0
"""Default: longer than any single step (a long prefill chunk, a slow first decode after load)."""


@dataclass(frozen=True, slots=True)
class EngineSample:
    at_seconds: float
    """Monotonic time the sample was taken."""
    running: float
    generation_tokens: float
    prompt_tokens: float


@dataclass(frozen=True, slots=True)
class EngineVerdict:
    hung: bool
    reason: str
    message: str


def parse_sample(text: str, at_seconds: float) -> EngineSample:
    """The three series from a /metrics exposition, summed over engines and models.

    Raises ValueError naming the series that is missing (an engine that exports none of them is not
    evidence of progress)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (_RUNNING, _GENERATION_TOKENS, _PROMPT_TOKENS):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    missing = [name for name in (_RUNNING, _GENERATION_TOKENS, _PROMPT_TOKENS) if name not in totals]
    if missing:
        raise ValueError(f"the engine's /metrics lacks {', '.join(missing)}")
    return EngineSample(at_seconds, totals[_RUNNING], totals[_GENERATION_TOKENS], totals[_PROMPT_TOKENS])


def stalled_since(samples: Sequence[EngineSample]) -> float | None:
    """When the current stall began: the first sample of the trailing run of samples in which
    requests were running and neither counter moved; None if the latest sample shows progress or
    an idle engine."""
    start: float | None = None
    for previous, current in itertools.pairwise(samples):
        moved = (
            current.generation_tokens != previous.generation_tokens
            or current.prompt_tokens != previous.prompt_tokens
        )
        if current.running <= 0 or previous.running <= 0 or moved:
            start = None
        elif start is None:
            start = previous.at_seconds
    return start


def judge(samples: Sequence[EngineSample], bound_seconds: float = HANG_BOUND_SECONDS) -> EngineVerdict:
    if not samples:
        return EngineVerdict(
            False, Reason.ENGINE_METRICS_UNAVAILABLE, "no sample of the engine's metrics yet"
        )
    latest = samples[-1]
    since = stalled_since(samples)
    if since is not None and latest.at_seconds - since > bound_seconds:
        return EngineVerdict(
            True,
            Reason.ENGINE_HUNG,
            f"{latest.running:g} request(s) running and no prompt or generation token for "
            f"{latest.at_seconds - since:.0f}s (bound {bound_seconds:g}s; generation tokens stuck at "
            f"{latest.generation_tokens:g})",
        )
    return EngineVerdict(
        False,
        Reason.ENGINE_PROGRESSING,
        f"{latest.running:g} request(s) running, {latest.generation_tokens:g} tokens generated",
    )


def keep_window(
    samples: Iterable[EngineSample], now_seconds: float, bound_seconds: float
) -> list[EngineSample]:
    """The samples worth keeping: enough history to cover twice the bound (bounded memory)."""
    return [sample for sample in samples if now_seconds - sample.at_seconds <= 2 * bound_seconds]
