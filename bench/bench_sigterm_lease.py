"""A clean stop hands the leader Lease back, whenever the SIGTERM comes.

    python bench/bench_sigterm_lease.py [--stops 50] [--seed 1] [--model-groups 4] [--cluster STATE_DIR]
        [--operator-source DIR]

Starts a cluster (unless given one), fake leaders and a health agent so that `--model-groups`
ModelGroups, bound to an SLOPolicy that autoscales every 5 s, serve and are Ready, and three
`goodput run --leader-elect` processes over their namespace (client-go timing: 15 s lease, 10 s
renew deadline, 2 s retry period): one leads, two follow. Then, `--stops` times, it sends the
leader SIGTERM at a moment drawn from the seed:

- starting: 0-2 s after it took the Lease (kopf and its handlers starting, the first passes);
- reconciling: 2-6 s after (ModelGroup passes every second, autoscaler ticks and their batched
  Prometheus reads);
- stopping: as reconciling, then a second SIGTERM 0-0.4 s after the first, while it shuts down
  (the line says when the process exited before the second one could be sent).

After each stop it reads the Lease the moment the stopped process has exited: released when it no
longer names that process (cleared, or already taken by the next); and it times the SIGTERM to the
moment another operator held the Lease. A new follower then replaces the stopped process. Prints
one line per stop and a summary (released N of M, takeover times); exits 1 unless every stop
released the Lease.

`--operator-source DIR` runs the operators from another tree: DIR holds a `goodput` folder whose
layers (`operator`, `controllers`, ...) are those of the commit to compare, and goes first on the
operators' PYTHONPATH.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from goodput.controllers.leader_election import ElectionTiming
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.fleet_bench import API, apply_documents, fleet_agent, fleet_documents, fleet_leaders
from goodput.testbed.operator_process import OperatorProcess, local_cluster

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "bench-sigterm-lease"
LEASE = "goodput-bench"
TIMING = ElectionTiming(lease_duration_seconds=15, renew_deadline_seconds=10, retry_period_seconds=2)
FOLLOWERS = 2
POLL_SECONDS = 0.05
# Past this after the SIGTERM a stop is over: a Lease kept by the stopped process has run out by then.
STOP_BOUND_SECONDS = TIMING.takeover_bound_seconds + 25
KINDS = ("starting", "reconciling", "stopping")


@dataclass(frozen=True)
class Moment:
    """When a stop comes: `after_takeover_seconds` after the leader took the Lease, and for a stop
    during shutdown, a second SIGTERM `second_signal_seconds` after the first."""

    kind: str
    after_takeover_seconds: float
    second_signal_seconds: float | None = None


def draw_moments(seed: int, count: int) -> list[Moment]:
    """`count` moments, each kind a third of them, in an order and at offsets drawn from `seed`."""
    rng = random.Random(seed)
    kinds = [KINDS[index % len(KINDS)] for index in range(count)]
    rng.shuffle(kinds)
    moments = []
    for kind in kinds:
        if kind == "starting":
            moments.append(Moment(kind, rng.uniform(0.0, 2.0)))
        elif kind == "reconciling":
            moments.append(Moment(kind, rng.uniform(2.0, 6.0)))
        else:
            moments.append(Moment(kind, rng.uniform(2.0, 6.0), rng.uniform(0.0, 0.4)))
    return moments


@dataclass
class Stop:
    """One stop as observed."""

    index: int
    identity: str
    moment: Moment
    exit_code: int | None = None
    exit_seconds: float | None = None
    holder_at_exit: str = ""
    next_holder: str = ""
    takeover_seconds: float | None = None
    tracebacks: int = 0
    second_signal_sent: bool = False
    last_error: str = ""
    """The last line of its log's last traceback: why a stop went wrong."""

    @property
    def released(self) -> bool:
        return self.exit_seconds is not None and self.holder_at_exit != self.identity

    def line(self, total: int) -> str:
        moment = self.moment
        when = f"{moment.kind:<11} +{moment.after_takeover_seconds:.2f} s"
        if moment.second_signal_seconds is not None:
            sent = "" if self.second_signal_sent else " (exited first)"
            when += f", 2nd SIGTERM +{moment.second_signal_seconds:.2f} s{sent}"
        exited = (
            "did not exit (SIGKILLed)"
            if self.exit_seconds is None
            else f"exit {self.exit_code} after {self.exit_seconds:.1f} s"
        )
        lease = "released" if self.released else f"NOT released (held by {self.holder_at_exit or 'none'})"
        taken = (
            f"{self.next_holder} took it {self.takeover_seconds:.1f} s after the SIGTERM"
            if self.takeover_seconds is not None
            else "nobody took it"
        )
        extra = (
            f", {self.tracebacks} traceback(s) in its log, the last: {self.last_error}"
            if self.tracebacks
            else ""
        )
        return f"stop {self.index:>2}/{total} {self.identity:<6} {when:<44} {exited}, {lease}; {taken}{extra}"


