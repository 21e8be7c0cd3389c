"""The operator's capacity in use: `status.capacity` and every decision record say where it comes
from (prior, learnt, measured), the learner's state lives in the autoscaler's memory, and a
measured figure is used as given. Prometheus and the API server are fakes (`test_autoscaler`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from test_autoscaler import IDLE, OVERLOADED, Harness, harness, model_group_body

PROFILE = {"gpu": "h100-80g", "maxNumSeqs": 2, "maxNumBatchedTokens": 2048}
# Requests wait while the group serves about 80 % of the capacity the prior promises: the engine is
# slower than the prior, so the learnt capacity comes out lower.
SLOWER = dataclasses.replace(OVERLOADED, prompt_tokens_per_second=1075.0, generation_tokens_per_second=269.0)


def capacity(h: Harness) -> dict[str, Any]:
    return dict(h.status["capacity"])


def test_a_group_that_serves_more_than_the_prior_while_requests_wait_leaves_it_alone() -> None:
    """Waiting requests say the SLO is not held at what the group serves: no reason to go up."""
    h = harness(groups={"g0": OVERLOADED})
    for at in (0, 10, 20):
        h.tick(at=at)
    assert capacity(h)["source"] == "prior"


def test_the_first_decision_uses_the_prior_and_says_so() -> None:
    h = harness(groups={"g0": IDLE})
    h.tick()
    status = capacity(h)
    assert status["source"] == "prior"
    assert status["confidence"] == 0
    assert status["workSecondsPerSecond"] > 0
    assert "evidenceWindow" not in status  # no evidence yet: unknown, not a made-up window
    assert h.status["lastDecision"]["capacity"] == {
        "source": "prior",
        "workSecondsPerSecond": status["workSecondsPerSecond"],
        "confidence": 0,
    }


def test_groups_that_wait_while_busy_teach_a_lower_capacity_with_its_evidence_window() -> None:
    h = harness(groups={"g0": SLOWER})
    h.tick(at=0)
    prior = capacity(h)["workSecondsPerSecond"]
    h.tick(at=10)
    h.tick(at=20)
    learnt = capacity(h)
    assert learnt["source"] == "learnt"
    assert 0 < learnt["workSecondsPerSecond"] < prior
    assert 0 < learnt["confidence"] < 1
    window = learnt["evidenceWindow"]
    assert window["start"] < window["end"]
    assert h.status["lastDecision"]["capacity"]["source"] == "learnt"


def test_a_measured_capacity_is_used_as_given() -> None:
    body = model_group_body(profile={**PROFILE, "capacityWorkSecondsPerSecond": 0.8})
    h = harness(body, groups={"g0": OVERLOADED})
    for at in (0, 10, 20):
        h.tick(at=at)
    assert capacity(h) == {
        "source": "measured",
        "workSecondsPerSecond": 0.8,
        "confidence": 1,
        "reason": "measured by the team",
    }


def test_a_measured_capacity_is_learnt_from_when_the_model_group_asks() -> None:
    body = model_group_body(profile={**PROFILE, "capacityWorkSecondsPerSecond": 0.06, "learnCapacity": True})
    h = harness(body, groups={"g0": SLOWER})
    for at in (0, 10, 20):
        h.tick(at=at)
    learnt = capacity(h)
    assert learnt["source"] == "learnt"
    assert learnt["workSecondsPerSecond"] < 0.06


def test_learning_turned_off_keeps_the_prior() -> None:
    body = model_group_body(profile={**PROFILE, "learnCapacity": False})
    h = harness(body, groups={"g0": OVERLOADED})
    for at in (0, 10, 20):
        h.tick(at=at)
    assert (capacity(h)["source"], capacity(h)["reason"]) == ("prior", "learning is off")


def test_a_restarted_operator_falls_back_to_the_prior_and_relearns() -> None:
    h = harness(groups={"g0": SLOWER})
    for at in (0, 10, 20):
        h.tick(at=at)
    assert capacity(h)["source"] == "learnt"
    h.autoscaler = h.new_autoscaler()  # the learner's state is in memory only
    h.tick(at=30)
    assert capacity(h)["source"] == "prior"


def test_without_metrics_nothing_is_learnt() -> None:
    h = harness(groups={})
    for at in (0, 10, 20):
        h.tick(at=at)
    assert capacity(h)["source"] == "prior"
