"""Pools: today's ModelGroup is exactly one pool, `serving`, and everything per pool stays per pool.

A ModelGroup's pools derive from its spec; its pods carry their pool (or predate the label and
belong to `serving`); the group controller plans one pool's groups and leaves another's alone;
`status.pools` is computed whole from the plan."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_autoscaler import NAME as AUTOSCALED
from test_autoscaler import NAMESPACE as AUTOSCALED_NAMESPACE
from test_autoscaler import OVERLOADED
from test_autoscaler import harness as autoscaler_harness
from test_decision_record import SCALE_OUT
from test_groups import NOW, TEMPLATE, group, states, world
from test_groups_status import assessment, status_of
from test_metrics_source import MODEL_GROUP
from test_pods import LLAMA_8B, LLAMA_70B

from goodput.api.labels import LABEL_POOL, SERVING_POOL, leader_label_selector, pool_leader_label_selector
from goodput.api.modelgroup import GroupStatus, ModelGroupSpec, ModelGroupStatus, PoolStatus
from goodput.controllers import naming
from goodput.controllers.autoscale.record import decision_entry, record_decisions
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.observation import parse_pod
from goodput.controllers.groups.pods import render_group
from goodput.controllers.pools import PoolKey, PoolSpec, model_group_pools, pool_of_labels
from goodput.operator.autoscaler import Memory
from goodput.operator.metrics_source import group_counts, group_observations

SPEC_BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "parallelism": {"gpusPerPod": 1},
}


@dataclass(frozen=True)
class DerivationCase:
    name: str
    spec: dict[str, Any]
    pools: tuple[PoolSpec, ...]
    desired_groups: int


DERIVATIONS = [
    DerivationCase(
        "the defaults are one serving pool of one group",
        {"maxReplicas": 4},
        (PoolSpec(SERVING_POOL, replicas=1, min_replicas=1, max_replicas=4),),
        desired_groups=1,
    ),
    DerivationCase(
        "the pool takes the spec's count, bounds and warm floor",
        {"replicas": 3, "minReplicas": 2, "maxReplicas": 8, "warmReplicas": 2},
        (PoolSpec(SERVING_POOL, replicas=3, min_replicas=2, max_replicas=8, warm_replicas=2),),
        desired_groups=3,
    ),
    DerivationCase(
        "a maximum moved below the count converges the pool to the maximum",
        {"replicas": 6, "minReplicas": 1, "maxReplicas": 4},
        (PoolSpec(SERVING_POOL, replicas=6, min_replicas=1, max_replicas=4),),
        desired_groups=4,
    ),
    DerivationCase(
        "a minimum moved above the count converges the pool to the minimum",
        {"replicas": 1, "minReplicas": 3, "maxReplicas": 4},
        (PoolSpec(SERVING_POOL, replicas=1, min_replicas=3, max_replicas=4),),
        desired_groups=3,
    ),
    DerivationCase(
        "a pool scaled to zero wants no group",
        {"replicas": 0, "minReplicas": 0, "maxReplicas": 4},
        (PoolSpec(SERVING_POOL, replicas=0, min_replicas=0, max_replicas=4),),
        desired_groups=0,
    ),
]


@pytest.mark.parametrize("case", DERIVATIONS, ids=lambda case: case.name)
def test_a_model_group_without_roles_is_one_serving_pool(case: DerivationCase) -> None:
    spec = ModelGroupSpec.model_validate({**SPEC_BASE, **case.spec})
    pools = model_group_pools(spec)
    assert pools == case.pools
    assert [pool.desired_groups for pool in pools] == [case.desired_groups]


@given(replicas=st.integers(0, 1000), minimum=st.integers(0, 1000), maximum=st.integers(1, 1000))
def test_a_pools_groups_stay_within_its_bounds_when_they_are_consistent(
    replicas: int, minimum: int, maximum: int
) -> None:
    pool = PoolSpec(SERVING_POOL, replicas=replicas, min_replicas=minimum, max_replicas=maximum)
    if minimum <= maximum:
        assert minimum <= pool.desired_groups <= maximum
    else:  # bounds crossed by hand: the minimum wins, as it always did
        assert pool.desired_groups == minimum


@pytest.mark.parametrize(
    ("labels", "pool"),
    [
        ({LABEL_POOL: "serving"}, "serving"),
        ({LABEL_POOL: "prefill"}, "prefill"),
        ({}, SERVING_POOL),
        ({LABEL_POOL: ""}, SERVING_POOL),
    ],
    ids=["labelled serving", "labelled another pool", "no label: created before pools", "empty label"],
)
def test_a_pods_pool_is_its_label_or_serving(labels: dict[str, str], pool: str) -> None:
    assert pool_of_labels(labels) == pool


def test_every_pod_of_a_group_carries_its_pool_and_a_pod_without_the_label_is_serving() -> None:
    manifests = render_group(replace(LLAMA_70B, pool="prefill"), "g0", "clique-a")
    assert [p["metadata"]["labels"][LABEL_POOL] for p in manifests.pods] == ["prefill", "prefill"]
    assert [view.pool for view in map(parse_pod, manifests.pods) if view is not None] == ["prefill"] * 2
    serving = render_group(LLAMA_70B, "g0", "clique-a").pods[0]
    assert serving["metadata"]["labels"][LABEL_POOL] == SERVING_POOL
    legacy = {**serving, "metadata": {**serving["metadata"], "labels": dict(serving["metadata"]["labels"])}}
    del legacy["metadata"]["labels"][LABEL_POOL]
    view = parse_pod(legacy)
    assert view is not None and view.pool == SERVING_POOL


def test_the_pool_is_no_part_of_the_revision_so_an_upgrade_outdates_no_group() -> None:
    # The revisions these templates had before pools existed: running groups stay current.
    assert (LLAMA_8B.revision, LLAMA_70B.revision) == ("3b029c3fd2", "51611e9bca")
    assert replace(LLAMA_8B, pool="prefill").revision == LLAMA_8B.revision


def test_groups_created_before_the_pool_label_are_the_serving_pools() -> None:
    legacy = [replace(p, pool=pool_of_labels({})) for p in group("g0", "ready")]
    plan = plan_model_group(world(legacy, desired=1))
    assert states(plan) == {"g0": "Ready"}
    assert plan.creations == () and plan.drain_starts == () and plan.deletions == ()


def test_a_pool_is_planned_alone_and_leaves_another_pools_groups_be() -> None:
    prefill = [replace(p, pool="prefill") for p in group("g0", "ready")]
    plan = plan_model_group(world(prefill, desired=1, group_counter=1))
    assert [creation.group for creation in plan.creations] == ["g1"]
    assert "g0" not in states(plan)
    assert plan.drain_starts == () and plan.deletions == () and plan.unready == ()
    own = plan_model_group(world(prefill, desired=1, template=replace(TEMPLATE, pool="prefill")))
    assert states(own) == {"g0": "Ready"} and own.creations == ()


def test_status_pools_is_computed_whole_from_the_plan() -> None:
    stale = ModelGroupStatus(
        pools=(
            PoolStatus(name="serving", desired_groups=9, ready_groups=9, revision="old"),
            PoolStatus(name="prefill", desired_groups=2),
        )
    )
    status = status_of(
        assessment("g0", "Ready"),
        assessment("g1", "Warming"),
        assessment("g2", "Draining"),
        desired=2,
        previous=stale,
    )
    assert status.pools == (
        PoolStatus(
            name=SERVING_POOL,
            desired_groups=2,
            warming_groups=1,
            ready_groups=1,
            draining_groups=1,
            label_selector=leader_label_selector("llama"),
        ),
    )
    # The one pool's figures are the ModelGroup's own: nothing a user read before changes.
    (pool,) = status.pools
    assert (pool.desired_groups, pool.ready_groups, pool.label_selector, pool.revision) == (
        status.desired_groups,
        status.ready_groups,
        status.label_selector,
        status.revision,
    )


def test_a_pass_without_a_rollout_keeps_the_pools_revision_as_the_model_groups() -> None:
    """A plan that planned no rollout keeps the revision last written, for the pool as for the
    ModelGroup: the pool's entry never reads absent while the ModelGroup's names a revision."""
    status = status_of(assessment("g0", "Ready"), desired=1, previous=ModelGroupStatus(revision="abc123"))
    assert status.revision == "abc123"
    assert [pool.revision for pool in status.pools] == ["abc123"]


@pytest.mark.parametrize(
    ("pool", "others", "selector"),
    [
        ("serving", (), "goodput.dev/model-group=llama,goodput.dev/rank=0"),
        (
            "serving",
            ("decode", "prefill", "serving"),
            "goodput.dev/model-group=llama,goodput.dev/rank=0,goodput.dev/pool notin (decode,prefill)",
        ),
        ("prefill", ("decode",), "goodput.dev/model-group=llama,goodput.dev/rank=0,goodput.dev/pool=prefill"),
    ],
    ids=["the one pool selects as the ModelGroup did", "serving leaves the others out", "a role by label"],
)
def test_a_pools_leader_selector(pool: str, others: tuple[str, ...], selector: str) -> None:
    assert pool_leader_label_selector("llama", pool, others) == selector


def test_pool_keys_of_two_pools_of_one_model_group_differ() -> None:
    keys = {PoolKey("serving", "llama"), PoolKey("serving", "llama", "prefill"), PoolKey("serving", "llama")}
    assert keys == {PoolKey("serving", "llama", SERVING_POOL), PoolKey("serving", "llama", "prefill")}
    assert naming.LABEL_POOL == LABEL_POOL


def test_a_pools_snapshot_counts_its_own_groups_and_an_older_record_is_serving() -> None:
    status = ModelGroupStatus(
        groups=(
            GroupStatus(name="g0", state="Ready", created_at=NOW),  # written before pools
            GroupStatus(name="g1", state="Ready", created_at=NOW, pool=SERVING_POOL),
            GroupStatus(name="g2", state="Ready", created_at=NOW, pool="prefill", outdated=True),
        )
    )
    observed = group_observations(MODEL_GROUP, status, {}, now=NOW.timestamp())
    assert sorted(group.name for group in observed) == ["g0", "g1"]
    assert group_counts(MODEL_GROUP, status).outdated == frozenset()
    with pytest.raises(KeyError, match="no pool 'prefill'"):
        group_counts(MODEL_GROUP, status, "prefill")


def test_the_autoscalers_memory_is_per_pool_and_forgetting_a_model_group_drops_every_pool() -> None:
    h = autoscaler_harness(groups={"g0": OVERLOADED})
    assert h.autoscaler is not None
    other = Memory(pool="prefill")
    h.autoscaler.memories[PoolKey(AUTOSCALED_NAMESPACE, AUTOSCALED, "prefill")] = other
    h.tick()
    serving = h.autoscaler.memories[PoolKey(AUTOSCALED_NAMESPACE, AUTOSCALED)]
    assert serving.active.started and serving.pool == SERVING_POOL
    assert not other.active.started and other.capacity == Memory().capacity
    assert h.status["lastDecision"]["pool"] == SERVING_POOL
    h.autoscaler.forget(AUTOSCALED_NAMESPACE, AUTOSCALED)
    assert h.autoscaler.memories == {}


def test_a_decision_carries_its_pool_and_an_older_record_counts_as_the_serving_pools() -> None:
    entry = decision_entry(SCALE_OUT)
    assert entry.pool == SERVING_POOL
    older = entry.model_copy(update={"pool": None, "time": entry.time - timedelta(seconds=30)})
    status = record_decisions(ModelGroupStatus(decisions=(older,)), active=SCALE_OUT, shadow=None)
    assert status.decisions == (older,)  # the same outcome, not recorded twice across an upgrade
    prefill = record_decisions(ModelGroupStatus(), active=SCALE_OUT, shadow=None, pool="prefill")
    assert prefill.last_decision is not None and prefill.last_decision.pool == "prefill"