@dataclass
class Candidates:
    """The operator processes competing for the Lease, each with a client identity of its own."""

    cluster: LocalCluster
    log_dir: Path
    source: Path | None = None
    operators: dict[str, OperatorProcess] = field(default_factory=dict)
    started: int = 0

    def start_one(self) -> None:
        self.started += 1
        identity = f"op-{self.started}"
        operator = OperatorProcess(self.cluster, NAMESPACE, self.log_dir / f"{identity}.log")
        operator.environment = {
            "GOODPUT_PROMETHEUS_URL": self.cluster.prometheus_url,
            "GOODPUT_PROMETHEUS_TIMEOUT_SECONDS": "2",
            "GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS": "8",
            "GOODPUT_LEADER_ELECTION": "true",
            "GOODPUT_LEADER_ELECTION_NAMESPACE": NAMESPACE,
            "GOODPUT_LEADER_ELECTION_NAME": LEASE,
            "GOODPUT_LEADER_ELECTION_IDENTITY": identity,
            "GOODPUT_LEASE_DURATION_SECONDS": str(TIMING.lease_duration_seconds),
            "GOODPUT_RENEW_DEADLINE_SECONDS": str(TIMING.renew_deadline_seconds),
            "GOODPUT_RETRY_PERIOD_SECONDS": str(TIMING.retry_period_seconds),
        }
        if self.source is not None:
            operator.environment["PYTHONPATH"] = str(self.source)
        operator.start()
        self.operators[identity] = operator

    def top_up(self, leader: str) -> None:
        while sum(1 for name in self.operators if name != leader) < FOLLOWERS:
            self.start_one()

    def holder(self) -> str:
        lease = self.cluster.api.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def first_holder(self) -> tuple[str, float]:
        holder = wait_for(
            lambda: self.holder() if self.holder() in self.operators else None,
            timeout_seconds=120,
            interval_seconds=POLL_SECONDS,
            describe="a first holder of the Lease",
        )
        return str(holder), time.monotonic()

    def stop_all(self) -> None:
        for operator in self.operators.values():
            operator.stop()
        self.operators.clear()


def stop_leader(candidates: Candidates, stop: Stop) -> float:
    """SIGTERM the leader (twice for a stop during shutdown) and watch the process and the Lease until
    it has exited and another operator holds the Lease; when that one took it (monotonic)."""
    operator = candidates.operators.pop(stop.identity)
    process = operator.process
    assert process is not None
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    second = stop.moment.second_signal_seconds
    taken_at = signalled
    while time.monotonic() - signalled < STOP_BOUND_SECONDS:
        now = time.monotonic()
        if second is not None and now - signalled >= second:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                stop.second_signal_sent = True
            second = None
        if stop.exit_seconds is None and process.poll() is not None:
            stop.exit_code, stop.exit_seconds = process.returncode, now - signalled
            stop.holder_at_exit = candidates.holder()
        holder = candidates.holder()
        if stop.takeover_seconds is None and holder not in ("", stop.identity):
            stop.next_holder, stop.takeover_seconds, taken_at = holder, now - signalled, now
        if stop.exit_seconds is not None and stop.takeover_seconds is not None:
            break
        time.sleep(POLL_SECONDS)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)
    log = operator.log_path.read_text(errors="replace")
    stop.tracebacks = log.count("Traceback")
    if stop.tracebacks:
        last = log[log.rindex("Traceback") :].replace("\\n", "\n").splitlines()
        stop.last_error = next((line.strip() for line in reversed(last) if "Error" in line), "")[:160]
    return taken_at


def run_stops(candidates: Candidates, moments: list[Moment]) -> list[Stop]:
    leader, took_at = candidates.first_holder()
    stops = []
    for index, moment in enumerate(moments, start=1):
        candidates.top_up(leader)
        time.sleep(max(0.0, took_at + moment.after_takeover_seconds - time.monotonic()))
        stop = Stop(index, leader, moment)
        took_at = stop_leader(candidates, stop)
        print(stop.line(len(moments)), flush=True)
        stops.append(stop)
        if not stop.next_holder:
            break  # nobody took over within the bound: the rest would measure nothing
        leader = stop.next_holder
    return stops


