"""kopf handlers: parse, call the pure controllers, apply their plans. No decision is made here.

- Indexes keep compact views of the group pods (by ModelGroup), of every GPU claim in the cluster,
  of the nodes, and of the ModelGroups by the SLOPolicy they bind to, so no handler LISTs anything.
- One async daemon per ModelGroup runs its reconcile loop: every `reconcile_interval_seconds`, and
  at once when one of its pods, an EndpointSlice listing them, or the ModelGroup itself changes.
  Each pass builds a `World`, calls `plan_model_group`, applies the plan, and patches the status
  only when it changed. The daemon leaves as soon as kopf asks it to stop.
- One timer per SLOPolicy validates it and lists the ModelGroups bound to it.
- A spec the controller cannot act on is reported by `validate_model_group` (an `InvalidSpec`
  Event, then kopf.PermanentError) and by the daemon's status; nothing is created for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import aiohttp
import kopf
from pydantic import BaseModel, ValidationError

from goodput.api.base import STRATEGIC_MERGE_PATCH, wire_dict
from goodput.api.modelgroup import ModelGroup, ModelGroupStatus
from goodput.api.reasons import EventReason
from goodput.api.slopolicy import SloPolicyStatus
from goodput.api.times import rfc3339_millis, rfc3339_seconds
from goodput.controllers import naming
from goodput.controllers.compile.slo_policy import parse_slo_policy, reconcile_policy
from goodput.controllers.events import EventRecord
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.drain import LeaderReading, LeaderSample, encode_outcome, encode_progress
from goodput.controllers.groups.dynamic_resources import (
    NO_DEVICE_CLASS,
    DeviceClassView,
    DeviceKey,
    DevicePlacement,
    ResourceSliceView,
    allocated_devices,
    class_placement,
    parse_device_class,
    parse_resource_slice,
)
from goodput.controllers.groups.expectations import EXISTS, Expectation, expect, expect_deleted, overlay
from goodput.controllers.groups.model import (
    APPLY_ORDER,
    DrainEnded,
    DrainMark,
    DrainOutcomeMark,
    DrainProgressMark,
    DrainStart,
    GateChange,
    GateRelease,
    GroupCreation,
    GroupDeletion,
    Plan,
    RolloutRules,
    WarmupOutcome,
    WarmupRequest,
    World,
    parse_backoffs,
    parse_rollout,
)
from goodput.controllers.groups.observation import (
    ConditionView,
    NodeView,
    PodView,
    RouteView,
    gpu_claim,
    parse_endpoint_slice,
    parse_node,
    parse_pod,
    pod_accelerator,
)
from goodput.controllers.groups.placement import GpuClaim, Inventory
from goodput.controllers.groups.ready_phases import ReadyPhase
from goodput.controllers.groups.status import (
    invalid_spec_status,
    model_group_status,
    recent_ready_phases,
    with_others_conditions,
)
from goodput.controllers.groups.template import (
    ControllerTuning,
    group_template,
    parse_model_group,
    placement_rules,
    readiness_rules,
    spec_problems,
)
from goodput.controllers.ownership import GROUP_STATUS, POLICY_STATUS
from goodput.controllers.pools import PoolSpec, model_group_pools
from goodput.controllers.requests.degrade import MODEL_FAMILY_LABEL
from goodput.operator.engine import read_leader, warm_up
from goodput.operator.kube import MODEL_GROUPS, SLO_POLICIES, KubeApi, KubeError
from goodput.operator.metrics import OperatorMetrics
from goodput.operator.settings import Settings

ENDPOINT_SLICES = ("discovery.k8s.io", "v1", "endpointslices")
RESOURCE_SLICES = ("resource.k8s.io", "v1", "resourceslices")
RESOURCE_CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")
DEVICE_CLASSES = ("resource.k8s.io", "v1", "deviceclasses")
# Removes only our gate: another controller's scheduling gate stays.
RELEASE_GANG = {"spec": {"schedulingGates": [{"$patch": "delete", "name": naming.SCHEDULING_GATE}]}}
StatusT = TypeVar("StatusT", bound=BaseModel)
# How long a reservation holds GPUs for a pod the watch has not shown (a failed create is forgotten).
RESERVATION_SECONDS = 60.0
# How long a status we wrote may go unseen on the watched object before we stop trusting it.
STATUS_ECHO_TIMEOUT = timedelta(seconds=30)
# How long kopf lets a stopping ModelGroup loop finish its pass before cancelling it.
LOOP_STOP_GRACE_SECONDS = 10.0


def post_events_with_kopf(body: kopf.Body, events: Iterable[EventRecord]) -> None:
    """Post Events through kopf's queue (asynchronous, retried, never blocking the loop)."""
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


EVENT_REPORTING_COMPONENT = "goodput"


