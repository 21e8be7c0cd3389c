"""The one vocabulary of condition types, reasons, signals, guards and Event reasons.

Conditions, Events, decision records, logs and metric labels all draw from here, so a reason seen
in `kubectl describe` is the same string as in a Prometheus label or a JSON log line. Reasons are
CamelCase and specific (API conventions: "`Started` is not a good reason"); every value matches the
metav1.Condition reason pattern. Add new words here, never inline.
"""

from __future__ import annotations

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
    """The decision was cut by minReplicas/maxReplicas, a step limit, stabilisation or capacity."""
    METRICS_AVAILABLE: Final = "MetricsAvailable"
    """The metrics behind the signals are present and fresh."""
    ACCEPTED: Final = "Accepted"
    """SLOPolicy: the spec was read and compiled; groups may bind to it."""


class Reason:
    """`status.conditions[].reason` values, and the `reason` of a recorded scaling decision."""

    # Spec and policy
    INVALID_SPEC: Final = "InvalidSpec"
    """The spec breaks a rule that only the operator can check; it is not acted on."""
    ACCEPTED: Final = "Accepted"
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
    STABLE: Final = "Stable"
    GROUP_FAILED: Final = "GroupFailed"
    SCHEDULE_TIMEOUT: Final = "ScheduleTimeout"
    DRAIN_TIMEOUT: Final = "DrainTimeout"
    NCCL_UNHEALTHY: Final = "NcclUnhealthy"
    REVISION_MISMATCH: Final = "RevisionMismatch"
    WARMUP_FAILED: Final = "WarmupFailed"

    # Scaling (ScalingActive, ScalingLimited, decisions); HPA's words where the meaning is HPA's
    SIGNALS_COMPUTED: Final = "SignalsComputed"
    DESIRED_WITHIN_RANGE: Final = "DesiredWithinRange"
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


class Signal:
    """Names of the scaling signals: a decision's winning `signal` and each proposal's `signal`.

    The first four match the keys of `SLOPolicy.spec.autoscaling.signals`.
    """

    QUEUE_WORK: Final = "queueWork"
    SLACK: Final = "slack"
    KV_CACHE: Final = "kvCache"
    GOODPUT: Final = "goodput"
    WARM_FLOOR: Final = "warmFloor"
    MIN_REPLICAS: Final = "minReplicas"
    CURRENT: Final = "current"
    """No signal proposed a change; the current count holds."""


class Guard:
    """Safety guards a decision passed through, recorded in `decisions[].guards` when they acted."""

    STALE_METRICS_HOLD_SCALE_IN: Final = "StaleMetricsHoldScaleIn"
    STALE_METRICS_FREEZE: Final = "StaleMetricsFreeze"
    COMING_CAPACITY: Final = "ComingCapacity"
    """Groups still placing or warming were counted, so decisions do not stack."""
    UNSCHEDULABLE: Final = "Unschedulable"
    SCALE_IN_UNSAFE: Final = "ScaleInUnsafe"
    """The load spread over one group fewer would break the SLO or KV limits."""
    TOLERANCE: Final = "Tolerance"
    STABILIZATION: Final = "Stabilization"
    STEP_LIMIT: Final = "StepLimit"
    CLAMP_MIN: Final = "ClampMin"
    CLAMP_MAX: Final = "ClampMax"
    ADVISORY: Final = "Advisory"
    FROZEN: Final = "Frozen"


class EventReason:
    """`reason` of the Kubernetes Events the operator posts (on transitions only)."""

    SUCCESSFUL_RESCALE: Final = "SuccessfulRescale"
    FAILED_RESCALE: Final = "FailedRescale"
    ADVISORY_RESCALE: Final = "AdvisoryRescale"
    """A decision a policy in Advisory mode, or a shadow policy, would have applied."""
    GROUP_CREATED: Final = "GroupCreated"
    GROUP_PLACED: Final = "GroupPlaced"
    GROUP_READY: Final = "GroupReady"
    GROUP_FAILED: Final = "GroupFailed"
    GROUP_DELETED: Final = "GroupDeleted"
    SCHEDULE_TIMEOUT: Final = "ScheduleTimeout"
    DRAIN_STARTED: Final = "DrainStarted"
    """A ready group was chosen for scale-in: its gate went False on every rank."""
    DRAIN_FINISHED: Final = "DrainFinished"
    """A draining group's leader went idle after routing stopped; every rank was deleted."""
    DRAIN_TIMED_OUT: Final = "DrainTimedOut"
    """A draining group reached `drain.maxSeconds` with requests in flight; they were aborted."""
    DRAIN_CANCELLED: Final = "DrainCancelled"
    """A scale-out put a whole, healthy draining group back in service instead of creating one."""
    INVALID_SPEC: Final = "InvalidSpec"
    POLICY_ACCEPTED: Final = "PolicyAccepted"


def vocabulary(namespace: type) -> dict[str, str]:
    """The constants of one namespace class above, by attribute name (for tests and metric setup)."""
    return {
        name: value for name, value in vars(namespace).items() if name.isupper() and isinstance(value, str)
    }
