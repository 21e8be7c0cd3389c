"""The degrade ladder (goodput.controllers.requests.degrade)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from goodput.api.slopolicy import DegradeLadder, SessionBudget
from goodput.controllers.requests.degrade import (
    OPTIONAL_MESSAGE_FIELD,
    Attempt,
    FallbackProblem,
    Ladder,
    LadderView,
    ResultBook,
    ResultState,
    Rung,
    check_fallback,
    optional_messages,
    walk,
    without_marks,
)

REQUEST = Attempt(prompt_tokens=1000, output_tokens=800)


def view(optional: dict[int, int] | None = None, fallback: bool = False, batch: bool = False) -> LadderView:
    return LadderView(REQUEST, optional or {}, fallback, batch)


@dataclass(frozen=True)
class WalkCase:
    name: str
    ladder: Ladder
    view: LadderView
    admits_below_tokens: int  # admission admits an attempt of fewer prompt+output tokens than this
    expected: tuple[str, ...] | None
    expected_attempt: Attempt | None = None


CAP = Rung.CAP_OUTPUT
DROP = Rung.DROP_OPTIONAL_CONTEXT
WALK_CASES = [
    WalkCase(
        "cap is enough",
        Ladder((CAP, Rung.REJECT), cap_output_tokens=200),
        view(),
        1500,
        ("CapOutput",),
        Attempt(1000, 200),
    ),
    WalkCase(
        "cap then optional context",
        Ladder((CAP, DROP, Rung.REJECT), cap_output_tokens=200),
        view({2: 600}),
        1000,
        ("CapOutput", "DropOptionalContext"),
        Attempt(400, 200, (2,)),
    ),
    WalkCase(
        "nothing optional: skip to reject",
        Ladder((DROP, Rung.REJECT)),
        view(),
        1000,
        ("Reject",),
        REQUEST,
    ),
    WalkCase(
        "cap not below the request's own budget is passed over",
        Ladder((CAP, Rung.REJECT), cap_output_tokens=900),
        view(),
        10**6,
        ("Reject",),
        REQUEST,
    ),
    WalkCase(
        "fallback ready serves the request unreduced",
        Ladder((CAP, Rung.FALLBACK, Rung.REJECT), cap_output_tokens=100, fallback_model_group="small"),
        view(fallback=True),
        0,
        ("CapOutput", "Fallback"),
        REQUEST,
    ),
    WalkCase(
        "fallback not ready: on to async batch",
        Ladder((Rung.FALLBACK, Rung.ASYNC_BATCH), fallback_model_group="small"),
        view(fallback=False, batch=True),
        0,
        ("AsyncBatch",),
        REQUEST,
    ),
    WalkCase(
        "no listed rung helps: the overload action answers",
        Ladder((CAP, Rung.FALLBACK), cap_output_tokens=100, fallback_model_group="small"),
        view(),
        0,
        None,
    ),
]


@pytest.mark.parametrize("case", WALK_CASES, ids=lambda case: case.name)
def test_the_walk_stops_at_the_first_rung_that_serves(case: WalkCase) -> None:
    step = walk(
        case.ladder,
        case.view,
        lambda attempt: attempt.prompt_tokens + attempt.output_tokens < case.admits_below_tokens,
    )
    if case.expected is None:
        assert step is None
        return
    assert step is not None
    assert step.header == ",".join(case.expected)
    assert step.attempt == case.expected_attempt


rung_lists = st.lists(st.sampled_from(list(Rung)), unique=True, min_size=1, max_size=5)


@given(
    rung_lists,
    st.integers(1, 2000),
    st.dictionaries(st.integers(0, 10), st.integers(1, 500), max_size=4),
    st.booleans(),
    st.booleans(),
    st.integers(0, 5000),
)
def test_nothing_is_degraded_that_the_class_does_not_allow(  # noqa: PLR0917 (one draw per argument)
    rungs: list[Rung], cap: int, optional: dict[int, int], fallback: bool, batch: bool, threshold: int
) -> None:
    ladder = Ladder(tuple(rungs), cap_output_tokens=cap, fallback_model_group="small")
    step = walk(
        ladder, view(optional, fallback, batch), lambda a: a.prompt_tokens + a.output_tokens < threshold
    )
    if step is None:
        return
    assert set(step.rungs) <= set(rungs)
    assert [r for r in rungs if r in step.rungs] == list(step.rungs)  # in the class's order
    assert step.attempt.output_tokens <= REQUEST.output_tokens
    assert step.attempt.prompt_tokens <= REQUEST.prompt_tokens
    assert set(step.attempt.dropped_messages) <= set(optional)
    if Rung.CAP_OUTPUT not in step.rungs:
        assert step.attempt.output_tokens == REQUEST.output_tokens
    if Rung.DROP_OPTIONAL_CONTEXT not in step.rungs:
        assert step.attempt.dropped_messages == ()


def test_only_messages_marked_optional_are_dropped() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "cite sources"},
            {"role": "user", "content": "background", OPTIONAL_MESSAGE_FIELD: True},
            {"role": "user", "content": "ACL evidence", OPTIONAL_MESSAGE_FIELD: "true"},
            {"role": "user", "content": "question", OPTIONAL_MESSAGE_FIELD: False},
        ],
    }
    assert optional_messages(body) == (1,)
    sent = without_marks(body, (1,))
    assert [m["content"] for m in sent["messages"]] == ["cite sources", "ACL evidence", "question"]
    assert all(OPTIONAL_MESSAGE_FIELD not in m for m in sent["messages"])
    assert [m["content"] for m in without_marks(body)["messages"]] == [m["content"] for m in body["messages"]]


@dataclass(frozen=True)
class FallbackCase:
    name: str
    fallback: str
    primary_family: str | None
    expected: FallbackProblem | None


FALLBACK_CASES = [
    FallbackCase("same family", "llama-8b", "llama-3.1", None),
    FallbackCase("missing", "nope", "llama-3.1", FallbackProblem.MISSING),
    FallbackCase("other family", "qwen-7b", "llama-3.1", FallbackProblem.OTHER_FAMILY),
    FallbackCase("unlabelled fallback", "bare", "llama-3.1", FallbackProblem.NO_FAMILY),
    FallbackCase("unlabelled primary", "llama-8b", None, FallbackProblem.NO_FAMILY),
]


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=lambda case: case.name)
def test_a_fallback_must_exist_and_share_the_family(case: FallbackCase) -> None:
    families = {"llama-8b": "llama-3.1", "qwen-7b": "qwen-2.5", "bare": None}
    finding = check_fallback("chat", case.fallback, case.primary_family, families)
    if case.expected is None:
        assert finding is None
    else:
        assert finding is not None and finding.problem is case.expected
        assert case.fallback in finding.message


@dataclass(frozen=True)
class LadderSpecCase:
    name: str
    fields: dict[str, object]
    error: str | None


LADDER_SPEC_CASES = [
    LadderSpecCase("valid", {"rungs": ("CapOutput", "Reject"), "cap_output_tokens": 64}, None),
    LadderSpecCase("repeated rung", {"rungs": ("AsyncBatch", "AsyncBatch")}, "at most once"),
    LadderSpecCase("reject not last", {"rungs": ("Reject", "AsyncBatch")}, "last rung"),
    LadderSpecCase("fallback unnamed", {"rungs": ("Fallback",)}, "fallbackModelGroup"),
    LadderSpecCase("cap without a cap", {"rungs": ("CapOutput",)}, "capOutputTokens"),
    LadderSpecCase("unknown rung", {"rungs": ("Shrink",)}, "rungs"),
]


@pytest.mark.parametrize("case", LADDER_SPEC_CASES, ids=lambda case: case.name)
def test_the_ladder_spec_is_checked(case: LadderSpecCase) -> None:
    if case.error is None:
        DegradeLadder.model_validate(case.fields)
        return
    with pytest.raises(ValidationError, match=case.error):
        DegradeLadder.model_validate(case.fields)


@pytest.mark.parametrize("fields", [{}, {"tokens": 0}, {"branches": -1}, {"wall_clock_seconds": 0}], ids=str)
def test_a_session_budget_is_positive_and_not_empty(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SessionBudget.model_validate(fields)


def test_an_async_answer_is_handed_out_once() -> None:
    book = ResultBook(max_results=2, ttl_seconds=60.0)
    book.accept("r1", 0.0)
    assert book.claim("r1", 1.0) == (ResultState.PENDING, None)
    book.complete("r1", "answer", 2.0)
    assert book.claim("r1", 3.0) == (ResultState.READY, "answer")
    assert book.claim("r1", 4.0) == (ResultState.DELIVERED, None)
    assert book.claim("never", 4.0) == (ResultState.UNKNOWN, None)
    assert book.claim("r1", 62.0) == (ResultState.UNKNOWN, None)  # the delivered mark is forgotten


def test_the_answers_held_are_bounded() -> None:
    book = ResultBook(max_results=2, ttl_seconds=60.0)
    for index in range(3):
        book.accept(f"r{index}", float(index))
    assert len(book.results) == 2
    assert book.claim("r0", 3.0)[0] is ResultState.UNKNOWN
    assert book.claim("r2", 3.0)[0] is ResultState.PENDING