def event_manifest(body: Mapping[str, Any], event: EventRecord, now: datetime) -> dict[str, Any]:
    """A core v1 Event about the object `body`, as kopf's queue would post it (same component,
    so `kubectl describe` and event selectors see one source)."""
    metadata = body["metadata"]
    moment = rfc3339_millis(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": metadata["namespace"], "generateName": f"{metadata['name']}."},
        "involvedObject": {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": EVENT_REPORTING_COMPONENT},
        "reportingComponent": EVENT_REPORTING_COMPONENT,
        "reportingInstance": EVENT_REPORTING_COMPONENT,
        "firstTimestamp": moment,
        "lastTimestamp": moment,
        "count": 1,
    }


@dataclass
class Runtime:
    """What every handler shares, held in kopf's operator memo."""

    settings: Settings
    kube: KubeApi
    metrics: OperatorMetrics
    http: aiohttp.ClientSession | None = None
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    post_events: Callable[[kopf.Body, Iterable[EventRecord]], None] = field(default=post_events_with_kopf)
    # GPUs of pods any ModelGroup loop decided to create and the watch has not shown yet, by
    # "namespace/name": every loop places against them, so two ModelGroups planning a moment apart
    # never count the same free GPUs (the loops share one event loop, and plan and reserve with no
    # await in between).
    reservations: dict[str, tuple[GpuClaim, float]] = field(default_factory=dict)
    # Each ModelGroup's (generation, deletionTimestamp) as its loop was last woken for.
    acted_on: dict[tuple[str, str], tuple[Any, Any]] = field(default_factory=dict)

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def wake_on_change(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """Wake a ModelGroup's loop when what it acts on changed: the spec (its generation) or the
        deletion. A status or metadata write (the autoscaler's decisions, the loop's own status or
        annotations) does not wake it: the loop keeps what it wrote, and its next tick comes anyway."""
        metadata = body.get("metadata") or {}
        seen = (metadata.get("generation"), metadata.get("deletionTimestamp"))
        if self.acted_on.get((namespace, name)) != seen:
            self.acted_on[(namespace, name)] = seen
            self.wake(namespace, name)

    def wake(self, namespace: str | None, name: str | None) -> None:
        event = self.wakeups.get((namespace or "", name or ""))
        if event is not None:
            event.set()

    def reserve(self, pod: str, claim: GpuClaim) -> None:
        self.reservations[pod] = (claim, time.monotonic() + RESERVATION_SECONDS)

    def gpu_claims(self, indexed: Iterable[tuple[str, GpuClaim]]) -> list[GpuClaim]:
        """Every GPU claim in the cluster: the indexed pods, plus the reservations not indexed yet."""
        claims = dict(indexed)
        now = time.monotonic()
        for pod in [p for p, (_, expires) in self.reservations.items() if p in claims or expires <= now]:
            del self.reservations[pod]
        return [*claims.values(), *(claim for claim, _ in self.reservations.values())]


def register(registry: kopf.OperatorRegistry, options: Settings) -> None:
    """Register every handler of the operator on `registry`, with timings from `options`.

    (Handlers receive kopf's own settings as `settings`; goodput's reach them through the memo.)
    """
    _register_lifecycle(registry)
    _register_indexes(registry)
    _register_model_groups(registry)
    _register_slo_policies(registry, options)


def _register_lifecycle(registry: kopf.OperatorRegistry) -> None:
    """Start-up (kopf's settings, the HTTP session), login and clean-up."""

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(*, settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        runtime: Runtime = memo.runtime
        settings.persistence.finalizer = f"{naming.DOMAIN}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.DOMAIN)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=naming.DOMAIN, key="last-handled-configuration"
        )
        settings.posting.reporting_component = EVENT_REPORTING_COMPONENT
        settings.posting.level = logging.WARNING
        settings.peering.mandatory = not runtime.settings.standalone
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 60
        settings.networking.connect_timeout = 10
        settings.queueing.idle_timeout = 10
        settings.scanning.disabled = True
        runtime.http = aiohttp.ClientSession()
        # The metrics endpoint is served by `goodput run` from the start, followers included.

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """Credentials as the `kubernetes` package resolves them (kubeconfig or service account)."""
        return kopf.login_via_client(**kwargs)

    @kopf.on.cleanup(id="close", registry=registry)
    async def close(*, memo: Any, **_: Any) -> None:
        runtime: Runtime = memo.runtime
        if runtime.http is not None:
            await runtime.http.close()


def _register_indexes(registry: kopf.OperatorRegistry) -> None:
    """What the controllers read, kept current by the watches. The indexers of our pods and of the
    ModelGroups also wake the ModelGroup's loop, so a change is acted on at once rather than at the
    next tick (an indexer runs on every change, and logs nothing)."""

    @kopf.index("pods", labels={naming.LABEL_MODEL_GROUP: kopf.PRESENT}, id="group_pods", registry=registry)
    async def group_pods(
        *, body: kopf.Body, namespace: str | None, memo: Any, **_: Any
    ) -> dict[tuple[str, str], PodView]:
        view = parse_pod(body)
        if view is None:
            return {}
        memo.runtime.wake(namespace, view.model_group)
        return {(namespace or "", view.model_group): view}

    @kopf.index(
        "pods", when=lambda body, **_: pod_accelerator(body) is not None, id="gpu_claims", registry=registry
    )
    async def gpu_claims(
        *, body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> dict[str, tuple[str, GpuClaim]]:
        claim = gpu_claim(body)
        return {"cluster": (f"{namespace}/{name}", claim)} if claim is not None else {}

    @kopf.index(*ENDPOINT_SLICES, id="service_routes", registry=registry)
    async def service_routes(
        *, body: kopf.Body, namespace: str | None, memo: Any, **_: Any
    ) -> dict[str, tuple[RouteView, ...]]:
        """Our pods as Service endpoints: a draining group's ranks must have left them all."""
        routes = parse_endpoint_slice(body)
        for model_group in {naming.model_group_of_pod(route.pod) for route in routes}:
            memo.runtime.wake(namespace, model_group)
        return {namespace or "": routes} if routes else {}

    @kopf.index("nodes", id="cluster_nodes", registry=registry)
    async def cluster_nodes(*, body: kopf.Body, **_: Any) -> dict[str, NodeView]:
        return {"nodes": parse_node(body)}

    @kopf.index(*RESOURCE_SLICES, id="resource_slices", registry=registry)
    async def resource_slices(*, body: kopf.Body, **_: Any) -> dict[str, ResourceSliceView]:
        """The devices DRA drivers publish per node (for ModelGroups with `gpuDeviceClassName`)."""
        view = parse_resource_slice(body)
        return {"slices": view} if view is not None else {}

    @kopf.index(*RESOURCE_CLAIMS, id="allocated_devices", registry=registry)
    async def claimed_devices(*, body: kopf.Body, **_: Any) -> dict[str, tuple[DeviceKey, ...]]:
        devices = allocated_devices(body)
        return {"cluster": devices} if devices else {}

    @kopf.index(*DEVICE_CLASSES, id="device_classes", registry=registry)
    async def device_classes(*, body: kopf.Body, name: str, **_: Any) -> dict[str, DeviceClassView]:
        return {name: parse_device_class(body)}

    @kopf.index(*MODEL_GROUPS, id="model_groups_by_policy", registry=registry)
    async def model_groups_by_policy(
        *, body: kopf.Body, spec: kopf.Spec, name: str, namespace: str | None, memo: Any, **_: Any
    ) -> dict[tuple[str, str], str]:
        memo.runtime.wake_on_change(namespace or "", name, body)
        policy = (spec.get("policyRef") or {}).get("name")
        return {(namespace or "", policy): name} if policy else {}

    @kopf.index(*MODEL_GROUPS, id="model_group_families", registry=registry)
    async def model_group_families(
        *, name: str, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[str, tuple[str, str | None]]:
        """Each ModelGroup's family label, by namespace: which fallbacks an SLOPolicy may name."""
        return {namespace or "": (name, labels.get(MODEL_FAMILY_LABEL))}


def _register_model_groups(registry: kopf.OperatorRegistry) -> None:
    """A ModelGroup's spec check on create and update, and its reconcile loop (one daemon each)."""

    @kopf.on.create(*MODEL_GROUPS, id="validate_on_create", registry=registry)
    @kopf.on.update(*MODEL_GROUPS, field="spec", id="validate_on_update", registry=registry)
    async def validate_model_group(*, body: kopf.Body, **kwargs: Any) -> None:
        parsed = parse_body(body)
        nodes, _ = Indexes.of(kwargs).placement(device_class_of(parsed))
        problems = model_group_problems(parsed, nodes)
        if problems:
            kopf.event(body, type="Warning", reason=EventReason.INVALID_SPEC, message=problems)
            raise kopf.PermanentError(f"invalid spec: {problems}")

    @kopf.daemon(
        *MODEL_GROUPS,
        cancellation_backoff=LOOP_STOP_GRACE_SECONDS,
        cancellation_timeout=10,
        id="model_group_loop",
        registry=registry,
    )
    async def model_group_loop(
        *,
        body: kopf.Body,
        name: str,
        memo: Any,
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
        **kwargs: Any,
    ) -> None:
        runtime: Runtime = memo.runtime
        loop = ModelGroupLoop(runtime, body, Indexes.of(kwargs), logger)
        await run_model_group_loop(runtime, loop, stopped)


def _register_slo_policies(registry: kopf.OperatorRegistry, options: Settings) -> None:
    """One timer per SLOPolicy: validate it, and list the ModelGroups bound to it."""

    @kopf.timer(
        *SLO_POLICIES, interval=options.policy_interval_seconds, id="slo_policy_status", registry=registry
    )
    async def slo_policy_status(
        *,
        body: kopf.Body,
        name: str,
        namespace: str | None,
        meta: kopf.Meta,
        status: kopf.Status,
        memo: Any,
        **kwargs: Any,
    ) -> None:
        model_groups_by_policy: kopf.Index[tuple[str, str], str] = kwargs["model_groups_by_policy"]
        runtime: Runtime = memo.runtime
        started = time.monotonic()
        previous = _readable_status(SloPolicyStatus, status)
        result = reconcile_policy(
            previous,
            generation=meta.get("generation") or 0,
            policy=parse_slo_policy(body),
            bound_model_groups=model_groups_by_policy.get((namespace or "", name), []),
            now=datetime.now(UTC),
            model_group_families=dict(kwargs["model_group_families"].get(namespace or "", [])),
        )
        if result.status != previous:
            await asyncio.to_thread(
                runtime.kube.apply_custom_status,
                "slopolicies",
                namespace or "",
                name,
                POLICY_STATUS.apply_body(namespace or "", name, result.status),
                field_manager=POLICY_STATUS.field_manager,
            )
        runtime.post_events(body, result.events)
        runtime.metrics.reconciles.labels("slopolicy", "success").inc()
        runtime.metrics.reconcile_duration.labels("slopolicy").observe(time.monotonic() - started)


class StopFlag(Protocol):
    """What the loop needs of kopf's `stopped` flag: truthy once set, and awaitable until then."""

    def __bool__(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> Awaitable[Any]: ...


async def run_model_group_loop(runtime: Runtime, loop: ModelGroupLoop, stopped: StopFlag) -> None:
    """Reconcile one ModelGroup until kopf stops the daemon (it is deleted, or the operator exits).

    Every wait also ends when `stopped` is set, so the daemon returns at once instead of being
    cancelled mid-sleep; a pass already running finishes first (its writes are bounded by the
    Kubernetes client's timeouts, well within kopf's cancellation backoff).
    """
    name = loop.name
    wake = runtime.wakeup(loop.namespace, name)
    failures_in_a_row = 0
    try:
        while not stopped:
            wake.clear()
            started = time.monotonic()
            try:
                await loop.reconcile()
                runtime.metrics.reconciles.labels("modelgroup", "success").inc()
                failures_in_a_row = 0
            except Exception as error:  # the loop outlives any one failed pass
                runtime.metrics.reconciles.labels("modelgroup", "error").inc()
                runtime.metrics.reconcile_errors.labels("modelgroup", "internal").inc()
                failures_in_a_row += 1
                loop.logger.warning(
                    "reconcile failed, retrying",
                    exc_info=not isinstance(error, KubeError),
                    extra={"error": str(error)},
                )
                # Back off like kopf does for failing handlers; wake-ups do not shorten it.
                await _wait_until(stopped, None, min(30.0, 2.0**failures_in_a_row))
            finally:
                elapsed = time.monotonic() - started
                runtime.metrics.reconcile_duration.labels("modelgroup").observe(elapsed)
            await _wait_until(stopped, wake, runtime.settings.reconcile_interval_seconds)
            await _wait_until(stopped, None, runtime.settings.min_reconcile_gap_seconds)
    except asyncio.CancelledError:
        # kopf cancels a daemon that outlived its stop grace: that is the end it asked for.
        if not stopped:
            raise
    finally:
        loop.stop()
        runtime.wakeups.pop((loop.namespace, name), None)
        runtime.acted_on.pop((loop.namespace, name), None)
        runtime.metrics.forget_model_group(loop.namespace, name)


async def _wait_until(stopped: StopFlag, wake: asyncio.Event | None, timeout_seconds: float) -> None:
    """Sleep up to `timeout_seconds`, less if `wake` is set, not at all once `stopped` is set."""
    if stopped or timeout_seconds <= 0:
        return
    waiters = [asyncio.ensure_future(stopped.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout_seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


@dataclass(frozen=True, slots=True)
class Indexes:
    """The indexes a ModelGroup pass reads (kopf passes every index to every handler by name)."""

    group_pods: Mapping[tuple[str, str], Iterable[PodView]]
    gpu_claims: Mapping[str, Iterable[tuple[str, GpuClaim]]]
    cluster_nodes: Mapping[str, Iterable[NodeView]]
    service_routes: Mapping[str, Iterable[tuple[RouteView, ...]]] = field(default_factory=dict)
    resource_slices: Mapping[str, Iterable[ResourceSliceView]] = field(default_factory=dict)
    allocated_devices: Mapping[str, Iterable[tuple[DeviceKey, ...]]] = field(default_factory=dict)
    device_classes: Mapping[str, Iterable[DeviceClassView]] = field(default_factory=dict)

    @classmethod
    def of(cls, handler_kwargs: Mapping[str, Any]) -> Indexes:
        return cls(
            handler_kwargs["group_pods"],
            handler_kwargs["gpu_claims"],
            handler_kwargs["cluster_nodes"],
            handler_kwargs["service_routes"],
            handler_kwargs["resource_slices"],
            handler_kwargs["allocated_devices"],
            handler_kwargs["device_classes"],
        )

    def routed_pods(self, namespace: str) -> frozenset[str]:
        """Pods some Service in the namespace lists as ready endpoints."""
        return frozenset(
            route.pod for routes in self.service_routes.get(namespace, ()) for route in routes if route.ready
        )

    def nodes(self) -> list[NodeView]:
        return list(self.cluster_nodes.get("nodes", ()))

    def placement(self, device_class: str | None) -> tuple[list[NodeView], DevicePlacement]:
        """The nodes as placement counts them, and what allocated claims hold: with a DeviceClass,
        each node's devices of it (from the ResourceSlices) and the claims on them; without one, the
        nodes as they are (device-plugin pods are counted from the pods)."""
        views = self.nodes()
        if device_class is None:
            return views, NO_DEVICE_CLASS
        inventories, devices = class_placement(
            [view.inventory for view in views],
            device_class,
            next(iter(self.device_classes.get(device_class, ())), None),
            self.resource_slices.get("slices", ()),
            (key for keys in self.allocated_devices.get("cluster", ()) for key in keys),
        )
        nodes = [
            replace(view, inventory=inventory) for view, inventory in zip(views, inventories, strict=True)
        ]
        return nodes, devices


def device_class_of(model_group: ModelGroup | str) -> str | None:
    """The DeviceClass a ModelGroup's GPUs come from (dynamic resource allocation); None otherwise."""
    return None if isinstance(model_group, str) else model_group.spec.engine.gpu_device_class_name


def model_group_problems(model_group: ModelGroup | str, nodes: Iterable[NodeView]) -> str:
    """Why the controller cannot act on a ModelGroup (parsed, or why it does not parse); empty if it can."""
    if isinstance(model_group, str):
        return model_group
    return "; ".join(spec_problems(model_group, [view.inventory for view in nodes]))


def parse_body(body: Mapping[str, Any]) -> ModelGroup | str:
    """The ModelGroup in a watched body, without its status (which the controller rewrites)."""
    return parse_model_group({key: body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")})


@dataclass(frozen=True, slots=True)
class GroupWrite:
    """How one step of `APPLY_ORDER` writes a group: the `PlanWrites` method that does it, and the
    Warning (reason, and what was being done) when the API server refuses it."""

    method: str
    failed_reason: str
    what: str


# The steps of a plan that write one group each, by their field of `Plan`. The others are the
# loop's own (`ModelGroupLoop._apply_own_step`). The methods are looked up by name on every pass.
GROUP_WRITES: Mapping[str, GroupWrite] = {
    "drain_starts": GroupWrite("start_drain", EventReason.FAILED_UPDATE, "starting its drain"),
    "unready": GroupWrite("set_gates", EventReason.FAILED_UPDATE, "marking it not ready"),
    "drain_outcomes": GroupWrite("write_outcome", EventReason.FAILED_UPDATE, "recording its drain's end"),
    "deletions": GroupWrite("delete", EventReason.FAILED_DELETE, "deleting it"),
    "creations": GroupWrite("create", EventReason.FAILED_CREATE, "creating it"),
    "gate_releases": GroupWrite("release_gates", EventReason.FAILED_UPDATE, "releasing its gates"),
    "drain_marks": GroupWrite("mark_drain", EventReason.FAILED_UPDATE, "marking its drain"),
    "drain_progress": GroupWrite("record_progress", EventReason.FAILED_UPDATE, "recording its drain"),
    "ready": GroupWrite("set_gates", EventReason.FAILED_UPDATE, "marking it ready"),
}
# The steps of `APPLY_ORDER` the loop does itself rather than as a group's writes.
OWN_STEPS = frozenset({"annotations", "drains_ended", "warmups", "leader_probes"})


@dataclass
class StepLedger:
    """Which groups' writes of one pass all succeeded, so the Events say what happened.

    A plan's Event about a group (created, deleted, drain started, ready...) is posted only once
    every write of that pass for the group succeeded; a write that failed becomes a Warning with
    the API server's answer instead, and the writes after it, not made, are not announced.
    """

    remaining: Counter[str]
    failures: list[EventRecord] = field(default_factory=list)

    @classmethod
    def of(cls, plan: Plan) -> StepLedger:
        return cls(Counter(action.group for step in GROUP_WRITES for action in getattr(plan, step)))

    async def run(self, group: str, failed_reason: str, what: str, write: Awaitable[Any]) -> None:
        """Await one step of `group`'s writes; a KubeError is recorded, then raised (the pass stops)."""
        try:
            await write
        except Exception as error:  # a refusal, a timeout: either way the write did not happen
            message = f"group {group}: {what} failed: {error}"
            self.failures.append(EventRecord("Warning", failed_reason, message[:1024], group))
            raise
        self.remaining[group] -= 1

    def events(self, plan: Plan) -> list[EventRecord]:
        """The plan's Events whose groups' writes all succeeded, then the failures."""
        done = [e for e in plan.events if e.group is None or self.remaining[e.group] <= 0]
        return [*done, *self.failures]


class ModelGroupLoop:
    """The reconcile loop of one ModelGroup, and its memory between passes.

    The memory is what the cluster cannot tell yet: writes the watch has not echoed (pods created,
    gates set, annotations, status), warm-ups and leader probes in flight, their results, and
    drains that ended but are not in a written status yet. Everything a drain needs to resume
    after a restart is in the cluster (pod annotations); this memory only makes it quicker.
    """

    def __init__(self, runtime: Runtime, body: kopf.Body, indexes: Indexes, logger: kopf.Logger) -> None:
        self.runtime = runtime
        self.body = body
        self.indexes = indexes
        self.logger = logger
        self.namespace = body.metadata.namespace or ""
        self.name = body.metadata.name
        self.expectations: dict[str, Expectation] = {}
        self.annotations: dict[str, str] = {}
        self.warmups: dict[str, WarmupOutcome] = {}
        self.warmups_in_flight: set[str] = set()
        self.leader_readings: dict[str, LeaderReading] = {}
        self.leader_samples: dict[str, LeaderSample] = {}
        self.probes_in_flight: set[str] = set()
        # Groups whose wait for readiness was reported with an Event (once per group and process).
        self.readiness_reported: set[str] = set()
        # Stalled ready-time phases reported with an Event, as "group/phase" (once per process).
        self.stalls_reported: set[str] = set()
        self.unrecorded_drains: list[DrainEnded] = []
        # Drains cancelled in passes whose status write lost a conflict: counted at the next write.
        self.unrecorded_cancellations = 0
        self.written_status: dict[str, Any] | None = None
        self.written_status_model: ModelGroupStatus | None = None
        self.written_at: datetime | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        # This loop's first pass (to the millisecond, as drain marks are written): a drain marked
        # before it was begun by another operator, or before a restart, and is resumed from here.
        self.acting_since: datetime | None = None

    async def reconcile(self) -> None:
        """One pass: observe, plan, apply, record."""
        now = datetime.now(UTC)
        if self.acting_since is None:
            self.acting_since = now.replace(microsecond=now.microsecond // 1000 * 1000)
        snapshot = {key: self.body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")}
        metadata = snapshot["metadata"] or {}
        generation = int(metadata.get("generation") or 0)
        previous = self._previous_status(self.body.get("status") or {}, now)
        parsed = parse_body(snapshot)
        nodes, devices = self.indexes.placement(device_class_of(parsed))
        problems = model_group_problems(parsed, nodes)
        if isinstance(parsed, str) or problems:
            status = invalid_spec_status(
                previous, name=self.name, generation=generation, problems=problems, now=now
            )
            await self._apply_status(previous, status, now)
            self.runtime.metrics.reconcile_errors.labels("modelgroup", "spec").inc()
            return

        deleting = bool(metadata.get("deletionTimestamp"))
        # A ModelGroup without roles is one pool; roles will plan each of theirs in turn.
        (pool,) = model_group_pools(parsed.spec)
        world = self.build_world(
            parsed,
            pool,
            nodes,
            now,
            deleting=deleting,
            recorded_drains=_recorded(previous),
            devices=devices,
            recent_ready=recent_ready_phases(previous.ready_time),
        )
        plan = plan_model_group(world)
        self._reserve_gpus(plan)
        ledger = StepLedger.of(plan)
        try:
            await self.apply(plan, world, ledger)
        finally:
            # What was done is announced, even when a later step of the plan failed; what was not
            # done is not, and a write that failed is a Warning with the API server's answer.
            self.runtime.post_events(self.body, ledger.events(plan))
            self.readiness_reported.update(plan.readiness_reported)
            self.stalls_reported.update(plan.stalls_reported)
        _record(self.runtime.metrics, self.namespace, self.name, world, plan)
        await self._record_status(previous, plan, world, generation)

    def _reserve_gpus(self, plan: Plan) -> None:
        """Claim the GPUs of the pods this plan creates, for every loop's placement, before any await."""
        for creation in plan.creations:
            for manifest in creation.pods:
                claim = gpu_claim(manifest)
                if claim is not None:
                    self.runtime.reserve(f"{self.namespace}/{manifest['metadata']['name']}", claim)

    async def _record_status(
        self, previous: ModelGroupStatus, plan: Plan, world: World, generation: int
    ) -> None:
        """Apply the status after `plan`, with the drains and cancellations earlier passes could not
        record. An ended drain is announced (DrainFinished, DrainTimedOut) only once this write,
        which makes it durable in `status.drain.recent`, has landed: a restarted operator records
        and announces a drain again only if it did not."""
        status = model_group_status(
            previous,
            name=self.name,
            generation=generation,
            desired_groups=world.desired_groups,
            plan=plan,
            now=world.now,
            unrecorded_drains=self.unrecorded_drains,
            unrecorded_cancellations=self.unrecorded_cancellations,
            pool=world.template.pool,
        )
        try:
            await self._apply_status(previous, status, world.now)
        except KubeError:
            self.unrecorded_cancellations += len(plan.drains_cancelled)
            raise
        self.runtime.post_events(self.body, [d.event for d in self.unrecorded_drains if d.event])
        self.unrecorded_drains = []
        self.unrecorded_cancellations = 0

    def build_world(
        self,
        model_group: ModelGroup,
        pool: PoolSpec,
        nodes: list[NodeView],
        now: datetime,
        *,
        deleting: bool = False,
        recorded_drains: frozenset[str] = frozenset(),
        devices: DevicePlacement = NO_DEVICE_CLASS,
        recent_ready: tuple[Mapping[ReadyPhase, float], ...] = (),
    ) -> World:
        spec = model_group.spec
        settings = self.runtime.settings
        template = replace(group_template(model_group, settings.agent_image), pool=pool.name)
        observed = list(self.indexes.group_pods.get((self.namespace, self.name), ()))
        pods, self.expectations = overlay(observed, self.expectations, now)
        claims = [*self.runtime.gpu_claims(self.indexes.gpu_claims.get("cluster", ())), *devices.claims]
        annotations = dict(model_group.metadata.annotations)
        self.annotations = {k: v for k, v in self.annotations.items() if annotations.get(k) != v}
        annotations.update(self.annotations)
        counter_text = annotations.get(naming.ANNOTATION_GROUP_COUNTER, "0")
        live_groups = {pod.group for pod in pods}
        memories: tuple[dict[str, Any], ...] = (self.warmups, self.leader_readings, self.leader_samples)
        for memory in memories:
            for group in [g for g in memory if g not in live_groups]:
                del memory[group]
        self.readiness_reported &= live_groups
        self.stalls_reported = {key for key in self.stalls_reported if key.split("/", 1)[0] in live_groups}
        tuning = ControllerTuning(
            warmup_retry_seconds=settings.warmup_retry_seconds,
            placement_backoff_seconds=settings.placement_backoff_seconds,
        )
        rules = replace(
            readiness_rules(spec, tuning),
            drain_on_timeout=spec.drain.on_timeout,
            drain_settle_seconds=settings.drain_settle_seconds,
        )
        return World(
            now=now,
            template=template,
            rules=rules,
            placement=placement_rules(spec),
            desired_groups=pool.desired_groups,
            pods=pods,
            inventory=Inventory(tuple(view.inventory for view in nodes), tuple(claims), devices.note),
            ready_nodes=frozenset(view.inventory.name for view in nodes if view.ready),
            group_counter=int(counter_text) if counter_text.isdigit() else 0,
            backoffs=parse_backoffs(annotations.get(naming.ANNOTATION_PLACEMENT_BACKOFF)),
            warmups=dict(self.warmups),
            readiness_reported=frozenset(self.readiness_reported),
            rollout=RolloutRules(spec.rollout.max_surge, spec.rollout.max_unavailable),
            rollout_progress=parse_rollout(annotations.get(naming.ANNOTATION_ROLLOUT)),
            warmups_in_flight=frozenset(self.warmups_in_flight),
            leader_readings=dict(self.leader_readings),
            leader_samples=dict(self.leader_samples),
            routed_pods=self.indexes.routed_pods(self.namespace),
            max_replicas=spec.max_replicas,
            deleting=deleting,
            recorded_drains=recorded_drains,
            acting_since=self.acting_since,
            recent_ready_phases=recent_ready,
            stalls_reported=frozenset(self.stalls_reported),
        )

    async def apply(self, plan: Plan, world: World, ledger: StepLedger | None = None) -> None:
        """Apply a plan step by step in `APPLY_ORDER`, stopping at the first write that fails;
        `ledger` learns which groups' writes all succeeded.

        The group counter is recorded before any pod of a new group exists, so a restart never
        reuses a name; a drain's mark is on every rank before its gate goes False, and its outcome
        on every rank before its status record (the ranks go in a later pass, once recorded); gates
        go False on every failing rank before anything is deleted; a group's gates are released
        only once every one of its pods exists.
        """
        ledger = ledger or StepLedger.of(plan)
        writes = PlanWrites(self, world)
        for step in APPLY_ORDER:
            group_write = GROUP_WRITES.get(step)
            if group_write is None:
                await self._apply_own_step(step, plan)
                continue
            write = getattr(writes, group_write.method)
            for action in getattr(plan, step):
                await ledger.run(action.group, group_write.failed_reason, group_write.what, write(action))

    async def _apply_own_step(self, step: str, plan: Plan) -> None:
        """A step of `APPLY_ORDER` that is not one group's writes: the ModelGroup's annotations, the
        drains ended this pass (kept for the status write), and the warm-ups and leader reads."""
        if step == "annotations":
            await self._write_annotations(plan.annotations)
        elif step == "drains_ended":
            self._record_drains_ended(plan.drains_ended)
            for _ in plan.drains_cancelled:
                self.runtime.metrics.drain_cancelled(self.namespace, self.name)
        elif step == "warmups":
            for request in plan.warmups:
                self.warmups_in_flight.add(request.group)
                self._spawn(self._warm_up(request))
        elif step == "leader_probes":
            for probe in plan.leader_probes:
                if probe.group not in self.probes_in_flight:
                    self.probes_in_flight.add(probe.group)
                    self._spawn(self._probe_leader(probe.group, probe.url))
        else:  # pragma: no cover - APPLY_ORDER and GROUP_WRITES are checked against each other
            raise ValueError(f"no write for plan step {step!r}")

    async def _write_annotations(self, annotations: Mapping[str, str]) -> None:
        if not annotations:
            return
        await asyncio.to_thread(
            self.runtime.kube.patch_custom,
            "modelgroups",
            self.namespace,
            self.name,
            {"metadata": {"annotations": dict(annotations)}},
        )
        self.annotations.update(annotations)

    def _record_drains_ended(self, drains: Iterable[DrainEnded]) -> None:
        """Keep each ended drain until a status write carries it (even if a later step of this pass
        fails). Every pass emits it again until `status.drain.recent` holds it: counted and logged
        once per process; announced once the status write lands."""
        for drain in drains:
            if any(known.record.group == drain.record.group for known in self.unrecorded_drains):
                continue
            self.unrecorded_drains.append(drain)
            self.runtime.metrics.drain_ended(self.namespace, self.name, drain)
            self.logger.info(
                "drain ended",
                extra={
                    "group": drain.record.group,
                    "outcome": drain.record.outcome,
                    "duration_seconds": drain.record.duration_seconds,
                    "requests_finished": drain.record.requests_finished,
                    "requests_aborted": drain.record.requests_aborted,
                },
            )

    def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _warm_up(self, request: WarmupRequest) -> None:
        try:
            if self.runtime.http is None:
                return
            outcome = await warm_up(self.runtime.http, request)
            self.warmups[request.group] = outcome
            self.runtime.metrics.warmups.labels("success" if outcome.succeeded else "failure").inc()
        finally:
            self.warmups_in_flight.discard(request.group)
            self.runtime.wake(self.namespace, self.name)

    async def _probe_leader(self, group: str, url: str) -> None:
        previous = self.leader_readings.get(group)
        reading: LeaderReading | None = None
        try:
            if self.runtime.http is None:
                return
            reading = await read_leader(self.runtime.http, url)
            self.leader_readings[group] = reading
            if isinstance(reading, LeaderSample):
                self.leader_samples[group] = reading
        finally:
            self.probes_in_flight.discard(group)
            # Act at once on what may end a drain or pick a victim: a first reading, or an idle leader.
            first = not isinstance(previous, LeaderSample)
            if reading is not None and (
                first or (isinstance(reading, LeaderSample) and reading.in_flight == 0)
            ):
                self.runtime.wake(self.namespace, self.name)

    def _previous_status(self, raw_status: Mapping[str, Any], now: datetime) -> ModelGroupStatus:
        """The status to build on: ours as last written, until the watch echoes it back."""
        observed = _readable_status(ModelGroupStatus, raw_status)
        if self.written_status_model is None or self.written_at is None:
            return observed
        owned = GROUP_STATUS.owned(wire_dict(observed))
        if owned == self.written_status or now - self.written_at > STATUS_ECHO_TIMEOUT:
            self.written_status = self.written_status_model = self.written_at = None
            return observed
        # Our write is not echoed yet: build on it, but keep what the autoscaler wrote meanwhile.
        return with_others_conditions(self.written_status_model, observed)

    async def _apply_status(
        self, previous: ModelGroupStatus, status: ModelGroupStatus, now: datetime
    ) -> None:
        """Apply this controller's part of the status if it changed (server-side apply as the group
        controller's field manager: the autoscaler's fields and conditions are never in the body,
        so no write of ours can erase them, and no precondition is needed)."""
        if status == previous:
            return
        body = GROUP_STATUS.apply_body(self.namespace, self.name, status)
        await asyncio.to_thread(
            self.runtime.kube.apply_custom_status,
            "modelgroups",
            self.namespace,
            self.name,
            body,
            field_manager=GROUP_STATUS.field_manager,
        )
        self.written_status, self.written_status_model, self.written_at = body["status"], status, now


class PlanWrites:
    """The writes of one pass's plan, each remembered as an expectation until the watch shows it."""

    def __init__(self, loop: ModelGroupLoop, world: World) -> None:
        self.loop = loop
        self.kube = loop.runtime.kube
        self.namespace = loop.namespace
        self.now = world.now
        self.views = {pod.name: pod for pod in world.pods}

    def remember(self, pod: str, *fields: str, **changes: Any) -> None:
        self.views[pod] = replace(self.views[pod], **changes)
        self.loop.expectations = expect(self.loop.expectations, self.views[pod], fields, self.now)

    async def set_gates(self, change: GateChange) -> None:
        condition = {
            "type": naming.CONDITION_GROUP_READY,
            "status": "True" if change.ready else "False",
            "reason": change.reason,
            "message": change.message[:1024],
            "lastTransitionTime": rfc3339_seconds(self.now),
        }
        await _gather(
            self.kube.patch_pod_status,
            [(self.namespace, pod, {"status": {"conditions": [condition]}}) for pod in change.pods],
        )
        marked = ConditionView(condition["status"], change.reason, change.message, self.now)
        for pod in change.pods:
            if pod in self.views:
                self.remember(pod, "group_ready", group_ready=marked)

    async def release_gates(self, release: GateRelease) -> None:
        await self._release(release.pods)

    async def _release(self, pods: Iterable[str]) -> None:
        pods = list(pods)
        await _gather(
            self.kube.patch_pod,
            [(self.namespace, pod, RELEASE_GANG, STRATEGIC_MERGE_PATCH) for pod in pods],
        )
        for pod in pods:
            self.remember(pod, EXISTS, "gated", gated=False)

    async def delete(self, deletion: GroupDeletion) -> None:
        await _gather(self.kube.delete_pod, [(self.namespace, pod) for pod in deletion.pods])
        for pod in deletion.pods:
            self.loop.expectations = expect_deleted(self.loop.expectations, pod, self.now)
        if deletion.service:
            await asyncio.to_thread(self.kube.delete_service, self.namespace, deletion.service)

    async def create(self, creation: GroupCreation) -> None:
        """The claim template (when missing), the Service, every pod (gated), then every gate
        released together."""
        if creation.claim_template is not None:
            await asyncio.to_thread(self.kube.create_resource_claim_template, creation.claim_template)
        if creation.service is not None:
            await asyncio.to_thread(self.kube.create_service, creation.service)
        for manifest in creation.pods:
            await asyncio.to_thread(self.kube.create_pod, manifest)
            view = parse_pod(manifest)
            if view is not None:
                self.views[view.name] = view
                self.remember(view.name, EXISTS, created_at=self.now)
        await self._release(manifest["metadata"]["name"] for manifest in creation.pods)
        self.loop.logger.info("group created", extra={"group": creation.group, "domain": creation.domain})

    async def start_drain(self, start: DrainStart) -> None:
        """Intent first: every rank marked draining, then DrainStarted (the drain now resumes after
        any restart), and only then every readiness gate False (see `DrainStart`)."""
        await self.mark_draining(start)
        if start.event is not None:
            await self.announce(start.event)
        await self.set_gates(GateChange(start.group, start.pods, False, start.reason, start.message))

    async def announce(self, event: EventRecord) -> None:
        """Post `event` before the next write: once every gate is False a restarted operator no
        longer resumes the start, so an Event still in kopf's queue at a kill would be lost for good.
        A refused post (RBAC, admission) falls back to the queue rather than holding the drain."""
        try:
            manifest = event_manifest(self.loop.body, event, datetime.now(UTC))
            await asyncio.to_thread(self.kube.create_event, manifest)
        except KubeError as error:
            self.loop.logger.warning(f"posting {event.reason} failed ({error}); queued instead")
            self.loop.runtime.post_events(self.loop.body, [event])

    async def mark_draining(self, start: DrainStart) -> None:
        since = rfc3339_millis(start.since)
        patch = {"metadata": {"annotations": {naming.ANNOTATION_DRAINING_SINCE: since}}}
        await _gather(self.kube.patch_pod, [(self.namespace, pod, patch) for pod in start.pods])
        for pod in start.pods:
            if pod in self.views:
                self.remember(pod, "draining_since", draining_since=start.since)

    async def write_outcome(self, outcome: DrainOutcomeMark) -> None:
        """A drain's end on every rank, before its status record and before any rank is deleted."""
        encoded = encode_outcome(outcome.decided)
        patch = {"metadata": {"annotations": {naming.ANNOTATION_DRAIN_OUTCOME: encoded}}}
        await _gather(self.kube.patch_pod, [(self.namespace, pod, patch) for pod in outcome.pods])
        for pod in outcome.pods:
            if pod in self.views:
                self.remember(pod, "drain_outcome", drain_outcome=outcome.decided)

    async def mark_drain(self, mark: DrainMark) -> None:
        annotations: dict[str, str | None] = {
            naming.ANNOTATION_DRAINING_SINCE: rfc3339_millis(mark.since) if mark.since else None
        }
        if mark.since is None:
            # Back in service: a later drain starts from scratch.
            annotations[naming.ANNOTATION_DRAIN_PROGRESS] = None
        patch = {"metadata": {"annotations": annotations}}
        await _gather(self.kube.patch_pod, [(self.namespace, pod, patch) for pod in mark.pods])
        for pod in mark.pods:
            if mark.since is None:
                self.remember(
                    pod, "draining_since", "drain_progress", draining_since=None, drain_progress=None
                )
            else:
                self.remember(pod, "draining_since", draining_since=mark.since)

    async def record_progress(self, progress: DrainProgressMark) -> None:
        encoded = encode_progress(progress.progress)
        patch = {"metadata": {"annotations": {naming.ANNOTATION_DRAIN_PROGRESS: encoded}}}
        await asyncio.to_thread(self.kube.patch_pod, self.namespace, progress.leader, patch)
        if progress.leader in self.views:
            self.remember(progress.leader, "drain_progress", drain_progress=progress.progress)


async def _gather(call: Callable[..., Any], argument_lists: list[tuple[Any, ...]]) -> None:
    """Run one Kubernetes call per argument tuple concurrently: all ranks of a group at once."""
    await asyncio.gather(*(asyncio.to_thread(call, *arguments) for arguments in argument_lists))


def _recorded(status: ModelGroupStatus) -> frozenset[str]:
    """Groups whose ended drain `status.drain.recent` holds: only those may be deleted."""
    return (
        frozenset(record.group for record in status.drain.recent) if status.drain is not None else frozenset()
    )


def _readable_status(model: type[StatusT], raw: Mapping[str, Any]) -> StatusT:
    """The status as written, or an empty one if it cannot be read (it is rewritten whole anyway)."""
    try:
        return model.model_validate(dict(raw))
    except ValidationError:
        return model()


def _record(metrics: OperatorMetrics, namespace: str, name: str, world: World, plan: Plan) -> None:
    for group in plan.became_ready:
        times = group.ready_times()
        if times is not None:
            for phase, seconds in (
                ("placing", times.placing_seconds),
                ("provisioning", times.provisioning_seconds),
                ("warming", times.warming_seconds),
                ("total", times.total_seconds),
            ):
                metrics.group_ready_seconds.labels(phase).observe(seconds)
        phases = plan.ready_breakdowns.get(group.name)
        if phases is not None:
            metrics.ready_phases(namespace, name, phases)
    counts: dict[str, int] = {}
    for group in plan.groups:
        counts[group.state] = counts.get(group.state, 0) + 1
        if group.state == "Failed":
            metrics.group_failures.labels(group.reason).inc()
    metrics.set_group_counts(namespace, name, world.desired_groups, counts, world.template.gpus_per_group)
    if plan.placement_limit is not None:
        metrics.placement_limited.labels(plan.placement_limit.reason).inc()
