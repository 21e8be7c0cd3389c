"""Read-your-writes for the pod index: the operator's own writes, until the watch shows them.

The controller decides from an index fed by a watch, which lags its own writes by a moment. Without
care, a tick right after creating a group would not see it and create another, or would see a group
it just marked ready still unmarked and mark it again. So every write is also recorded as an
expectation (the pod as it should now look), overlaid on the index until the index agrees or the
expectation expires (controller-runtime's "expectations", as a pure function).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from goodput.controllers.groups.observation import ConditionView, PodView

# The pod should exist (it was created); any other name is a PodView field that was written.
EXISTS = "exists"
DEFAULT_TTL = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Expectation:
    """How a pod should look after our writes. view None: the pod was deleted."""

    view: PodView | None
    fields: frozenset[str]
    expires_at: datetime


def overlay(
    observed: Iterable[PodView], expectations: Mapping[str, Expectation], now: datetime
) -> tuple[tuple[PodView, ...], dict[str, Expectation]]:
    """The pods as the controller should see them, and the expectations still outstanding."""
    by_name = {pod.name: pod for pod in observed}
    outstanding: dict[str, Expectation] = {}
    for name, expectation in expectations.items():
        if expectation.expires_at <= now:
            continue
        pod = by_name.get(name)
        if expectation.view is None:
            if pod is not None and not pod.deleting:
                by_name[name] = replace(pod, deleting=True)
                outstanding[name] = expectation
            continue
        if pod is None:
            if EXISTS in expectation.fields:
                by_name[name] = expectation.view
                outstanding[name] = expectation
            continue
        pending = [f for f in expectation.fields - {EXISTS} if not _agrees(f, pod, expectation.view)]
        if pending:
            by_name[name] = replace(pod, **{f: getattr(expectation.view, f) for f in pending})
            outstanding[name] = replace(expectation, fields=frozenset(pending))
    return tuple(by_name.values()), outstanding


def expect(
    expectations: Mapping[str, Expectation],
    view: PodView,
    fields: Iterable[str],
    now: datetime,
    ttl: timedelta = DEFAULT_TTL,
) -> dict[str, Expectation]:
    """Record that pod `view.name` now looks like `view` in `fields` (merged with earlier writes)."""
    updated = dict(expectations)
    previous = updated.get(view.name)
    merged = frozenset(fields) | (
        previous.fields if previous is not None and previous.view is not None else set()
    )
    updated[view.name] = Expectation(view, merged, now + ttl)
    return updated


def expect_deleted(
    expectations: Mapping[str, Expectation], name: str, now: datetime, ttl: timedelta = DEFAULT_TTL
) -> dict[str, Expectation]:
    updated = dict(expectations)
    updated[name] = Expectation(None, frozenset(), now + ttl)
    return updated


def _agrees(field_name: str, observed: PodView, expected: PodView) -> bool:
    seen, wanted = getattr(observed, field_name), getattr(expected, field_name)
    if isinstance(wanted, ConditionView):
        # Our write fixed the status; the server keeps its own rendering of time and text.
        return isinstance(seen, ConditionView) and seen.status == wanted.status
    return bool(seen == wanted)
