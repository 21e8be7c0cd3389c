"""The simulator runs the operator's capacity learner: a run can start goodput from a wrong prior
(`--capacity-prior-factor`) and the capacity in use, with its source, is on every decision."""

from __future__ import annotations

import pytest
from test_one_decision import WORKLOAD, model_group_setup

from goodput.controllers.autoscale.model import CapacitySource
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.simulation import SimulationConfig, simulate


def test_the_prior_factor_scales_the_compiled_capacity() -> None:
    truth = GoodputPolicy.for_setup(model_group_setup(), WORKLOAD, None)
    halved = GoodputPolicy.for_setup(model_group_setup(), WORKLOAD, None, capacity_prior_factor=0.5)
    assert halved.profile.reference.work_per_second == pytest.approx(
        0.5 * truth.profile.reference.work_per_second
    )
    assert halved.profile.capacity_grid[0][0] == pytest.approx(0.5 * truth.profile.capacity_grid[0][0])


@pytest.mark.parametrize("factor", [0.0, -1.0, float("nan"), float("inf")])
def test_a_prior_factor_that_is_not_a_positive_number_is_refused_by_name(factor: float) -> None:
    with pytest.raises(ValueError, match="--capacity-prior-factor"):
        GoodputPolicy.for_setup(model_group_setup(), WORKLOAD, None, capacity_prior_factor=factor)


def run(policy: GoodputPolicy) -> GoodputPolicy:
    config = SimulationConfig(fleet=model_group_setup().fleet(), seed=7, initial_groups=2, tail_seconds=60.0)
    simulate(WORKLOAD, config, policy)
    return policy


def test_a_run_from_twice_the_truth_learns_a_lower_capacity_and_every_decision_says_which() -> None:
    policy = run(
        GoodputPolicy.for_setup(
            model_group_setup(), WORKLOAD, None, capacity_prior_factor=2.0, learn_capacity=True
        )
    )
    prior = policy.profile.reference.work_per_second
    history = [capacity for _, capacity in policy.capacity_history]
    assert history[0].source is CapacitySource.PRIOR
    assert any(capacity.source is CapacitySource.LEARNT for capacity in history)
    assert min(capacity.work_seconds_per_second for capacity in history) < 0.8 * prior
    assert policy.last_decision is not None and policy.last_decision.capacity == history[-1]
    record = policy.last_decision.to_record()["capacity"]
    assert isinstance(record, dict) and record["source"] == str(history[-1].source)


def test_without_learning_the_prior_is_used_throughout() -> None:
    policy = run(GoodputPolicy.for_setup(model_group_setup(), WORKLOAD, None, capacity_prior_factor=2.0))
    prior = policy.profile.reference.work_per_second
    assert {(c.source, c.work_seconds_per_second) for _, c in policy.capacity_history} == {
        (CapacitySource.PRIOR, prior)
    }