def summary(stops: list[Stop], seed: int) -> str:
    released = sum(1 for stop in stops if stop.released)
    takeovers = [stop.takeover_seconds for stop in stops if stop.takeover_seconds is not None]
    exits = [stop.exit_seconds for stop in stops if stop.exit_seconds is not None]
    by_kind = ", ".join(
        f"{kind} {sum(1 for s in stops if s.moment.kind == kind and s.released)}/"
        f"{sum(1 for s in stops if s.moment.kind == kind)}"
        for kind in KINDS
    )
    lines = [
        f"released {released} of {len(stops)} (seed {seed}; by moment: {by_kind})",
        f"exit status 0: {sum(1 for stop in stops if stop.exit_code == 0)} of {len(stops)}; a second "
        f"SIGTERM during the shutdown: {sum(1 for stop in stops if stop.second_signal_sent)}; "
        f"tracebacks in the stopped operators' logs: {sum(stop.tracebacks for stop in stops)}",
    ]
    if takeovers and exits:
        lines.append(
            f"takeover after the SIGTERM: median {statistics.median(takeovers):.1f} s, "
            f"max {max(takeovers):.1f} s (lease {TIMING.lease_duration_seconds} s, renew deadline "
            f"{TIMING.renew_deadline_seconds:g} s, retry {TIMING.retry_period_seconds:g} s); "
            f"exit after the SIGTERM: median {statistics.median(exits):.1f} s, max {max(exits):.1f} s"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def serving_model_groups(cluster: LocalCluster, count: int) -> Iterator[None]:
    """`count` ModelGroups bound to an SLOPolicy in their namespace, their leaders and health agent
    stood in for (an operator makes them Ready)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelgroups.goodput.dev")
    wait_for(  # an earlier run's namespace, still being deleted, refuses new objects
        lambda: cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}") is None,
        timeout_seconds=120,
        describe=f"namespace {NAMESPACE} of an earlier run to be gone",
    )
    with (
        tempfile.TemporaryDirectory() as scratch,
        fleet_leaders(cluster, Path(scratch) / "load.json"),
        fleet_agent(cluster),
    ):
        apply_documents(cluster, fleet_documents([NAMESPACE], count, interval_seconds=5, max_replicas=2))
        yield


def clean_up(cluster: LocalCluster, candidates: Candidates) -> None:
    """The ModelGroups deleted while an operator still runs (it removes their finalizers), then every
    operator stopped and the namespace deleted."""
    if candidates.operators:
        cluster.kubectl(
            "delete", "modelgroups,slopolicies", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=90s",
            check=False, timeout_seconds=120,
        )  # fmt: skip
    candidates.stop_all()
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def ready_model_groups(cluster: LocalCluster) -> int:
    listing = cluster.api.get(f"{API}/namespaces/{NAMESPACE}/modelgroups")
    return sum(
        1 for item in (listing or {}).get("items", []) if (item.get("status") or {}).get("readyGroups")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stops", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model-groups", type=int, default=4)
    parser.add_argument(
        "--cluster", type=Path, help="state dir of a running `goodput cluster up` (else a new one)"
    )
    parser.add_argument("--operator-source", type=Path, help="run the operators from this tree instead")
    args = parser.parse_args()
    started = time.monotonic()
    with (
        local_cluster(args.cluster) as cluster,
        tempfile.TemporaryDirectory() as logs,
        serving_model_groups(cluster, args.model_groups),
    ):
        candidates = Candidates(cluster, Path(logs), args.operator_source)
        try:
            for _ in range(1 + FOLLOWERS):
                candidates.start_one()
            wait_for(
                lambda: ready_model_groups(cluster) == args.model_groups,
                timeout_seconds=300,
                interval_seconds=2.0,
                describe="every ModelGroup Ready",
            )
            stops = run_stops(candidates, draw_moments(args.seed, args.stops))
        finally:
            clean_up(cluster, candidates)
    print(summary(stops, args.seed))
    print(f"run time {time.monotonic() - started:.0f} s (this machine: 2 cores shared with the cluster)")
    return 0 if stops and all(stop.released for stop in stops) else 1


if __name__ == "__main__":
    sys.exit(main())
