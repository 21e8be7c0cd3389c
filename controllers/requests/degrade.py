"""The degrade ladder: lesser contracts a class has agreed to, tried in its order (§37).

Under overload, cutting context or swapping the model silently is a quality incident nobody sees.
Here a class lists the rungs it accepts (`SloClass.degrade`), and the gateway walks them in that
order when admission would defer or refuse a request, or while new groups warm (the cold-start gap,
§29):

- **CapOutput**: the same model with at most `capOutputTokens` output tokens;
- **DropOptionalContext**: the same model without the chat messages the client marked optional
  (`"goodput_optional": true` on the message); any other message, citations, ACL or safety
  evidence included, is never dropped;
- **Fallback**: the approved ModelGroup `fallbackModelGroup`, only when it exists, is of the same
  model family (label `goodput.dev/model-family`) and has a Ready group;
- **AsyncBatch**: accepted now (202, a result URL), answered when capacity frees;
- **Reject**: 429.

CapOutput and DropOptionalContext accumulate (a request may be capped and trimmed); the others end
the walk. A rung is taken only when it is listed and helps: a cap that is no lower than the request's
own budget, or a request with no optional message, is passed over. Every response served on a rung
names it (`X-Goodput-Degraded`), and nothing the class did not list is ever done.

Nothing here does I/O; the gateway passes what it sees and a check that re-runs admission.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from goodput.api.reasons import Reason
from goodput.api.slopolicy import DegradeLadder, SloPolicySpec

OPTIONAL_MESSAGE_FIELD = "goodput_optional"
"""A chat message carrying `"goodput_optional": true` may be left out under DropOptionalContext."""
MODEL_FAMILY_LABEL = "goodput.dev/model-family"
"""Two ModelGroups carrying the same value serve the same model family: one may be the other's
fallback."""


class Rung(StrEnum):
    CAP_OUTPUT = "CapOutput"
    DROP_OPTIONAL_CONTEXT = "DropOptionalContext"
    FALLBACK = "Fallback"
    ASYNC_BATCH = "AsyncBatch"
    REJECT = "Reject"


TERMINAL_RUNGS = frozenset({Rung.FALLBACK, Rung.ASYNC_BATCH, Rung.REJECT})


@dataclass(frozen=True, slots=True)
class Ladder:
    """A class's ladder as the request path walks it."""

    rungs: tuple[Rung, ...]
    cap_output_tokens: int | None = None
    fallback_model_group: str | None = None

    @classmethod
    def of(cls, ladder: DegradeLadder) -> Ladder:
        return cls(
            tuple(Rung(rung) for rung in ladder.rungs), ladder.cap_output_tokens, ladder.fallback_model_group
        )

    @property
    def caps_output(self) -> bool:
        """Whether the class accepts a capped answer: then a child that only fits its session's budget
        with a shorter output gets that output instead of a refusal."""
        return Rung.CAP_OUTPUT in self.rungs


@dataclass(frozen=True, slots=True)
class Attempt:
    """A request as one step of the walk would send it."""

    prompt_tokens: int
    output_tokens: int
    dropped_messages: tuple[int, ...] = ()  # indexes into the request's `messages`


@dataclass(frozen=True, slots=True)
class LadderView:
    """What the gateway sees when it walks: the request, and which terminal rungs it can serve now.

    optional_message_tokens: per optional message (index into `messages`), its prompt tokens.
    fallback_ready: the fallback ModelGroup is valid (exists, same family) and has a Ready group.
    async_batch_available: the gateway can hold the request and answer it at a result URL.
    """

    request: Attempt
    optional_message_tokens: Mapping[int, int]
    fallback_ready: bool
    async_batch_available: bool


@dataclass(frozen=True, slots=True)
class LadderStep:
    """Where the walk ended: the rungs applied, in order, and the request to serve (for Fallback and
    AsyncBatch the request unreduced; for Reject nothing is served)."""

    rungs: tuple[Rung, ...]
    attempt: Attempt

    @property
    def terminal(self) -> Rung | None:
        last = self.rungs[-1] if self.rungs else None
        return last if last in TERMINAL_RUNGS else None

    @property
    def header(self) -> str:
        """`X-Goodput-Degraded`: the rungs applied, comma-separated."""
        return ",".join(rung.value for rung in self.rungs)


def walk(ladder: Ladder, view: LadderView, admits: Callable[[Attempt], bool]) -> LadderStep | None:
    """The first point on the class's ladder at which the request can be served; None when no listed
    rung helps (the class's `overloadAction` answers then, as without a ladder).

    `admits` says whether admission would admit an attempt now (it re-runs the gates and the session
    budget on the reduced request); it is asked only of reductions the class allows.
    """
    attempt = view.request
    applied: list[Rung] = []
    for rung in ladder.rungs:
        if rung is Rung.CAP_OUTPUT:
            cap = ladder.cap_output_tokens
            if cap is None or cap >= attempt.output_tokens:
                continue
            attempt = replace(attempt, output_tokens=cap)
        elif rung is Rung.DROP_OPTIONAL_CONTEXT:
            if not view.optional_message_tokens:
                continue
            saved = sum(view.optional_message_tokens.values())
            attempt = replace(
                attempt,
                prompt_tokens=max(1, attempt.prompt_tokens - saved),
                dropped_messages=tuple(sorted(view.optional_message_tokens)),
            )
        elif rung is Rung.FALLBACK:
            if view.fallback_ready:
                return LadderStep((*applied, rung), view.request)
            continue
        elif rung is Rung.ASYNC_BATCH:
            if view.async_batch_available:
                return LadderStep((*applied, rung), view.request)
            continue
        else:
            return LadderStep((*applied, rung), view.request)
        applied.append(rung)
        if admits(attempt):
            return LadderStep(tuple(applied), attempt)
    return None


