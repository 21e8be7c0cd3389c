"""A platform team runs two operator replicas: exactly one acts, and the other takes over when it dies
or is cut off, without a write of the two ever overlapping.

Each replica is `goodput run --leader-elect` with a client certificate of its own (operator-a,
operator-b), so the API server's audit log says who wrote what and when. The world is the
autoscaler stories' (test_autoscaler.py): the live vLLM emulator on a GPU node of the test's own,
an SLOPolicy, a ModelGroup and streaming load. Lease timing is client-go's: 15 s lease, 10 s renew
deadline, 2 s retry period.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_autoscaler import (
    BASE_RATE,
    BURST_RATE,
    Process,
    Stage,
    emulator_process,
    load,
    model_group,
    operator_process,
    slo_policy,
)

from goodput.api.labels import ANNOTATION_LAST_RESCALE
from goodput.controllers.leader_election import ElectionTiming
from goodput.testbed.cluster.config import StatePaths
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for

pytestmark = pytest.mark.e2e

LEASE = "goodput-e2e"
LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS = 15, 10, 2
TAKEOVER_BOUND_SECONDS = ElectionTiming(
    LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS
).takeover_bound_seconds
EXIT_LEADERSHIP_LOST = 75
IDENTITIES = ("operator-a", "operator-b")


@dataclass(frozen=True)
class Write:
    """One write as the API server's audit log recorded it."""

    user: str
    verb: str
    resource: str
    name: str
    code: int
    at: float
    count_record: dict[str, Any] | None = None
    """For a write of a ModelGroup's count: the decision it carried (None: not such a write, or none)."""

    @property
    def lease(self) -> bool:
        return self.resource == "leases"

    @property
    def changes_count(self) -> bool:
        return self.count_record is not None or self.resource == "modelgroups/scale"


def audit_writes(cluster: LocalCluster, namespace: str) -> list[Write]:
    """The operators' writes in `namespace`, oldest first."""
    path = StatePaths(cluster.state_dir).audit_log
    if not path.exists():
        pytest.fail(f"{path} is missing: this cluster was started without the audit policy; restart it")
    writes = []
    for line in path.read_text(errors="replace").splitlines():
        event = json.loads(line)
        user = event.get("user", {}).get("username")
        target = event.get("objectRef") or {}
        if user not in IDENTITIES or target.get("namespace") != namespace:
            continue
        resource = target.get("resource", "") + (
            f"/{target['subresource']}" if target.get("subresource") else ""
        )
        writes.append(
            Write(
                user=user,
                verb=event["verb"],
                resource=resource,
                name=target.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code") or 0),
                at=datetime.fromisoformat(
                    event["requestReceivedTimestamp"].replace("Z", "+00:00")
                ).timestamp(),
                count_record=_count_record(event.get("requestObject")),
            )
        )
    return sorted(writes, key=lambda write: write.at)


def _count_record(body: object) -> dict[str, Any] | None:
    """The decision a patch of `spec.replicas` carried in its annotation (None: no such patch)."""
    if not isinstance(body, dict) or "replicas" not in (body.get("spec") or {}):
        return None
    note = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_LAST_RESCALE)
    return json.loads(note) if note else {}


def elected_operator(cluster: LocalCluster, namespace: str, identity: str, tmp_path: Path) -> Process:
    """`goodput run --leader-elect` as `identity`, with a certificate of its own."""
    process = operator_process(cluster, namespace, tmp_path / f"{identity}.log")
    kubeconfig = cluster.client_kubeconfig(identity, tmp_path / f"{identity}.kubeconfig")
    process.environment["KUBECONFIG"] = str(kubeconfig)
    process.argv.remove("--standalone")
    process.argv += [
        "--leader-elect",
        "--leader-election-namespace", namespace,
        "--leader-election-name", LEASE,
        "--leader-election-identity", identity,
        "--lease-duration", str(LEASE_SECONDS),
        "--renew-deadline", str(RENEW_DEADLINE_SECONDS),
        "--retry-period", str(RETRY_SECONDS),
    ]  # fmt: skip
    return process


@dataclass
class Pair:
    stage: Stage
    operators: dict[str, Process]

    def holder(self) -> str:
        lease = self.stage.cluster.api.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{self.stage.namespace}/leases/{LEASE}"
        )
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def leader(self) -> tuple[str, str]:
        """(leader, follower) once the Lease names one of the two."""
        holder = wait_for(
            lambda: self.holder() if self.holder() in IDENTITIES else None,
            timeout_seconds=60,
            describe=lambda: "a holder of the Lease\n" + self.logs(),
        )
        assert holder is not None
        return holder, next(name for name in IDENTITIES if name != holder)

    def takeover(self, follower: str, since: float) -> float:
        """Seconds from `since` until the Lease names `follower`."""
        wait_for(
            lambda: self.holder() == follower,
            timeout_seconds=TAKEOVER_BOUND_SECONDS + 20,
            interval_seconds=0.1,
            describe=lambda: f"{follower} taking the Lease over\n" + self.logs(),
        )
        return time.time() - since

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{process.log_tail(12)}" for name, process in self.operators.items())


