"""The gateway's book of sessions waiting on a tool (goodput.gateway.tool_waits), and the gateway
applying it: the wait learnt, the affinity kept or let go, the KV counted and charged."""

from __future__ import annotations

import dataclasses

import pytest
from test_gateway import completion, run, sample
from test_gateway_sessions import agent, policy_with, rig
from waiting import until

from goodput.controllers.requests.tool_waits import HeldKv, ToolWaitPolicy, WaitAction
from goodput.gateway.tool_waits import WaitCharge, WaitDesk

KV_BYTES_PER_TOKEN = 131_072


def held(tokens: int = 8000, recompute_seconds: float = 0.5, pressure: float = 0.9) -> HeldKv:
    return HeldKv(tokens, KV_BYTES_PER_TOKEN, recompute_seconds, 400_000, pressure)


def learnt_desk(wait_seconds: float, policy: ToolWaitPolicy | None = None) -> WaitDesk:
    """A desk that has seen enough waits of `wait_seconds` to trust them."""
    desk = WaitDesk(policy or ToolWaitPolicy(min_observations=3))
    for index in range(4):
        desk.waits(f"past-{index}", "a", "chat", "agent", "g1", held(), now=0.0)
        desk.resumed(f"past-{index}", "chat", now=wait_seconds)
    return desk


def test_a_resumed_session_teaches_the_desk_its_wait() -> None:
    desk = WaitDesk(ToolWaitPolicy(min_observations=1.5))
    for name, ended_at, resumed_at in (("s1", 0.0, 3.0), ("s2", 10.0, 14.0)):
        desk.waits(name, "a", "chat", "agent", "g1", held(), now=ended_at)
        desk.resumed(name, "chat", now=resumed_at)
    predicted = desk.book.predicted_wait("chat", "agent", now=14.0)
    assert predicted.learnt and predicted.seconds == 4.0


def test_a_kept_session_holds_its_kv_on_its_group_and_is_charged_for_it() -> None:
    desk = learnt_desk(10.0)
    choice = desk.waits("s1", "a", "chat", "agent", "g1", held(tokens=8000), now=100.0)
    assert choice.action is WaitAction.KEEP
    assert desk.kept_tokens("g1") == 8000 and desk.kept_tokens("g2") == 0
    assert desk.tokens(WaitAction.KEEP) == 8000
    charge = desk.resumed("s1", "chat", now=103.0)
    assert charge == WaitCharge("a", 8000 * KV_BYTES_PER_TOKEN * 3.0)
    assert desk.kept_tokens("g1") == 0


def test_an_offloaded_session_holds_no_gpu_kv_and_is_not_charged_for_it() -> None:
    desk = learnt_desk(20.0, ToolWaitPolicy(offload_cpu_bytes=64 * 2**30, min_observations=3))
    assert desk.waits("s1", "a", "chat", "agent", "g1", held(), now=100.0).action is WaitAction.OFFLOAD
    assert desk.kept_tokens("g1") == 0 and desk.tokens(WaitAction.OFFLOAD) == 8000
    assert desk.resumed("s1", "chat", now=120.0) == WaitCharge("a", 0.0)
    assert desk.tokens(WaitAction.OFFLOAD) == 0


def test_a_session_that_ends_while_waiting_is_charged_to_its_end_and_forgotten() -> None:
    desk = learnt_desk(10.0)
    desk.waits("s1", "a", "chat", "agent", "g1", held(tokens=100), now=0.0)
    assert desk.forget("s1", now=5.0) == WaitCharge("a", 100 * KV_BYTES_PER_TOKEN * 5.0)
    assert desk.resumed("s1", "chat", now=6.0) is None
    assert desk.tokens(WaitAction.KEEP) == 0


def test_a_hold_lapses_at_its_predicted_wait_and_is_charged_to_then() -> None:
    desk = learnt_desk(2.0)
    assert desk.waits("s1", "a", "chat", "agent", "g1", held(tokens=100), now=10.0).action is WaitAction.KEEP
    assert desk.lapse(now=11.0) == [] and desk.kept_tokens("g1") == 100
    assert desk.lapse(now=13.0) == [WaitCharge("a", 100 * KV_BYTES_PER_TOKEN * 2.0)]
    assert desk.kept_tokens("g1") == 0 and desk.tokens(WaitAction.KEEP) == 0
    # The session comes back late: nothing more to charge, and its long wait is learnt.
    assert desk.resumed("s1", "chat", now=40.0) == WaitCharge("a", 0.0)
    assert desk.book.record("chat", "agent").longest() == 30.0


def test_a_hold_chosen_again_is_not_lapsed_by_its_earlier_deadline() -> None:
    desk = learnt_desk(2.0)
    desk.waits("s1", "a", "chat", "agent", "g1", held(tokens=100), now=10.0)
    desk.resumed("s1", "chat", now=11.0)
    desk.waits("s1", "a", "chat", "agent", "g1", held(tokens=100), now=11.5)  # due at 13.5
    assert desk.lapse(now=12.5) == [] and desk.kept_tokens("g1") == 100


