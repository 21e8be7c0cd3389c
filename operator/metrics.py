"""The operator's own Prometheus metrics (base units, `_total` counters, low-cardinality labels),
declared in the style `goodput.controllers.metric_buckets` describes.

One registry per operator process, held in kopf's memo, so tests can build a fresh one and read it
back. ModelGroup-level gauges carry namespace and name labels (as the HPA's desired_replicas does)
and are removed when the ModelGroup goes away.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from goodput.api.modelgroup import GROUP_STATES
from goodput.controllers.groups.model import DrainEnded
from goodput.controllers.groups.ready_phases import ReadyBreakdown, ReadyPhase
from goodput.controllers.metric_buckets import GROUP_LIFECYCLE_BUCKETS_SECONDS, RECONCILE_BUCKETS_SECONDS

DRAIN_OUTCOMES = ("Drained", "TimedOut", "Cancelled")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._declare_reconciles(self.registry)
        self._declare_groups(self.registry)
        self._declare_drains(self.registry)

    def _declare_reconciles(self, r: CollectorRegistry) -> None:
        self.reconciles = Counter(
            "goodput_reconcile_total",
            "Reconcile passes by controller and result.",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "goodput_reconcile_errors_total",
            "Failed reconcile passes by controller and error class (spec or internal).",
            ["controller", "error"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "goodput_reconcile_duration_seconds",
            "Duration of one reconcile pass.",
            ["controller"],
            registry=r,
            buckets=RECONCILE_BUCKETS_SECONDS,
        )
        self.kube_requests = Counter(
            "goodput_kube_requests_total",
            "Kubernetes API writes by verb, resource, code.",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.leader = Gauge(
            "goodput_leader",
            "1 while this replica holds the leader Lease and acts, 0 while it waits as a follower.",
            registry=r,
        )

    def _declare_groups(self, r: CollectorRegistry) -> None:
        self.groups = Gauge(
            "goodput_groups",
            "Replica groups of a ModelGroup by state.",
            ["namespace", "model_group", "state"],
            registry=r,
        )
        self.desired_groups = Gauge(
            "goodput_desired_groups",
            "Replica groups a ModelGroup asks for.",
            ["namespace", "model_group"],
            registry=r,
        )
        self.group_gpus = Gauge(
            "goodput_group_gpus",
            "GPUs requested by a ModelGroup's groups, by group state (integrate for GPU-hours).",
            ["namespace", "model_group", "state"],
            registry=r,
        )
        self.group_ready_seconds = Histogram(
            "goodput_group_ready_seconds",
            "Time for a group to become ready, by phase.",
            ["phase"],
            registry=r,
            buckets=GROUP_LIFECYCLE_BUCKETS_SECONDS,
        )
        self.group_ready_phase_seconds = Histogram(
            "goodput_group_ready_phase_seconds",
            "Time a group spent in each phase of its ready time (Scheduling, ContainerStart, WeightLoad, "
            "RankFormation, WarmUp), observed once when it became ready; a phase whose end was not "
            "recorded is not observed (its time is in the next phase).",
            ["namespace", "model_group", "phase"],
            registry=r,
            buckets=GROUP_LIFECYCLE_BUCKETS_SECONDS,
        )
        self.group_failures = Counter(
            "goodput_group_failures_total", "Groups failed and replaced, by reason.", ["reason"], registry=r
        )
        self.placement_limited = Counter(
            "goodput_placement_limited_total",
            "Reconciles that could not place a wanted group, by reason.",
            ["reason"],
            registry=r,
        )
        self.warmups = Counter(
            "goodput_warmups_total",
            "Warm-up completions sent through group leaders, by result.",
            ["result"],
            registry=r,
        )

    def _declare_drains(self, r: CollectorRegistry) -> None:
        self.drain_duration = Histogram(
            "goodput_drain_duration_seconds",
            "From a group's drain start to the deletion of its ranks, by outcome (Drained or TimedOut).",
            ["namespace", "model_group", "outcome"],
            registry=r,
            buckets=GROUP_LIFECYCLE_BUCKETS_SECONDS,
        )
        self.drains = Counter(
            "goodput_drains_total",
            "Drains by outcome: Drained (leader idle), TimedOut (at drain.maxSeconds) or Cancelled.",
            ["namespace", "model_group", "outcome"],
            registry=r,
        )
        self.drain_requests_finished = Counter(
            "goodput_drain_requests_finished_total",
            "Requests draining groups finished after their admission closed.",
            ["namespace", "model_group"],
            registry=r,
        )
        self.drain_requests_aborted = Counter(
            "goodput_drain_requests_aborted_total",
            "Requests still in flight when a drain timed out and its group was deleted, over the "
            "drains whose count is known (see goodput_drains_unknown_count_total).",
            ["namespace", "model_group"],
            registry=r,
        )
        self.drains_unknown_count = Counter(
            "goodput_drains_unknown_count_total",
            "Drains that ended without a count of the requests they finished or aborted (count: "
            "requests_finished or requests_aborted): the request counters hold none of theirs.",
            ["namespace", "model_group", "count"],
            registry=r,
        )

    def kube_request(self, verb: str, resource: str, code: int) -> None:
        self.kube_requests.labels(verb, resource, str(code)).inc()

    def set_group_counts(
        self, namespace: str, name: str, desired: int, counts: dict[str, int], gpus_per_group: int = 0
    ) -> None:
        self.desired_groups.labels(namespace, name).set(desired)
        for state in GROUP_STATES:
            self.groups.labels(namespace, name, state).set(counts.get(state, 0))
            self.group_gpus.labels(namespace, name, state).set(counts.get(state, 0) * gpus_per_group)

    def drain_ended(self, namespace: str, name: str, ended: DrainEnded) -> None:
        drain = ended.record
        self.drain_duration.labels(namespace, name, drain.outcome).observe(drain.duration_seconds)
        self.drains.labels(namespace, name, drain.outcome).inc()
        # An unknown count is counted as unknown, never added as 0 to the requests counted.
        for count, counter, value in (
            ("requests_finished", self.drain_requests_finished, drain.requests_finished),
            ("requests_aborted", self.drain_requests_aborted, drain.requests_aborted),
        ):
            if value is None:
                self.drains_unknown_count.labels(namespace, name, count).inc()
            else:
                counter.labels(namespace, name).inc(value)

    def ready_phases(self, namespace: str, name: str, phases: ReadyBreakdown) -> None:
        """One group that became ready: each known phase once (an unknown one is never observed as 0)."""
        for phase in phases.phases:
            if phase.seconds is not None:
                self.group_ready_phase_seconds.labels(namespace, name, phase.phase.value).observe(
                    phase.seconds
                )

    def drain_cancelled(self, namespace: str, name: str) -> None:
        self.drains.labels(namespace, name, "Cancelled").inc()

    def forget_model_group(self, namespace: str, name: str) -> None:
        for state in GROUP_STATES:
            for gauge in (self.groups, self.group_gpus):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name, state)
        with contextlib.suppress(KeyError):
            self.desired_groups.remove(namespace, name)
        for outcome in DRAIN_OUTCOMES:
            for family in (self.drain_duration, self.drains):
                with contextlib.suppress(KeyError):
                    family.remove(namespace, name, outcome)
        for phase in ReadyPhase:
            with contextlib.suppress(KeyError):
                self.group_ready_phase_seconds.remove(namespace, name, phase.value)
        for counter in (self.drain_requests_finished, self.drain_requests_aborted):
            with contextlib.suppress(KeyError):
                counter.remove(namespace, name)
        for count in ("requests_finished", "requests_aborted"):
            with contextlib.suppress(KeyError):
                self.drains_unknown_count.remove(namespace, name, count)

    def serve(self, address: str, port: int) -> None:
        """Expose the registry over HTTP from a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)
