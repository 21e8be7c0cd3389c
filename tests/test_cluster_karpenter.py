"""Karpenter on the local cluster: the instance types its KWOK provider reads, the NodePools the stories
apply, and the check that no launched node is left holding part of a group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from goodput.testbed.cluster import karpenter
from goodput.testbed.cluster.topology import CLIQUE_LABEL, GPU_COUNT_LABEL, GPU_RESOURCE, ZONE_LABEL


def test_every_instance_type_offers_its_gpus_in_every_zone() -> None:
    document = karpenter.instance_types_document()
    assert {kind["name"]: kind["resources"][GPU_RESOURCE] for kind in document} == {
        "p5.48xlarge": "8",
        "g6e.12xlarge": "4",
    }
    for kind in document:
        zones = {
            value
            for offering in kind["offerings"]
            for requirement in offering["Requirements"]
            if requirement["key"] == ZONE_LABEL
            for value in requirement["values"]
        }
        assert zones == set(karpenter.ZONES)


def test_a_node_pool_labels_its_nodes_for_placement_and_names_one_clique() -> None:
    pool = karpenter.node_pool("gpu", labels={"team": "ml"}, clique="c-1", consolidate_after_seconds=7)
    labels = pool["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "ml" and labels[GPU_COUNT_LABEL] == "8"
    requirements = {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements[CLIQUE_LABEL] == ["c-1"]
    assert pool["spec"]["disruption"]["consolidateAfter"] == "7s"
    assert "limits" not in pool["spec"]
    capped = karpenter.node_pool("gpu", labels={}, clique="c", gpu_limit=0)
    assert capped["spec"]["limits"] == {GPU_RESOURCE: "0"}


def test_karpenter_reads_its_options_from_the_environment(tmp_path: Path) -> None:
    layout = karpenter.KarpenterLayout(
        tmp_path, tmp_path / "kubeconfig", tmp_path / "types.json", 21001, 21002
    )
    env = karpenter.process_env(layout)
    assert env[karpenter.INSTANCE_TYPES_ENV] == str(tmp_path / "types.json")
    assert env["KUBECONFIG"] == str(tmp_path / "kubeconfig")
    assert (env["METRICS_PORT"], env["HEALTH_PROBE_PORT"]) == ("21001", "21002")
    assert karpenter.command(layout) == [str(tmp_path / "karpenter")]


def pod(group: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": {"g": group}}, "spec": {"nodeName": node} if node else {}}


@pytest.mark.parametrize(
    ("pods", "launched", "wrong"),
    [
        ([pod("g1", "k1"), pod("g1", "k2")], {"k1", "k2"}, []),
        ([pod("g1", "k1"), pod("g1", "old")], {"k1"}, ["k1"]),  # a group across old and new nodes
        ([pod("g1", "k1"), pod("g1", None)], {"k1"}, ["k1"]),  # half bound
        ([pod("g1", "old"), pod("g1", "old")], {"k1"}, ["k1"]),  # an empty launched node
        ([], set(), []),
    ],
    ids=["whole group", "across old and new", "half bound", "empty node", "nothing"],
)
def test_nodes_left_wrong(pods: list[dict[str, Any]], launched: set[str], wrong: list[str]) -> None:
    assert karpenter.nodes_left_wrong(pods, launched, "g") == wrong
