"""The autoscaler in the operator: per ModelGroup with a bound SLOPolicy, observe → decide → act → record.

A kopf daemon runs one loop per ModelGroup whose `policyRef` or `shadowPolicyRef` is set, at the
active policy's `autoscaling.intervalSeconds`. Each tick (`Autoscaler.tick`):

1. takes the ModelGroup as the watch last delivered it (kopf's body: the count, the groups and the
   last records; with the autoscaler's own last status write laid over it until the watch shows
   it, `with_own_status`), and the SLOPolicies from an index; compiles them
   (`controllers.compile.scaling`; the capacity profile is rebuilt only when its inputs change);
2. reads the engine metrics of the ready groups from Prometheus (`metrics_source`), in one query
   shared with every ModelGroup ticking at the same moment (`metrics_batch`: ticks are aligned to
   the interval, so an interval costs one query per query shape, not one per ModelGroup). A
   Prometheus that is down or slow sets MetricsAvailable=False (reason MetricsQueryFailed) and
   raises `kopf.TemporaryError(delay=interval)`: no decision, so never a scale-in on what is not seen;
3. decides with `controllers.autoscale.decide`, for the active policy and, beside it, the shadow one;
4. acts through the scale subresource (`PATCH .../modelgroups/NAME/scale`, conditional on the
   resourceVersion it decided on: a `kubectl scale` in between wins, and the next tick decides
   again; when only a status or metadata write came in between, the same generation, the tick
   reads the object once and decides again at once on it). Only Active decisions act; Advisory
   ones and the shadow policy's are recorded; Frozen makes no decision at all;
5. records: one JSON log line per decision in the design note's §38 shape and the operator's
   Prometheus metrics, as soon as it is decided and applied; then `status.lastDecision`, the
   bounded history `status.decisions`, `status.shadowDecision`,
   `status.feasibility` (per class: the prompt length past which its TTFT is unreachable, the share
   of prompts past it, attainment against offered and attainable requests) and the conditions
   ScalingActive, MetricsAvailable, DecisionLimited and SLOAttainable: one server-side apply of the
   autoscaler's own part of the status (`ownership.AUTOSCALER_STATUS`, field manager
   `goodput-autoscaler`), only when it changed (the same decision made again is rewritten only
   when its record is old, `repeats_recent_decision`, at a point between half and all of
   `state_refresh_seconds` fixed per ModelGroup, `staggered_refresh_seconds`); Events on
   transitions.

At fleet size (hundreds of ModelGroups on one interval) a tick costs no read of the API server
(beyond one GET every five minutes of the ConfigMap a `profile.modelConfigRef` names,
`model_config_source`) and, at rest, no write; its Kubernetes calls run on executors of its own,
bounded (`ACT_CONCURRENCY` threads for the scale writes and reads, which decide when a decision is applied,
`RECORD_CONCURRENCY` for the status applies, which only record it, so a scale never waits behind
the fleet's records), and its Prometheus query on another, so none waits behind the group
controller's writes on asyncio's default executor; and the next tick is due at the boundary
after the last one began (`TickOutcome.started`), so a slow tick is not followed by a skipped
interval. Measured with `bench/bench_operator_fleet.py` and `bench/bench_operator_idle.py`.

The decision state (recent recommendations and scale events) is kept in memory and in
`status.autoscalerState`, so an operator restart keeps its stabilisation windows and step limits
(`controllers.autoscale.record.encode_states`). The user's object is never annotated: an older operator's
annotation `goodput.dev/autoscaler-state` is read once, when no status state exists yet.

Wiring: `autoscaler_daemon.register_autoscaler(registry, AutoscalerSettings.from_settings(settings))`
next to `handlers.register(registry, settings)`; it reads the kopf memo's `runtime` (the Kubernetes
client, the metrics registry, the Event poster). Beside this loop: `autoscaler_record` (the tick's
plan and decisions, and the status record made of them), `autoscaler_metrics` (its Prometheus
series) and `autoscaler_daemon` (its kopf daemon and index).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import kopf

from goodput.api.base import GROUP, VERSION, wire_dict
from goodput.api.labels import ANNOTATION_LAST_RESCALE, SERVING_POOL
from goodput.api.modelgroup import ModelGroup, ModelGroupStatus, PolicyRef, ScalingDecision
from goodput.api.reasons import Reason
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.capacity_learner import (
    LearnerState,
    PriorCapacity,
    capacity_evidence,
    capacity_identity,
    estimate,
    learns,
    observe,
    with_capacity,
)
from goodput.controllers.autoscale.feasible_demand import snapshot_attainability
from goodput.controllers.autoscale.forecast import WorkForecaster
from goodput.controllers.autoscale.model import Decision, DecisionState, Mode, ModelGroupSnapshot
from goodput.controllers.autoscale.record import (
    ForecastHealth,
    decode_states,
    encode_states,
    failed_rescale_event,
    failure_conditions,
    failure_event,
    metrics_health,
    persist_due,
    record_rescale,
    rescale_note,
    rescale_recorded_event,
    unrecorded_rescale,
)
from goodput.controllers.compile.scaling import (
    DEFAULT_RATE_WINDOW_SECONDS,
    CompiledPolicy,
    capacity_profile,
    compile_policy,
    profile_key,
)
from goodput.controllers.compile.slo_policy import parse_slo_policy
from goodput.controllers.events import EventRecord
from goodput.controllers.groups.template import parse_model_group
from goodput.controllers.hardware import ReadConfig
from goodput.controllers.ownership import AUTOSCALER_STATUS
from goodput.controllers.pools import PoolKey
from goodput.estimators.capacity import CapacityProfile
from goodput.operator.autoscaler_forecast import (
    ForecastMemory,
    HistorySource,
    read_and_fit,
    ready_time_unknown,
    refresh,
)
from goodput.operator.autoscaler_metrics import AutoscalerMetrics
from goodput.operator.autoscaler_record import (
    Decided,
    TickPlan,
    Unusable,
    recorded_status,
    repeats_recent_decision,
    staggered_refresh_seconds,
    tick_events,
    with_own_status,
)
from goodput.operator.kube import KubeError
from goodput.operator.metrics_batch import next_tick_delay_seconds
from goodput.operator.metrics_source import (
    MetricsReading,
    MetricsUnavailableError,
    PrometheusConnection,
    build_snapshot,
    query_windows,
)
from goodput.operator.model_config_source import ModelConfigReader
from goodput.operator.promql import SeriesLabels, Windows
from goodput.operator.settings import Settings

log = logging.getLogger("goodput.autoscaler")
decision_log = logging.getLogger("goodput.autoscaler.decisions")

# Where operators before `status.autoscalerState` kept the decision state; read, never written.
STATE_ANNOTATION = f"{GROUP}/autoscaler-state"
# A tick that lost a race with another writer runs again this soon.
CONFLICT_RETRY_SECONDS = 1.0
# The autoscaler's Kubernetes calls run on threads of its own: the scale writes and the reads on two,
# the status applies (the record, which can wait) on two more. asyncio's
# default executor (min(32, cores + 4) threads: 6 on two cores) is the group controller's; sharing it,
# the autoscaler's writes queued behind pod creations and gate patches, and at fleet size most
# ModelGroups were not decided within their interval. Beside the default executor this stays within
# the Kubernetes client's connection pool (5 per core), so no request opens a connection of its own.
ACT_CONCURRENCY = 2
RECORD_CONCURRENCY = 2
# How long a status this autoscaler applied may go unseen on the watched object before the watched
# one is trusted again (someone else rewrote those fields, or the write was lost).
STATUS_ECHO_TIMEOUT_SECONDS = 30.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class AutoscalerSettings:
    """The autoscaler's part of the operator's settings (`operator/settings.py`)."""

    prometheus_url: str = "http://127.0.0.1:9090"
    prometheus_timeout_seconds: float = 5.0
    """A query slower than this counts as Prometheus being down."""
    prometheus_connection: PrometheusConnection = field(default_factory=PrometheusConnection)
    """Bearer token file, CA bundle and extra headers of every query."""
    rate_window_seconds: float = DEFAULT_RATE_WINDOW_SECONDS
    """Window of token rates and the request mix; at least two scrape intervals."""
    prometheus_batch_seconds: float = 0.5
    """How long the reads of ModelGroups ticking together are gathered into one query; 0: none."""
    state_refresh_seconds: float = 60.0
    """Longest the persisted decision state may lag while nothing in it changes."""
    unbound_interval_seconds: float = 15.0
    """Ticks while the bound policy cannot be used (not found, not accepted)."""
    labels: SeriesLabels = field(default_factory=SeriesLabels)

    @classmethod
    def from_settings(cls, settings: Settings) -> AutoscalerSettings:
        """The autoscaler's part of the operator's settings (GOODPUT_PROMETHEUS_*, flags)."""
        for name in (
            "prometheus_timeout_seconds",
            "prometheus_rate_window_seconds",
            "autoscaler_state_refresh_seconds",
        ):
            if getattr(settings, name) <= 0:
                raise ValueError(f"GOODPUT_{name.upper()}={getattr(settings, name)!r} must be positive")
        if settings.prometheus_batch_seconds < 0:
            raise ValueError(
                f"GOODPUT_PROMETHEUS_BATCH_SECONDS={settings.prometheus_batch_seconds!r} must not be negative"
            )
        return cls(
            prometheus_url=settings.prometheus_url.rstrip("/"),
            prometheus_timeout_seconds=settings.prometheus_timeout_seconds,
            prometheus_connection=PrometheusConnection.from_settings(
                bearer_token_file=settings.prometheus_bearer_token_file,
                ca_file=settings.prometheus_ca_file,
                headers_json=settings.prometheus_headers,
            ),
            rate_window_seconds=settings.prometheus_rate_window_seconds,
            prometheus_batch_seconds=settings.prometheus_batch_seconds,
            state_refresh_seconds=settings.autoscaler_state_refresh_seconds,
            labels=SeriesLabels(
                namespace=settings.prometheus_label_namespace,
                model_group=settings.prometheus_label_model_group,
                group=settings.prometheus_label_group,
            ),
        )


class MetricsSource(Protocol):
    """One ModelGroup's reading (`metrics_batch.BatchedMetricsSource`); raises MetricsUnavailableError."""

    async def read(self, namespace: str, model_group: str, windows: Windows) -> MetricsReading: ...


