"""The server-side apply model the operator's tests write status through behaves as the API server's."""

from __future__ import annotations

from typing import Any

from server_side_apply import AppliedStatus


def condition(kind: str, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": "R", "message": "", "lastTransitionTime": "t"}


def apply(state: AppliedStatus, manager: str, **status: Any) -> None:
    state.apply({"metadata": {"name": "m", "namespace": "n"}, "status": status}, manager)


def test_a_manager_leaving_out_what_it_applied_removes_it_and_only_it() -> None:
    state = AppliedStatus()
    apply(state, "groups", readyGroups=1, conditions=[condition("Ready")])
    apply(state, "autoscaler", lastDecision={"to": 2}, conditions=[condition("ScalingActive")])
    apply(state, "autoscaler", conditions=[condition("ScalingActive", "False")])
    assert state.status == {
        "readyGroups": 1,
        "conditions": [condition("Ready"), condition("ScalingActive", "False")],
    }


def test_a_field_two_managers_set_alike_stays_until_both_leave_it_out() -> None:
    state = AppliedStatus()
    apply(state, "a", conditions=[condition("Ready")])
    apply(state, "b", conditions=[condition("Ready")])
    apply(state, "a")
    assert state.owner_of_condition("Ready") == {"b"} and state.status["conditions"] == [condition("Ready")]
    apply(state, "b", conditions=[condition("Ready", "False")])
    apply(state, "b")
    assert "conditions" not in state.status