@pytest.fixture
def pair(cluster: LocalCluster, goodput_crds: list[str], namespace: str, tmp_path: Path) -> Iterator[Pair]:
    node = cluster.add_gpu_node(
        f"{namespace}-h100",
        zone=f"{namespace}-z",
        clique=f"{namespace}-c",
        labels={"e2e.goodput.dev/pool": namespace},
    )
    emulator = emulator_process(cluster, namespace, tmp_path / "emulator.log")
    operators = {name: elected_operator(cluster, namespace, name, tmp_path) for name in IDENTITIES}
    emulator.start()
    for process in operators.values():
        process.start()
    try:
        yield Pair(Stage(cluster, namespace, operators[IDENTITIES[0]], emulator), operators)
    finally:
        survivors = [p for p in operators.values() if p.process is not None and p.process.poll() is None]
        if survivors:
            cluster.kubectl(
                "delete", "modelgroups,slopolicies", "--all", "-n", namespace, "--wait=true", "--timeout=60s",
                check=False, timeout_seconds=90,
            )  # fmt: skip
        for process in operators.values():
            process.stop()
        emulator.stop()
        cluster.remove_node(node.name)


def assert_one_writer_at_a_time(writes: list[Write], first: str, second: str, handover: float) -> None:
    """`first` wrote only before `handover`, `second` only from its acquiring the Lease on."""
    # A candidate's refused Lease write (409: another replica holds or just created it) changed
    # nothing: that is how election works. Every other write counts, refused or not.
    writes = [w for w in writes if not (w.lease and w.code == 409)]
    by_first = [w for w in writes if w.user == first]
    by_second = [w for w in writes if w.user == second]
    assert by_first and by_second, writes[-10:]
    assert all(w.at < handover for w in by_first), [w for w in by_first if w.at >= handover]
    acquired = by_second[0]
    assert acquired.lease and acquired.code in (200, 201), (
        f"{second} wrote before it held the Lease: {acquired}"
    )
    assert by_first[-1].at < acquired.at, "the two replicas' writes overlap"


def test_the_follower_finishes_a_killed_leaders_scale_out_and_no_write_overlaps(pair: Pair) -> None:
    stage = pair.stage
    leader, follower = pair.leader()
    stage.apply(
        slo_policy("chat", stage.namespace), model_group("llama", stage.namespace, replicas=1, policy="chat")
    )
    stage.wait_ready_groups("llama", 1)
    with load(stage, "llama", [(BASE_RATE, 10), (BURST_RATE, 60)]):
        wait_for(
            lambda: stage.replicas("llama") > 1,
            timeout_seconds=60,
            interval_seconds=0.2,
            describe=lambda: f"a scale-out decision\n{stage.describe('llama')}\n{pair.logs()}",
        )
        wanted = stage.replicas("llama")
        killed_at = time.time()
        process = pair.operators[leader].process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        takeover_seconds = pair.takeover(follower, killed_at)
        print(f"\ntakeover after SIGKILL of the leader mid scale-out: {takeover_seconds:.1f} s")
        stage.wait_ready_groups("llama", stage.replicas("llama"), timeout_seconds=90)

    assert takeover_seconds <= TAKEOVER_BOUND_SECONDS + 1
    assert stage.replicas("llama") >= wanted
    writes = audit_writes(stage.cluster, stage.namespace)
    assert_one_writer_at_a_time(writes, leader, follower, handover=killed_at)
    # No pod created twice, and every group's ranks are unique.
    created = [w.name for w in writes if w.resource == "pods" and w.verb == "create" and w.code == 201]
    assert len(created) == len(set(created)), sorted(created)
    pods = stage.cluster.api.get(f"/api/v1/namespaces/{stage.namespace}/pods?labelSelector=goodput.dev/group")
    ranks = [
        (p["metadata"]["labels"]["goodput.dev/group"], p["metadata"]["labels"]["goodput.dev/rank"])
        for p in (pods or {}).get("items", [])
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert len(ranks) == len(set(ranks)), ranks
    # No decision applied twice: the history holds each outcome once; and each successful write of
    # the count carried its decision, which is in the history, the killed leader's last one too (the
    # follower records it from the write's annotation if the leader died before its status write).
    history = stage.status("llama").get("decisions", [])
    assert len({entry["time"] for entry in history}) == len(history), history
    outcomes = [(entry["fromReplicas"], entry["toReplicas"]) for entry in history]
    assert all(a != b for a, b in itertools.pairwise(outcomes)), outcomes
    scaled = [w for w in writes if w.changes_count and w.code == 200]
    assert scaled and all(w.count_record for w in scaled), scaled
    recorded = {(entry["time"], entry["fromReplicas"], entry["toReplicas"]) for entry in history}
    carried = {(r["time"], r["fromReplicas"], r["toReplicas"]) for w in scaled if (r := w.count_record)}
    assert carried <= recorded, (carried - recorded, history)
    counts = {name: sum(1 for w in writes if w.user == name and not w.lease) for name in IDENTITIES}
    leases = {name: sum(1 for w in writes if w.user == name and w.lease) for name in IDENTITIES}
    pods_by = {
        name: sum(1 for w in writes if w.user == name and w.resource == "pods" and w.code == 201)
        for name in IDENTITIES
    }
    print(
        f"audit: writes (not the Lease) by replica {counts}, Lease writes {leases}, pods created {pods_by}, "
        f"scale writes {len(scaled)}, decisions recorded {len(history)}; "
        f"last write of the killed leader {killed_at - by_user(writes, leader)[-1].at:.2f} s before the kill"
    )


def by_user(writes: list[Write], user: str) -> list[Write]:
    return [w for w in writes if w.user == user]