class KubeCalls(Protocol):
    """The verbs of `kube.KubeApi` the autoscaler uses."""

    def request(self, verb: str, resource: str, path: str, body: Any = None, **kwargs: Any) -> Any: ...

    def patch_custom(
        self,
        plural: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> Any: ...

    def apply_custom_status(
        self, plural: str, namespace: str, name: str, body: Mapping[str, Any], *, field_manager: str
    ) -> Any: ...


@dataclass
class Memory:
    """What the autoscaler remembers about one pool of a ModelGroup between ticks (and daemon
    restarts): its decision states, capacity learner and forecaster are the pool's alone."""

    active: DecisionState = field(default_factory=DecisionState.initial)
    shadow: DecisionState = field(default_factory=DecisionState.initial)
    shadow_policy: str | None = None
    loaded: bool = False
    state_text: str | None = None
    state_written_at: float | None = None
    profiles: dict[str, CapacityProfile] = field(default_factory=dict)
    capacity: LearnerState = field(default_factory=LearnerState)
    """The capacity learner's state for the active policy: in memory only, so a restart decides on
    the prior (or the measured figure) until the engines show evidence again."""
    written_status: dict[str, Any] | None = None
    """The autoscaler's part of the status it last applied (wire form), until the watch shows it."""
    written_at: float = 0.0
    written_version: int | None = None
    """The resourceVersion the API server gave that write, when it is a number."""
    forecast: ForecastMemory = field(default_factory=ForecastMemory)
    """The forecaster of `spec.forecast` and the health of its last history read (in memory only:
    a restart reads the history again)."""
    pool: str = SERVING_POOL
    """The pool this memory decides for: its snapshot and decision records are that pool's."""


@dataclass(frozen=True, slots=True)
class TickOutcome:
    """What one tick decided (None: no decision) and when the next one is due: `interval_seconds`
    from now, or when `aligned`, at the next multiple of it (`metrics_batch.next_tick_delay_seconds`),
    where the other ModelGroups with that interval tick too and share its Prometheus query."""

    interval_seconds: float
    active: Decision | None = None
    shadow: Decision | None = None
    aligned: bool = True
    started: float | None = None
    """When the tick began: the next one is due at the boundary after it, however long it took."""
    conflict: bool = False
    """The scale write lost to another writer of the ModelGroup: nothing was written."""

    def delay_seconds(self, now: float) -> float:
        if not self.aligned:
            return self.interval_seconds
        return next_tick_delay_seconds(self.interval_seconds, now, started=self.started)


PolicyIndex = Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]
PostEvents = Callable[[Sequence[EventRecord]], None]


