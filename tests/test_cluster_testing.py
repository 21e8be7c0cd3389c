"""Bounded polling for tests against the cluster."""

from __future__ import annotations

import time

import pytest

from goodput.testbed.cluster.testing import wait_for


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", {"phase": "Running"}, {"phase": "ignored"}])
    assert wait_for(lambda: next(values), timeout_seconds=5, interval_seconds=0) == {"phase": "Running"}


def test_times_out_with_what_was_awaited_and_the_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(
        AssertionError, match=r"timed out after 0.3 s waiting for pod ready; last value: \[\]"
    ) as info:
        wait_for(lambda: [], timeout_seconds=0.3, interval_seconds=0.05,
                 describe="pod ready")  # fmt: skip
    assert time.monotonic() - started < 2.0
    assert "last value" in str(info.value)


def test_describe_is_only_called_on_timeout() -> None:
    calls: list[int] = []

    def describe() -> str:
        calls.append(1)
        return "status dump"

    assert wait_for(lambda: True, timeout_seconds=1, describe=describe) is True
    assert calls == []
    with pytest.raises(AssertionError, match="status dump"):
        wait_for(lambda: False, timeout_seconds=0.05, interval_seconds=0.01, describe=describe)
    assert calls == [1]


def test_predicate_errors_propagate() -> None:
    def broken() -> bool:
        raise RuntimeError("API down")

    with pytest.raises(RuntimeError, match="API down"):
        wait_for(broken, timeout_seconds=1)