def test_the_desk_is_bounded() -> None:
    desk = WaitDesk(ToolWaitPolicy(min_observations=1), max_waiting=2)
    desk.book.observe("chat", "agent", 0.0, now=0.0)
    for name in ("s1", "s2", "s3"):
        desk.waits(name, "a", "chat", "agent", "g1", held(tokens=10), now=0.0)
    assert list(desk.waiting) == ["s2", "s3"] and desk.kept_tokens("g1") == 20


@pytest.mark.parametrize(
    ("min_observations", "expected"),
    [
        pytest.param(100.0, "recompute", id="nothing learnt yet: the session is let go"),
        pytest.param(0.5, "keep", id="waits learnt, the group idle: the session is kept"),
    ],
)
def test_the_gateway_chooses_for_a_session_whose_children_all_ended(
    min_observations: float, expected: str
) -> None:
    policy = policy_with(
        agent(sessionBudget={"branches": 10}),
        tool_waits=ToolWaitPolicy(min_observations=min_observations),
    )

    async def main() -> None:
        async with rig(policy, groups=2) as r:
            r.gateway.desk.waits.book.observe(policy.model_group, "agent", 60.0, now=r.gateway.clock())
            root = await r.post(completion(), **{"X-Goodput-Session-Open": "s1", "X-Goodput-Tenant": "a"})
            assert root.status == 200
            labels = {"model_group": policy.model_group}
            assert (
                sample(r.gateway, "goodput_gateway_tool_wait_actions_total", **labels, action=expected) == 1
            )
            kept = sample(r.gateway, "goodput_gateway_waiting_session_kv_tokens", **labels, action="keep")
            # The session's group is remembered while it is kept, forgotten once it is let go.
            assert ("s1" in r.gateway.sessions) is (expected == "keep")
            assert (kept > 0) is (expected == "keep")
            served_by = root.headers["X-Goodput-Group"]
            loads = {load.name: load for load in r.gateway.loads()}
            free = policy.kv_capacity_tokens - (kept if expected == "keep" else 0)
            assert loads[served_by].kv_free_tokens == free
            child = await r.post(completion(), **{"X-Goodput-Session": "s1"})
            assert child.status == 200
            if expected == "keep":
                assert child.headers["X-Goodput-Group"] == served_by
            # The child's arrival ended the wait: nothing is held for the session now it has ended too.
            assert r.gateway.desk.waits.book.record(policy.model_group, "agent").observations(
                r.gateway.clock()
            ) == pytest.approx(2.0, rel=1e-3)

    run(main)


def test_a_tenant_is_charged_for_the_kv_its_kept_session_held_while_waiting() -> None:
    """The session waits, kept, until its deadline ends it: that wait alone moves its tenant's
    fairness counter, priced by `costWeights.kvByteSeconds`."""
    base = policy_with(
        agent(sessionBudget={"branches": 10, "wallClockSeconds": 0.5}),
        tool_waits=ToolWaitPolicy(min_observations=0.5),
    )
    weights = dataclasses.replace(base.fairness.cost_weights, kv_byte_seconds=1e-9)
    policy = dataclasses.replace(base, fairness=dataclasses.replace(base.fairness, cost_weights=weights))

    async def main() -> None:
        async with rig(policy) as r:
            r.gateway.desk.waits.book.observe(policy.model_group, "agent", 60.0, now=r.gateway.clock())
            root = await r.post(completion(), **{"X-Goodput-Session-Open": "s1", "X-Goodput-Tenant": "a"})
            assert root.status == 200 and r.gateway.desk.waits.waiting["s1"].action is WaitAction.KEEP
            before = r.gateway.queue.counters["a"]
            await until(lambda: r.gateway.desk.table.get("s1") is None, "the session's deadline")
            assert r.gateway.queue.counters["a"] > before
            assert not r.gateway.desk.waits.waiting

    run(main)


def test_the_tier_turns_over_at_the_prompts_the_gateway_sends_its_group() -> None:
    desk = WaitDesk(ToolWaitPolicy(offload_cpu_bytes=64 * 2**30))
    assert desk.turnover_seconds("g1", KV_BYTES_PER_TOKEN, now=0.0) == float("inf"), "nothing written yet"
    for second in range(300):
        desk.written("g1", 2000, now=float(second))
    turnover = desk.turnover_seconds("g1", KV_BYTES_PER_TOKEN, now=300.0)
    assert turnover == pytest.approx(64 * 2**30 / (2000 * KV_BYTES_PER_TOKEN), rel=0.05)
    assert desk.turnover_seconds("g2", KV_BYTES_PER_TOKEN, now=300.0) == float("inf")
    desk.keep_groups({"g2"})
    assert desk.turnover_seconds("g1", KV_BYTES_PER_TOKEN, now=300.0) == float("inf"), "a group gone"