class Autoscaler:
    """The autoscaler of every bound ModelGroup of one operator process."""

    def __init__(
        self,
        kube: KubeCalls,
        source: MetricsSource,
        metrics: AutoscalerMetrics,
        settings: AutoscalerSettings,
        *,
        clock: Callable[[], float] = time.time,
        executor: Executor | None = None,
        record_executor: Executor | None = None,
        history: HistorySource | None = None,
        history_executor: Executor | None = None,
    ) -> None:
        """`executor` runs the blocking Kubernetes calls that act (the scale writes) and read;
        `record_executor` the status applies (None: `executor`; both None: asyncio's default);
        `history` answers the forecast's range queries on `history_executor` (None: no forecast)."""
        self.kube = kube
        self.source = source
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self.executor = executor
        self.record_executor = record_executor or executor
        self.history = history
        self.history_executor = history_executor
        self.memories: dict[PoolKey, Memory] = {}
        """Per pool: a ModelGroup without roles is one pool (`serving`), so one memory."""
        self.model_configs = ModelConfigReader(
            lambda path: self._call(self.kube.request, "GET", "configmaps", path), clock=clock
        )

    async def _call(
        self, function: Callable[..., _T], *args: Any, executor: Executor | None = None, **kwargs: Any
    ) -> _T:
        """A blocking Kubernetes call on `executor` (default: the autoscaler's acting one)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            executor or self.executor, functools.partial(function, *args, **kwargs)
        )

    def forget(self, namespace: str, name: str) -> None:
        """Drop every pool's memory of a ModelGroup that is gone or no longer autoscaled."""
        for key in [key for key in self.memories if (key.namespace, key.model_group) == (namespace, name)]:
            del self.memories[key]
        self.metrics.forget(namespace, name)

    async def tick(
        self,
        namespace: str,
        name: str,
        policies: PolicyIndex,
        post_events: PostEvents,
        watched: Mapping[str, Any] | None = None,
    ) -> TickOutcome:
        """One decision for one ModelGroup; see the module docstring. Raises kopf.TemporaryError
        when Prometheus or the scale write fails.

        `watched`: the ModelGroup as the watch last delivered it (kopf's body), read instead of a
        GET; None reads it from the API server."""
        started = time.perf_counter()
        now = self.clock()
        obj = await self._current(namespace, name, watched, now)
        if obj is None:
            return TickOutcome(self.settings.unbound_interval_seconds)
        readings: dict[Windows, MetricsReading] = {}
        outcome = await self._tick(obj, policies, post_events, now=now, started=started, readings=readings)
        if outcome.conflict and watched is not None:
            # The watched copy was behind. Only if the spec is still the one decided on (someone
            # else's status or metadata write, not a count of theirs) decide again at once on a
            # fresh read, with this tick's metrics.
            fresh = await self._get(namespace, name)
            if fresh is not None and _generation(fresh) == _generation(obj):
                outcome = await self._tick(
                    fresh, policies, post_events, now=now, started=started, readings=readings
                )
        return outcome

    async def _current(
        self, namespace: str, name: str, watched: Mapping[str, Any] | None, now: float
    ) -> dict[str, Any] | None:
        """The ModelGroup to decide on: the watched one, with the status this autoscaler applied and
        the watch has not shown yet (`with_own_status`), or else a fresh read.

        Whether the watch shows the last write is told by resourceVersion when both are numbers (the
        API server's are: etcd revisions), so a watch running minutes behind under load never
        brings back an older record; otherwise by the written part appearing, for at most
        `STATUS_ECHO_TIMEOUT_SECONDS`."""
        if watched is None:
            return await self._get(namespace, name)
        obj = {key: watched.get(key) for key in ("apiVersion", "kind", "metadata", "spec", "status")}
        memory = self.memories.get(PoolKey(namespace, name))
        if memory is None or memory.written_status is None:
            return obj
        watched_version = _version(obj)
        if watched_version is not None and memory.written_version is not None:
            if watched_version >= memory.written_version:
                memory.written_status = None
                return obj
            return {**obj, "status": with_own_status(obj.get("status") or {}, memory.written_status)[0]}
        if now - memory.written_at > STATUS_ECHO_TIMEOUT_SECONDS:
            memory.written_status = None
            return obj
        status, echoed = with_own_status(obj.get("status") or {}, memory.written_status)
        if echoed:
            memory.written_status = None
        return {**obj, "status": status}

    async def _tick(
        self,
        obj: dict[str, Any],
        policies: PolicyIndex,
        post_events: PostEvents,
        *,
        now: float,
        started: float,
        readings: dict[Windows, MetricsReading],
    ) -> TickOutcome:
        """The tick on `obj`; `readings` holds the metrics read so far this tick (filled here)."""
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        memory = self._memory(PoolKey(namespace, name), obj, now)
        status = ModelGroupStatus.model_validate(obj.get("status") or {})
        rescale = unrecorded_rescale(_annotations(obj).get(ANNOTATION_LAST_RESCALE), status)
        if rescale is not None:
            obj, status = await self._record_rescale(obj, status, rescale, post_events, memory)
        parsed = parse_model_group({key: obj.get(key) for key in ("apiVersion", "kind", "metadata", "spec")})
        if isinstance(parsed, str):
            await self._fail(obj, status, Unusable(Reason.INVALID_SPEC, parsed), post_events, memory)
            return TickOutcome(self.settings.unbound_interval_seconds, started=now)
        referenced = await self.model_configs.read(namespace, parsed.spec)
        plan = self._plan(parsed, policies, memory, referenced)
        if plan.active is None and plan.shadow is None:
            if plan.stopped is not None:
                await self._fail(obj, status, plan.stopped, post_events, memory)
            else:
                await self._write_status(obj, lambda previous: previous, memory=memory)
            return TickOutcome(plan.interval_seconds, started=now)
        await self._observe(obj, status, plan, post_events, memory, readings=readings)
        decided = self._decide(parsed, status, plan, readings, memory=memory, now=now)
        active = decided.active
        if (
            active is not None
            and active.changes
            and not await self._scale(obj, active, post_events, plan.interval_seconds)
        ):
            # Someone else wrote the ModelGroup after it was read: decide again soon, on what they wrote.
            return TickOutcome(CONFLICT_RETRY_SECONDS, aligned=False, conflict=True)
        if decided.active is not None:
            memory.active = decided.active.next_state
        if decided.shadow is not None:
            memory.shadow = decided.shadow.next_state
        await self._record(obj, status, plan, decided, post_events=post_events, memory=memory, now=now)
        self.metrics.duration.labels("total").observe(time.perf_counter() - started)
        return TickOutcome(plan.interval_seconds, decided.active, decided.shadow, started=now)

    async def _record_rescale(
        self,
        obj: dict[str, Any],
        status: ModelGroupStatus,
        rescale: ScalingDecision,
        post_events: PostEvents,
        memory: Memory,
    ) -> tuple[dict[str, Any], ModelGroupStatus]:
        """Record the rescale an operator applied and could not record before it stopped, with its
        Event; the tick goes on from the status that holds it."""
        recorded = record_rescale(status, rescale)
        await self._write_status(obj, lambda _read: recorded, memory=memory)
        post_events([rescale_recorded_event(rescale)])
        return {**obj, "status": {**(obj.get("status") or {}), **wire_dict(recorded)}}, recorded

    def _plan(
        self, parsed: ModelGroup, policies: PolicyIndex, memory: Memory, referenced: ReadConfig = None
    ) -> TickPlan:
        """Which policies decide this tick, at which interval, and why the active one does not.
        `referenced`: the config.json of `profile.modelConfigRef`, as `model_configs` read it."""
        spec = parsed.spec
        active = self._compiled(
            parsed, spec.policy_ref, policies, memory, shadow=False, referenced=referenced
        )
        shadow = self._compiled(
            parsed, spec.shadow_policy_ref, policies, memory, shadow=True, referenced=referenced
        )
        shadow_name = shadow.policy_name if isinstance(shadow, CompiledPolicy) else None
        if shadow_name != memory.shadow_policy:
            if memory.shadow_policy is not None:
                memory.shadow = DecisionState.initial()  # another shadow policy: a history of its own
            memory.shadow_policy = shadow_name
        interval = next(
            (c.policy.interval_seconds for c in (active, shadow) if isinstance(c, CompiledPolicy)),
            self.settings.unbound_interval_seconds,
        )
        stopped = _why_no_decision(active)
        if stopped is not None and stopped.reason == Reason.MODE_FROZEN:
            # Unfreezing starts from a fresh state, so the first decisions cannot scale in before a
            # full scale-down window has passed (decide's first-sight rule).
            memory.active = DecisionState.initial()
        runs_active = isinstance(active, CompiledPolicy) and stopped is None
        runs_shadow = isinstance(shadow, CompiledPolicy) and shadow.policy.mode is not Mode.FROZEN
        return TickPlan(
            interval_seconds=interval,
            active=active if runs_active and isinstance(active, CompiledPolicy) else None,
            shadow=shadow if runs_shadow and isinstance(shadow, CompiledPolicy) else None,
            stopped=stopped,
            shadow_bound=spec.shadow_policy_ref is not None,
        )

    async def _observe(
        self,
        obj: Mapping[str, Any],
        status: ModelGroupStatus,
        plan: TickPlan,
        post_events: PostEvents,
        memory: Memory,
        *,
        readings: dict[Windows, MetricsReading],
    ) -> None:
        """The metrics of every policy that decides, into `readings` (those already there are not
        read again); without them, no decision (and the windows of stabilisation start again)."""
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata["name"])
        started = time.perf_counter()
        try:
            await self._read_metrics(namespace, name, plan.deciding, readings)
        except MetricsUnavailableError as error:
            self.metrics.metrics_failures.labels(namespace, name).inc()
            replicas = (obj.get("spec") or {}).get("replicas")
            message = f"{error}; holding at {replicas} group(s)"
            log.warning("metrics unavailable: %s", error, extra={"namespace": namespace, "model_group": name})
            # A blind spot restarts the stabilisation windows: once the metrics are back, the count
            # goes down only after a full scale-down window of seeing them (step limits still count).
            memory.active = _blind(memory.active)
            memory.shadow = _blind(memory.shadow)
            unusable = Unusable(Reason.METRICS_QUERY_FAILED, message)
            await self._fail(obj, status, unusable, post_events, memory)
            raise kopf.TemporaryError(message, delay=plan.interval_seconds) from error
        self.metrics.duration.labels("metrics").observe(time.perf_counter() - started)

    def _decide(
        self,
        parsed: ModelGroup,
        status: ModelGroupStatus,
        plan: TickPlan,
        readings: Mapping[Windows, MetricsReading],
        *,
        memory: Memory,
        now: float,
    ) -> Decided:
        """The pure decisions of the active and the shadow policy, on their snapshots."""
        namespace, name = parsed.metadata.namespace or "", parsed.metadata.name or ""
        decided = Decided()
        if plan.active is not None:
            reading = readings[self._windows(plan.active)]
            learning = _capacity_learning(parsed, plan.active)
            capacity = estimate(memory.capacity, learning.prior, now)
            compiled = dataclasses.replace(plan.active, profile=with_capacity(plan.active.profile, capacity))
            snapshot = self._ahead(
                parsed,
                build_snapshot(
                    parsed,
                    status,
                    compiled,
                    reading.groups,
                    now=now,
                    gateway=reading.gateway,
                    pool=memory.pool,
                ),
                memory,
                now,
            )
            snapshot = dataclasses.replace(snapshot, capacity=capacity)
            started = time.perf_counter()
            active = decide(snapshot, plan.active.policy, memory.active, now)
            self.metrics.duration.labels("decide").observe(time.perf_counter() - started)
            if learning.prior.learn:
                evidence = capacity_evidence(active, plan.active.profile, learning.identity)
                if evidence is not None:
                    memory.capacity = observe(memory.capacity, evidence, now)
            decided = Decided(
                capacity=capacity,
                active=active,
                health=metrics_health(snapshot, plan.active.policy.staleness.max_age_seconds),
                verdict=snapshot_attainability(
                    snapshot, plan.active.policy, tensor_parallel=parsed.spec.parallelism.tensor
                ),
                forecast=memory.forecast.health if parsed.spec.forecast is not None else None,
                forecast_asked=parsed.spec.forecast is not None,
            )
            ages = [group.metrics.age_seconds for group in snapshot.groups if group.metrics is not None]
            self.metrics.record_age(namespace, name, max(ages) if ages else None)
        if plan.shadow is not None:
            reading = readings[self._windows(plan.shadow)]
            snapshot = self._ahead(
                parsed,
                build_snapshot(
                    parsed,
                    status,
                    plan.shadow,
                    reading.groups,
                    now=now,
                    gateway=reading.gateway,
                    pool=memory.pool,
                ),
                memory,
                now,
            )
            decided = dataclasses.replace(
                decided, shadow=decide(snapshot, plan.shadow.policy, memory.shadow, now)
            )
        return decided

    def _ahead(
        self, parsed: ModelGroup, snapshot: ModelGroupSnapshot, memory: Memory, now: float
    ) -> ModelGroupSnapshot:
        """The snapshot with the scheduled floors and the forecaster of `spec.forecast` (whatever the
        last history read left: a read due now starts in the background and serves later ticks)."""
        spec = parsed.spec
        forecaster = None
        if spec.forecast is not None:
            self._read_history_if_due(parsed, snapshot.group_ready_seconds, memory.forecast, now)
            forecaster = memory.forecast.usable(now)
        return dataclasses.replace(snapshot, replica_schedule=spec.replica_schedule, forecaster=forecaster)

    def _read_history_if_due(
        self, parsed: ModelGroup, horizon_seconds: float | None, memory: ForecastMemory, now: float
    ) -> None:
        forecast, history = parsed.spec.forecast, self.history
        if forecast is None or history is None or not memory.due(now):
            return
        if horizon_seconds is None:
            memory.health, memory.forecaster = ready_time_unknown(), None
            return
        namespace, name = parsed.metadata.namespace or "", parsed.metadata.name or ""
        read = functools.partial(
            read_and_fit,
            history,
            namespace,
            name,
            horizon_seconds=horizon_seconds,
            forecast=forecast,
            now=now,
        )

        async def offload(
            blocking: Callable[[], WorkForecaster | ForecastHealth],
        ) -> WorkForecaster | ForecastHealth:
            return await self._call(blocking, executor=self.history_executor)

        where = {"namespace": namespace, "model_group": name}
        memory.reading = asyncio.get_running_loop().create_task(
            refresh(memory, read, offload, now=now, where=where)
        )

    async def _record(
        self,
        obj: Mapping[str, Any],
        status: ModelGroupStatus,
        plan: TickPlan,
        decided: Decided,
        *,
        post_events: PostEvents,
        memory: Memory,
        now: float,
    ) -> None:
        """The §38 log lines and the operator's metrics of this tick's decisions, then its status and
        Events. The log line comes first: it says when the decision was made (and applied), while the
        status write may wait its turn behind the rest of the fleet's."""
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata["name"])
        for decision, policy, role in (
            (decided.active, plan.active, "active"),
            (decided.shadow, plan.shadow, "shadow"),
        ):
            if decision is not None and policy is not None:
                self._log(namespace, decision, shadow=role == "shadow")
                self.metrics.record(namespace, name, decision, policy=role, slo_policy=policy.policy_name)
        recorded = functools.partial(
            recorded_status,
            decided=decided,
            stopped=plan.stopped,
            generation=int(metadata.get("generation") or 0),
            when=datetime.fromtimestamp(now, UTC),
        )
        await self._write_status(obj, recorded, memory=memory, clear_shadow=not plan.shadow_bound)
        post_events(tick_events(status, plan, decided))

    def _memory(self, key: PoolKey, obj: Mapping[str, Any], now: float) -> Memory:
        """The pool's memory; on first sight, the decision states its ModelGroup's status saved (or,
        for an object an older operator wrote, its annotation did)."""
        memory = self.memories.setdefault(key, Memory(pool=key.pool))
        if not memory.loaded:
            text = (obj.get("status") or {}).get("autoscalerState")
            if not text:
                text = ((obj.get("metadata") or {}).get("annotations") or {}).get(STATE_ANNOTATION)
            persisted = decode_states(text, now=now, refresh_seconds=self.settings.state_refresh_seconds)
            memory.active, memory.shadow = persisted.active, persisted.shadow
            memory.state_text, memory.state_written_at = text, persisted.written_at
            memory.loaded = True
        return memory

    def _windows(self, compiled: CompiledPolicy) -> Windows:
        return query_windows(compiled, self.settings.rate_window_seconds)

    async def _scale(
        self, obj: Mapping[str, Any], decision: Decision, post_events: PostEvents, interval: float
    ) -> bool:
        """Write the decided count, conditional on the resourceVersion the decision read, with the
        decision's record in the same patch (`ANNOTATION_LAST_RESCALE`): the status write comes
        after, and an operator stopped in between leaves the next one what to record. False when
        someone else wrote the ModelGroup in between."""
        metadata = obj.get("metadata") or {}
        patch = {
            "metadata": {
                "resourceVersion": str(metadata.get("resourceVersion") or ""),
                "annotations": {ANNOTATION_LAST_RESCALE: rescale_note(decision)},
            },
            "spec": {"replicas": decision.desired_groups},
        }
        try:
            await self._call(
                self.kube.patch_custom,
                "modelgroups",
                str(metadata.get("namespace") or ""),
                str(metadata["name"]),
                patch,
            )
        except KubeError as error:
            if error.status == 409:
                return False
            post_events([failed_rescale_event(decision, str(error))])
            raise kopf.TemporaryError(
                f"scaling to {decision.desired_groups} group(s) failed: {error}", delay=interval
            ) from error
        return True

    # --- policies -------------------------------------------------------------------------------

    def _compiled(
        self,
        model_group: ModelGroup,
        ref: PolicyRef | None,
        policies: PolicyIndex,
        memory: Memory,
        *,
        shadow: bool,
        referenced: ReadConfig = None,
    ) -> CompiledPolicy | Unusable | None:
        if ref is None:
            return None
        namespace = model_group.metadata.namespace or ""
        body = next(iter(policies.get((namespace, ref.name), ())), None)
        which = "shadowPolicyRef" if shadow else "policyRef"
        if body is None:
            return Unusable(
                Reason.POLICY_NOT_FOUND, f"SLOPolicy {ref.name} ({which}) not found in {namespace}"
            )
        policy = parse_slo_policy(body)
        if isinstance(policy, str):
            return Unusable(Reason.POLICY_NOT_ACCEPTED, f"SLOPolicy {ref.name} ({which}): {policy}")
        key = profile_key(model_group.spec, policy.spec, referenced=referenced)
        profile = memory.profiles.get(key)
        if profile is None:
            built = capacity_profile(model_group.spec, policy.spec, referenced=referenced)
            if isinstance(built, str):
                return Unusable(Reason.INVALID_SPEC, built)
            profile = built
            # Two profiles at most: the active and the shadow policy's.
            memory.profiles = {**dict(list(memory.profiles.items())[-1:]), key: profile}
        compiled = compile_policy(model_group, policy, shadow=shadow, profile=profile)
        if isinstance(compiled, str):
            return Unusable(Reason.POLICY_NOT_ACCEPTED, f"SLOPolicy {ref.name} ({which}): {compiled}")
        return compiled

    # --- reading and writing --------------------------------------------------------------------

    async def _read_metrics(
        self,
        namespace: str,
        name: str,
        compiled: Sequence[CompiledPolicy],
        readings: dict[Windows, MetricsReading],
    ) -> None:
        for policy in compiled:
            windows = self._windows(policy)
            if windows not in readings:
                readings[windows] = await self.source.read(namespace, name, windows)

    def _path(self, namespace: str, name: str) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modelgroups/{name}"

    async def _get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = await self._call(self.kube.request, "GET", "modelgroups", self._path(namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise kopf.TemporaryError(
                f"reading ModelGroup {namespace}/{name} failed: {error}", delay=5
            ) from error
        return dict(found) if found else None

    async def _write_status(
        self,
        obj: Mapping[str, Any],
        recorded: Callable[[ModelGroupStatus], ModelGroupStatus],
        *,
        memory: Memory | None,
        clear_shadow: bool = False,
    ) -> None:
        """Apply the autoscaler's part of the status, computed whole from the status read, when it
        changed: server-side apply as `goodput-autoscaler`, so the group controller's fields and
        conditions are neither sent nor touched, and no precondition is needed. The decision state
        rides along when it is due (`persist_due`)."""
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata["name"])
        previous = ModelGroupStatus.model_validate(obj.get("status") or {})
        new = recorded(previous)
        if clear_shadow:
            new = new.model_copy(update={"shadow_decision": None})
        now = self.clock()
        refresh_seconds = staggered_refresh_seconds(namespace, name, self.settings.state_refresh_seconds)
        state = self._due_state(memory, now, refresh_seconds) if memory is not None else None
        if state is not None:
            new = new.model_copy(update={"autoscaler_state": state})
        if new == previous or repeats_recent_decision(
            previous, new, now=now, refresh_seconds=refresh_seconds
        ):
            return
        body = AUTOSCALER_STATUS.apply_body(namespace, name, new)
        try:
            answer = await self._call(
                self.kube.apply_custom_status,
                "modelgroups",
                namespace,
                name,
                body,
                field_manager=AUTOSCALER_STATUS.field_manager,
                executor=self.record_executor,
            )
        except KubeError as error:
            raise kopf.TemporaryError(f"status write failed: {error}", delay=5) from error
        if memory is not None:
            memory.written_status, memory.written_at = body["status"], now
            memory.written_version = _version(answer) if isinstance(answer, Mapping) else None
            if state is not None:
                memory.state_text, memory.state_written_at = state, now

    def _due_state(self, memory: Memory, now: float, refresh_seconds: float) -> str | None:
        """The decision state to save with this write, or None when the saved one still holds."""
        text = encode_states(memory.active, memory.shadow if memory.shadow_policy else None, now=now)
        due = persist_due(
            memory.state_text,
            text,
            written_at=memory.state_written_at,
            now=now,
            refresh_seconds=refresh_seconds,
        )
        return text if due else None

    async def _fail(
        self,
        obj: Mapping[str, Any],
        status: ModelGroupStatus,
        unusable: Unusable,
        post_events: PostEvents,
        memory: Memory,
    ) -> None:
        """No decision this tick: say why in the conditions, and once as an Event."""
        metadata = obj.get("metadata") or {}
        now = datetime.fromtimestamp(self.clock(), UTC)

        def recorded(previous: ModelGroupStatus) -> ModelGroupStatus:
            return previous.model_copy(
                update={
                    "conditions": failure_conditions(
                        previous.conditions,
                        reason=unusable.reason,
                        message=unusable.message,
                        generation=int(metadata.get("generation") or 0),
                        now=now,
                    )
                }
            )

        event = failure_event(status.conditions, unusable.reason, unusable.message)
        await self._write_status(obj, recorded, memory=memory)
        if event is not None:
            post_events([event])

    def _log(self, namespace: str, decision: Decision, *, shadow: bool) -> None:
        record = decision.to_record()
        what = "shadow decision" if shadow else "decision"
        change = f"{decision.current_groups} -> {decision.desired_groups}"
        decision_log.info(
            f"{what} {namespace}/{decision.model_group}: {change} "
            f"({decision.reason}, revision {decision.policy_revision})",
            extra={**record, "namespace": namespace, "shadow": shadow},
        )

    async def unbind(self, namespace: str, name: str) -> None:
        """The ModelGroup no longer names a policy: ScalingActive=False (NoPolicy), best effort."""
        obj = await self._get(namespace, name)
        if obj is None:
            return
        message = "no policyRef: spec.replicas is set by hand or by another autoscaler"
        now = datetime.fromtimestamp(self.clock(), UTC)
        generation = int((obj.get("metadata") or {}).get("generation") or 0)

        def recorded(previous: ModelGroupStatus) -> ModelGroupStatus:
            conditions = failure_conditions(
                previous.conditions, reason=Reason.NO_POLICY, message=message, generation=generation, now=now
            )
            return previous.model_copy(update={"conditions": conditions})

        await self._write_status(obj, recorded, memory=None, clear_shadow=True)


@dataclass(frozen=True, slots=True)
class _CapacityLearning:
    prior: PriorCapacity
    identity: str


def _capacity_learning(model_group: ModelGroup, compiled: CompiledPolicy) -> _CapacityLearning:
    """The active profile's capacity as the learner's prior, whether it is learnt, and what it
    belongs to (the prior's inputs and the engine image)."""
    profile = model_group.spec.profile
    measured = profile is not None and profile.capacity_work_seconds_per_second is not None
    learn = learns(measured, profile.learn_capacity if profile is not None else None)
    prior = compiled.profile.reference.work_per_second
    return _CapacityLearning(
        PriorCapacity(prior, measured=measured, learn=learn),
        capacity_identity(prior, model_group.spec.engine.image, profile.gpu if profile is not None else ""),
    )


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _version(obj: Mapping[str, Any]) -> int | None:
    """An object's resourceVersion as a number; None when it is not one (it is opaque by contract)."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def _generation(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def _blind(state: DecisionState) -> DecisionState:
    """The state after ticks that saw nothing: no recommendation to stabilise on (and the first-sight
    rule again); scale events and the goodput signal's trial kept."""
    return dataclasses.replace(state, recommendations=(), started=False)


def _why_no_decision(active: CompiledPolicy | Unusable | None) -> Unusable | None:
    """Why the active policy makes no decision this tick: it cannot be used, or it is Frozen."""
    if isinstance(active, Unusable):
        return active
    if isinstance(active, CompiledPolicy) and active.policy.mode is Mode.FROZEN:
        return Unusable(
            Reason.MODE_FROZEN, f"SLOPolicy {active.policy_name} revision {active.policy.revision} is Frozen"
        )
    return None
