"""The one vocabulary of condition types, reasons, signals, guards and Event reasons.

Conditions, Events, decision records, logs and metric labels all draw from here, so a reason seen
in `kubectl describe` is the same string as in a Prometheus label or a JSON log line. Reasons are
CamelCase and specific (API conventions: "`Started` is not a good reason"); every value matches the
metav1.Condition reason pattern. Add new words here, never inline.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class ConditionType:
    """`status.conditions[].type` values."""

    READY: Final = "Ready"
    """ModelGroup: every wanted group is complete and ready. SLOPolicy readers use `Accepted`."""
    PROGRESSING: Final = "Progressing"
    """Groups are being placed, provisioned, warmed or drained toward `spec.replicas`."""
    DEGRADED: Final = "Degraded"
    """A group failed, timed out placing, or a drain hit its time limit."""
    SCALING_ACTIVE: Final = "ScalingActive"
    """The autoscaler can compute a decision (a bound, accepted policy and readable inputs)."""
    SCALING_LIMITED: Final = "ScalingLimited"
    """ModelGroup, set by the group controller: no further group can be placed now (no GPUs, no
    topology domain, domains backed off after a schedule timeout)."""
    DECISION_LIMITED: Final = "DecisionLimited"
    """ModelGroup, set by the autoscaler: its decision was cut by minReplicas/maxReplicas or a step
    limit (the HPA's ScalingLimited reasons)."""
    METRICS_AVAILABLE: Final = "MetricsAvailable"
    """The metrics behind the signals are present and fresh."""
    ACCEPTED: Final = "Accepted"
    """SLOPolicy: the spec was read and compiled; groups may bind to it."""
    FALLBACKS_VALID: Final = "FallbacksValid"
    """SLOPolicy with a class whose degrade ladder names a fallback: every fallback exists and serves
    the model family of every ModelGroup bound to the policy (False: the gateway does not use it)."""
    FORECASTING: Final = "Forecasting"
    """ModelGroup with `spec.forecast`: whether the offered work's history gives a forecast (False:
    the reason says why, and the autoscaler only reacts)."""
    SLO_ATTAINABLE: Final = "SLOAttainable"
    """ModelGroup: every class's demand can meet its SLO on groups of this shape (False: a share
    of it cannot on any number of groups; the message names the prompt length and the fixes)."""


class Reason:
    """`status.conditions[].reason` values, and the `reason` of a recorded scaling decision."""

    # Spec and policy
    INVALID_SPEC: Final = "InvalidSpec"
    """The spec breaks a rule that only the operator can check; it is not acted on."""
    ACCEPTED: Final = "Accepted"
    FALLBACKS_APPROVED: Final = "FallbacksApproved"
    FALLBACK_MODEL_GROUP_NOT_FOUND: Final = "FallbackModelGroupNotFound"
    FALLBACK_FAMILY_UNKNOWN: Final = "FallbackFamilyUnknown"
    FALLBACK_OTHER_FAMILY: Final = "FallbackOtherFamily"
    POLICY_NOT_FOUND: Final = "PolicyNotFound"
    POLICY_NOT_ACCEPTED: Final = "PolicyNotAccepted"
    NO_POLICY: Final = "NoPolicy"
    """No `policyRef`: `spec.replicas` is set by hand or by another autoscaler."""
    MODE_ADVISORY: Final = "ModeAdvisory"
    MODE_FROZEN: Final = "ModeFrozen"

    # Group lifecycle (Ready, Progressing, Degraded)
    GROUPS_READY: Final = "GroupsReady"
    GROUPS_NOT_READY: Final = "GroupsNotReady"
    SCALED_TO_ZERO: Final = "ScaledToZero"
    GROUPS_PLACING: Final = "GroupsPlacing"
    GROUPS_PROVISIONING: Final = "GroupsProvisioning"
    CONTAINERS_NOT_STARTING: Final = "ContainersNotStarting"
    """A rank's engine container waits for something no wait fixes: an image that cannot be pulled,
    a Secret, ConfigMap or key that does not exist. The message names the rank, the kubelet's reason
    and the ModelGroup field."""
    GROUPS_WARMING: Final = "GroupsWarming"
    GROUPS_DRAINING: Final = "GroupsDraining"
    ROLLING_OUT: Final = "RollingOut"
    """Groups of an older pod template are being replaced by groups of the current one."""
    ROLLOUT_STALLED: Final = "RolloutStalled"
    """Groups of the current pod template kept failing: the rollout stopped, old groups serve."""
    STABLE: Final = "Stable"
    GROUP_FAILED: Final = "GroupFailed"
    SCHEDULE_TIMEOUT: Final = "ScheduleTimeout"
    NODES_PROVISIONING: Final = "NodesProvisioning"
    """A group no existing domain fitted waits, pending, for a node autoscaler to create nodes."""
    NODE_PROVISIONING_TIMEOUT: Final = "NodeProvisioningTimeout"
    """A group waited for new nodes past `placement.nodeProvisioning.provisioningTimeoutSeconds`: it
    was deleted whole, and no nodes are asked for until the back-off has passed."""
    DRAIN_TIMEOUT: Final = "DrainTimeout"
    NCCL_UNHEALTHY: Final = "NcclUnhealthy"
    REVISION_MISMATCH: Final = "RevisionMismatch"
    WARMUP_FAILED: Final = "WarmupFailed"

    # The in-pod health agent (pod conditions GPUHealthy, NCCLHealthy, EngineHealthy)
    GPU_HEALTHY: Final = "GpuHealthy"
    GPU_THROTTLED: Final = "GpuThrottled"
    """A warning: clocks held down by a thermal or power limit; reported, not acted on."""
    GPU_XID_CRITICAL: Final = "GpuXidCritical"
    """An XID error that NVIDIA's catalogue says needs a GPU reset or a node drain."""
    GPU_ECC_UNCORRECTABLE: Final = "GpuEccUncorrectable"
    GPU_ROW_REMAP_PENDING: Final = "GpuRowRemapPending"
    GPU_ROW_REMAP_FAILED: Final = "GpuRowRemapFailed"
    NVLINK_DOWN: Final = "NvlinkDown"
    GPU_ALLOCATION_MISMATCH: Final = "GpuAllocationMismatch"
    """The pod sees a GPU count or product other than it was allocated (a GPU fell off the bus)."""
    NVML_UNAVAILABLE: Final = "NvmlUnavailable"
    """No evidence: NVML could not be loaded or read; never taken for healthy."""
    GPUS_NOT_VISIBLE: Final = "GpusNotVisible"
    """No evidence: the agent's container sees no GPU although the pod was allocated some (under the
    NVIDIA device plugin only the container that requests GPUs gets them)."""
    GPUS_NOT_ISOLATED: Final = "GpusNotIsolated"
    """No evidence: the agent's container sees more GPUs than the pod was allocated (the runtime shows
    it every GPU of the node), so it cannot tell which are the pod's and judges and touches none."""
    NCCL_CHECK_NOT_RUN: Final = "NcclCheckNotRun"
    """No evidence: the NCCL check was not run because the pod's own GPUs could not be told apart."""
    ALL_REDUCE_PASSED: Final = "AllReducePassed"
    ALL_REDUCE_SLOW: Final = "AllReduceSlow"
    ALL_REDUCE_TIMEOUT: Final = "AllReduceTimeout"
    """The rendezvous or the all-reduce did not finish within its bound (a hang or a missing rank)."""
    ALL_REDUCE_FAILED: Final = "AllReduceFailed"
    ENGINE_PROGRESSING: Final = "EngineProgressing"
    ENGINE_HUNG: Final = "EngineHung"
    ENGINE_METRICS_UNAVAILABLE: Final = "EngineMetricsUnavailable"
    GPU_UNHEALTHY: Final = "GpuUnhealthy"
    """Group lifecycle: a rank's agent reported a critical GPU fault."""
    ENGINE_UNHEALTHY: Final = "EngineUnhealthy"
    """Group lifecycle: a rank's agent reported its engine hung."""

    # Scaling (ScalingActive, ScalingLimited, decisions); HPA's words where the meaning is HPA's
    SIGNALS_COMPUTED: Final = "SignalsComputed"
    DESIRED_WITHIN_RANGE: Final = "DesiredWithinRange"
    SCALING_DISABLED: Final = "ScalingDisabled"
    """The HPA's word for a target at zero replicas: it is not scaled (the simulator's baselines)."""
    TOO_FEW_REPLICAS: Final = "TooFewReplicas"
    TOO_MANY_REPLICAS: Final = "TooManyReplicas"
    WITHIN_TOLERANCE: Final = "WithinTolerance"
    SCALE_UP_LIMIT: Final = "ScaleUpLimit"
    SCALE_DOWN_LIMIT: Final = "ScaleDownLimit"
    SCALE_DOWN_STABILIZED: Final = "ScaleDownStabilized"
    SCALE_UP_STABILIZED: Final = "ScaleUpStabilized"
    INSUFFICIENT_CAPACITY: Final = "InsufficientCapacity"
    """No topology domain can hold a whole new group."""

    # Placement of a new group (ScalingLimited, set by the group controller)
    INSUFFICIENT_GPUS: Final = "InsufficientGPUs"
    """No eligible topology domain has enough free GPUs for a whole group."""
    DOMAINS_BACKED_OFF: Final = "DomainsBackedOff"
    """The domains that would fit are avoided after a group failed to schedule there."""
    NO_ELIGIBLE_NODES: Final = "NoEligibleNodes"
    """No node matches the placement's selector, tolerations and topology key."""
    TOPOLOGY_LABEL_MISSING: Final = "TopologyLabelMissing"
    """In Required mode, the eligible GPU nodes lack `placement.topologyKey`; the message names them."""

    # Metrics
    METRICS_FRESH: Final = "MetricsFresh"
    METRICS_STALE: Final = "MetricsStale"
    METRICS_MISSING: Final = "MetricsMissing"
    METRICS_QUERY_FAILED: Final = "MetricsQueryFailed"

    # Feasibility (SLOAttainable)
    DEMAND_FEASIBLE: Final = "DemandFeasible"
    """No class has more than a small share of its prompts past its feasible threshold."""
    INFEASIBLE_DEMAND: Final = "InfeasibleDemand"
    """A class has more of its prompts past the feasible threshold than the tolerated share."""
    CLASS_UNATTAINABLE: Final = "ClassUnattainable"
    """No request of a class can meet one of its targets on groups of this shape."""
    FEASIBILITY_UNKNOWN: Final = "FeasibilityUnknown"
    """No prompt lengths observed yet: nothing is counted infeasible."""

    # Forecast (Forecasting): whether the history gives a forecast; if not, the decision only reacts
    FORECAST_READY: Final = "ForecastReady"
    """A forecast one ready time ahead, with a margin measured on the history's own past errors."""
    HISTORY_TOO_SHORT: Final = "HistoryTooShort"
    """Less than a day, the horizon and the margin's hour of history: nothing to forecast from yet."""
    HISTORY_GAPS: Final = "HistoryGaps"
    """A gap in the history cut it shorter than a forecast needs."""
    HISTORY_RESET: Final = "HistoryReset"
    """The history runs back in time or holds a figure no work rate can have."""
    FORECAST_STALE: Final = "ForecastStale"
    """The history was last read too long ago to forecast from."""
    READY_TIME_UNKNOWN: Final = "ReadyTimeUnknown"
    """No `profile.readyTimeSeconds` and no group measured yet: no horizon to forecast at."""
    HISTORY_QUERY_FAILED: Final = "HistoryQueryFailed"
    """Prometheus did not answer the history query; the last forecaster is kept until it is stale."""


class Signal(StrEnum):
    """What proposed a count: each proposal's `signal`, and the winning one is the decision's signal.

    The first four match the keys of `SLOPolicy.spec.autoscaling.signals`.
    """

    QUEUE_WORK = "queueWork"
    SLACK = "slack"
    KV_CACHE = "kvCache"
    GOODPUT = "goodput"
    SCALE_FROM_ZERO = "scaleFromZero"
    """Engines report work at zero wanted groups (a group still draining or just scaled in)."""
    GATEWAY_QUEUE = "gatewayQueue"
    """Requests held in the gateway's queue at zero groups: what wakes a pool scaled to zero."""
    WARM_FLOOR = "warmFloor"
    MIN_REPLICAS = "minReplicas"
    FORECAST = "forecast"
    """The work the ModelGroup's history forecasts one ready time ahead, with its measured margin."""
    SCHEDULE = "schedule"
    """An open window of `spec.replicaSchedule`: the floor a team set for this time of day."""


class Guard(StrEnum):
    """A pipeline stage or safety rule that changed or held the count, recorded in `decisions[].guards`
    and as the reason of ScalingLimited; HPA's words where the meaning is HPA's."""

    TOLERANCE = "Tolerance"
    STALE_METRICS_HOLD_SCALE_IN = "StaleMetricsHoldScaleIn"
    MISSING_METRICS_HOLD_SCALE_IN = "MissingMetricsHoldScaleIn"
    STALE_METRICS_FREEZE = "StaleMetricsFreeze"
    SCALE_UP_STABILIZED = "ScaleUpStabilized"
    SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
    SCALE_UP_LIMIT = "ScaleUpLimit"
    SCALE_DOWN_LIMIT = "ScaleDownLimit"
    TOO_MANY_REPLICAS = "TooManyReplicas"
    TOO_FEW_REPLICAS = "TooFewReplicas"
    CAPACITY_COMING = "CapacityComing"
    """Groups still placing or warming were counted, so decisions do not stack."""
    UNSCHEDULABLE = "Unschedulable"
    SCALE_IN_UNSAFE = "ScaleInUnsafe"
    """The load spread over one group fewer would break the SLO or KV limits."""
    GOODPUT_AWAITING_EVIDENCE = "GoodputAwaitingEvidence"
    GOODPUT_NOT_IMPROVING = "GoodputNotImproving"
    FROZEN = "Frozen"


class EventReason:
    """`reason` of the Kubernetes Events the operator posts (on transitions only)."""

    SUCCESSFUL_RESCALE: Final = "SuccessfulRescale"
    FAILED_RESCALE: Final = "FailedRescale"
    ADVISORY_RESCALE: Final = "AdvisoryRescale"
    """A decision a policy in Advisory mode, or a shadow policy, would have applied."""
    GROUP_CREATED: Final = "GroupCreated"
    """Every pod (and the Service) of a new group was created and its gates released."""
    FAILED_CREATE: Final = "FailedCreate"
    """Creating a group's pod or Service failed; the message holds the API server's answer."""
    FAILED_DELETE: Final = "FailedDelete"
    """Deleting a group's pod or Service failed; the message holds the API server's answer."""
    FAILED_UPDATE: Final = "FailedUpdate"
    """Writing a group's readiness gate or drain mark failed; the message holds the API's answer."""
    GROUP_PLACED: Final = "GroupPlaced"
    GROUP_READY: Final = "GroupReady"
    GROUP_FAILED: Final = "GroupFailed"
    GROUP_DELETED: Final = "GroupDeleted"
    SCHEDULE_TIMEOUT: Final = "ScheduleTimeout"
    NODE_PROVISIONING_TIMEOUT: Final = "NodeProvisioningTimeout"
    """A group's new nodes did not come in time; the whole group was deleted (see Reason's)."""
    DRAIN_STARTED: Final = "DrainStarted"
    """A ready group was chosen for scale-in: its gate went False on every rank."""
    DRAIN_FINISHED: Final = "DrainFinished"
    """A draining group's leader went idle after routing stopped; every rank was deleted."""
    DRAIN_TIMED_OUT: Final = "DrainTimedOut"
    """A draining group reached `drain.maxSeconds` with requests in flight; they were aborted."""
    DRAIN_CANCELLED: Final = "DrainCancelled"
    """A scale-out put a whole, healthy draining group back in service instead of creating one."""
    ROLLOUT_STALLED: Final = "RolloutStalled"
    """Groups of the new pod template kept failing: the rollout stopped and old groups keep serving."""
    READINESS_WAITING: Final = "ReadinessWaiting"
    READY_PHASE_STALLED: Final = "ReadyPhaseStalled"
    """A starting group has been in one phase of its ready time (Scheduling, ContainerStart,
    WeightLoad, RankFormation, WarmUp) longer than its bound: the message names the phase."""
    CONTAINERS_NOT_STARTING: Final = "ContainersNotStarting"
    """A starting group's rank waits on something waiting does not fix (an image that cannot be
    pulled, a Secret or key that does not exist): the message names the rank and the spec field."""
    """A group's ranks all run but it is still not ready after a while: which rank waits for what."""
    INVALID_SPEC: Final = "InvalidSpec"
    POLICY_ACCEPTED: Final = "PolicyAccepted"
    SLO_UNATTAINABLE: Final = "SLOUnattainable"
    """SLOAttainable went False: a share of the demand cannot meet its SLO on groups of this shape."""
    SLO_ATTAINABLE: Final = "SLOAttainable"
    """SLOAttainable went back to True (or unknown) after being False."""


class NoFitReason(StrEnum):
    """Why no domain can take a new group: `Reason`'s placement words, as one type."""

    INSUFFICIENT_GPUS = Reason.INSUFFICIENT_GPUS
    DOMAINS_BACKED_OFF = Reason.DOMAINS_BACKED_OFF
    NO_ELIGIBLE_NODES = Reason.NO_ELIGIBLE_NODES
    TOPOLOGY_LABEL_MISSING = Reason.TOPOLOGY_LABEL_MISSING
    NODE_PROVISIONING_TIMEOUT = Reason.NODE_PROVISIONING_TIMEOUT


class Attainability(StrEnum):
    """The reason of the SLOAttainable verdict (`feasible_demand.attainability`): whether each
    class's demand can meet its SLO on groups of this shape."""

    DEMAND_FEASIBLE = Reason.DEMAND_FEASIBLE
    INFEASIBLE_DEMAND = Reason.INFEASIBLE_DEMAND
    CLASS_UNATTAINABLE = Reason.CLASS_UNATTAINABLE
    FEASIBILITY_UNKNOWN = Reason.FEASIBILITY_UNKNOWN


class AdmissionReason(StrEnum):
    """One vocabulary for why a request got its outcome: metric label, log field and response header."""

    ADMITTED = "Admitted"
    UNKNOWN_CLASS = "UnknownClass"
    PROMPT_OVER_CLASS_LIMIT = "PromptOverClassLimit"
    OUTPUT_OVER_CLASS_LIMIT = "OutputOverClassLimit"
    BEYOND_CONTEXT = "BeyondContext"
    INFEASIBLE = "Infeasible"
    KV_NEVER_FITS = "KvNeverFits"
    KV_HEADROOM = "KvHeadroom"
    DEADLINE = "Deadline"
    NO_READY_GROUP = "NoReadyGroup"
    TENANT_BUDGET = "TenantBudget"
    RETRY_BUDGET = "RetryBudget"


class RouteReason(StrEnum):
    """Why the request path sent a request to the group it chose: a metric label and log field."""

    SESSION = "Session"
    PREFIX = "PrefixAffinity"
    LEAST_WORK = "LeastWork"
    OVER_BUDGET = "LeastWorkOverBudget"


def vocabulary(namespace: type) -> dict[str, str]:
    """The constants of one namespace class above, by attribute name (for tests and metric setup)."""
    if issubclass(namespace, StrEnum):
        return {member.name: member.value for member in namespace}
    return {
        name: value for name, value in vars(namespace).items() if name.isupper() and isinstance(value, str)
    }