def optional_messages(body: Mapping[str, Any]) -> tuple[int, ...]:
    """Indexes of the chat messages the client marked optional (`"goodput_optional": true`, the JSON
    boolean only: a string "true" is not a mark)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ()
    return tuple(
        index
        for index, message in enumerate(messages)
        if isinstance(message, dict) and message.get(OPTIONAL_MESSAGE_FIELD) is True
    )


def without_marks(body: Mapping[str, Any], dropped: Sequence[int] = ()) -> dict[str, Any]:
    """The body the engine gets: the dropped messages left out, and the optional mark taken off every
    other message (the engine does not know the field)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return dict(body)
    skip = set(dropped)
    kept = [
        {k: v for k, v in message.items() if k != OPTIONAL_MESSAGE_FIELD}
        if isinstance(message, dict)
        else message
        for index, message in enumerate(messages)
        if index not in skip
    ]
    return {**body, "messages": kept}


class FallbackProblem(StrEnum):
    """Why a class's fallback ModelGroup is not served: the reason of the SLOPolicy's condition."""

    MISSING = Reason.FALLBACK_MODEL_GROUP_NOT_FOUND
    NO_FAMILY = Reason.FALLBACK_FAMILY_UNKNOWN
    OTHER_FAMILY = Reason.FALLBACK_OTHER_FAMILY


@dataclass(frozen=True, slots=True)
class FallbackFinding:
    class_name: str
    fallback: str
    problem: FallbackProblem
    message: str


def check_fallback(
    class_name: str, fallback: str, primary_family: str | None, families: Mapping[str, str | None]
) -> FallbackFinding | None:
    """Whether `fallback` may serve `class_name` for a ModelGroup of `primary_family`; `families`: each
    ModelGroup of the namespace by name, with its family label (None when it has none). None: valid."""
    if fallback not in families:
        return FallbackFinding(
            class_name,
            fallback,
            FallbackProblem.MISSING,
            f"class {class_name!r}: fallback ModelGroup {fallback!r} does not exist; the Fallback rung is "
            "not used",
        )
    family = families[fallback]
    if primary_family is None or family is None:
        return FallbackFinding(
            class_name,
            fallback,
            FallbackProblem.NO_FAMILY,
            f"class {class_name!r}: fallback ModelGroup {fallback!r} and the ModelGroup it stands in for "
            f"must both carry the label {MODEL_FAMILY_LABEL}; the Fallback rung is not used",
        )
    if family != primary_family:
        return FallbackFinding(
            class_name,
            fallback,
            FallbackProblem.OTHER_FAMILY,
            f"class {class_name!r}: fallback ModelGroup {fallback!r} serves family {family!r}, not "
            f"{primary_family!r}; the Fallback rung is not used",
        )
    return None


class ResultState(StrEnum):
    """Where an AsyncBatch answer stands, as its result URL answers: 202, 200, 410, 404."""

    PENDING = "pending"
    READY = "ready"
    DELIVERED = "delivered"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class HeldResult:
    accepted_at: float
    answer: Any = None  # the answer once served; None while pending
    ready_at: float | None = None
    delivered: bool = False


class ResultBook:
    """The AsyncBatch answers one request path holds for their clients, bounded in number and time.

    An answer is handed out once: asked again after delivery, its URL says so (410) rather than
    serving it twice or pretending it never existed; the delivered mark itself is forgotten after
    `ttl_seconds`, and so is an answer nobody came for. Past `max_results` the oldest entry goes.
    """

    def __init__(self, *, max_results: int = 10_000, ttl_seconds: float = 600.0) -> None:
        self.max_results = max_results
        self.ttl_seconds = ttl_seconds
        self.results: dict[str, HeldResult] = {}

    def accept(self, key: str, now: float) -> None:
        self._expire(now)
        self.results[key] = HeldResult(now)
        while len(self.results) > self.max_results:
            self.results.pop(next(iter(self.results)))

    def complete(self, key: str, answer: Any, now: float) -> None:
        held = self.results.get(key)
        if held is not None:
            held.answer, held.ready_at = answer, now

    def claim(self, key: str, now: float) -> tuple[ResultState, Any]:
        """The state of `key`, and the answer when this claim delivers it (the first after it is ready)."""
        self._expire(now)
        held = self.results.get(key)
        if held is None:
            return ResultState.UNKNOWN, None
        if held.delivered:
            return ResultState.DELIVERED, None
        if held.ready_at is None:
            return ResultState.PENDING, None
        held.delivered = True
        answer, held.answer = held.answer, None
        return ResultState.READY, answer

    def _expire(self, now: float) -> None:
        for key, held in list(self.results.items()):
            since = held.ready_at if held.ready_at is not None else held.accepted_at
            if now - since < self.ttl_seconds:
                break  # in the order accepted: the rest is younger, or goes at a later claim
            del self.results[key]


def fallback_findings(
    spec: SloPolicySpec, bound_model_groups: Iterable[str], families: Mapping[str, str | None]
) -> tuple[FallbackFinding, ...] | None:
    """Every fallback the policy's classes name, checked against each ModelGroup bound to the
    policy (`families`: the namespace's ModelGroups and their family labels); None when no class
    names one."""
    named = [
        (cls.name, cls.degrade.fallback_model_group)
        for cls in spec.classes
        if cls.degrade is not None and cls.degrade.fallback_model_group is not None
    ]
    if not named:
        return None
    findings = []
    for group in sorted(set(bound_model_groups)):
        for class_name, fallback in named:
            finding = check_fallback(class_name, fallback, families.get(group), families)
            if finding is not None:
                findings.append(replace(finding, message=f"ModelGroup {group}: {finding.message}"))
    return tuple(findings)
