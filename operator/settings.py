"""The operator's settings, in one place: each from a flag, else an environment variable, else a default.

Environment variables let a Deployment configure the operator without rewriting its command line;
flags win over them so a developer can override one setting at a time.
"""

from __future__ import annotations

import argparse
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from goodput.controllers.compile.scaling import DEFAULT_RATE_WINDOW_SECONDS
from goodput.controllers.leader_election import ElectionTiming

LogFormat = Literal["json", "plain", "full"]
# GOODPUT_PRIORITY / --priority value asking for a priority derived from the pod's name.
AUTO_PRIORITY = "auto"
POD_ID_ENV = "POD_ID"


@dataclass(frozen=True, slots=True)
class Settings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty watches every namespace (needs cluster-wide RBAC)."""
    standalone: bool = False
    """Run without peering: for tests and single-replica installs only."""
    peering_name: str = "goodput"
    """kopf peering object shared by the replicas; only the highest-priority replica acts."""
    leader_election: bool = False
    """Act only while holding a coordination.k8s.io Lease, so that of several replicas exactly one
    acts and another takes over when it dies; kopf then runs standalone (no peering)."""
    leader_election_namespace: str = ""
    """Namespace of the Lease; empty: the pod's own namespace."""
    leader_election_name: str = "goodput"
    """Name of the Lease the replicas compete for."""
    leader_election_identity: str = ""
    """This replica's name in the Lease; empty: the pod name (POD_ID) with a random suffix."""
    lease_duration_seconds: int = 15
    """How long a follower waits, after it last saw the Lease change, before it takes it over."""
    renew_deadline_seconds: float = 10.0
    """How long the leader may go without renewing before it stops acting (exits); shorter than the
    lease duration, so it has stopped before anyone may take over."""
    retry_period_seconds: float = 2.0
    """How often the leader renews and a follower tries to acquire."""
    priority: int = 0
    """This replica's peering priority; replicas must have distinct priorities ('auto': derived
    from the pod name in POD_ID, stable across restarts and distinct between replicas)."""
    log_format: LogFormat = "json"
    """Log line format: 'json' (one object per line), 'plain' or 'full'."""
    verbose: bool = False
    """Log at DEBUG level."""
    liveness_endpoint: str | None = "http://127.0.0.1:8081/healthz"
    """kopf's liveness endpoint for the pod's liveness probe; empty disables it."""
    metrics_address: str = "127.0.0.1"
    """Listen address of the operator's own Prometheus metrics."""
    metrics_port: int = 8082
    """Listen port of the operator's own Prometheus metrics; 0 disables them."""
    reconcile_interval_seconds: float = 3.0
    """Longest a ModelGroup waits between reconciles; pod and ModelGroup events wake it sooner."""
    min_reconcile_gap_seconds: float = 0.3
    """Shortest gap between two reconciles of one ModelGroup, so a burst of events costs one pass."""
    policy_interval_seconds: float = 5.0
    """How often each SLOPolicy's status (acceptance, bound ModelGroups) is recomputed."""
    warmup_retry_seconds: float = 5.0
    """Wait before retrying a failed warm-up request."""
    placement_backoff_seconds: float = 300.0
    """How long a topology domain is avoided after a group failed to schedule there."""
    drain_settle_seconds: float = 5.0
    """After a draining group's pods are verified gone from every Service's endpoints, how long
    routers get to notice before the leader's in-flight count is trusted to stay at zero."""
    kube_timeout_seconds: float = 15.0
    """Timeout of one Kubernetes API request made by the controllers."""
    prometheus_url: str = "http://127.0.0.1:9090"
    """Prometheus that scrapes the vLLM leaders; the autoscaler's only source of load."""
    prometheus_bearer_token_file: str = ""
    """File holding a bearer token sent with every query (a managed or multi-tenant Prometheus);
    read again for each query, so a rotated token (a projected ServiceAccount token) keeps working.
    Empty: no Authorization header."""
    prometheus_ca_file: str = ""
    """PEM bundle that verifies Prometheus' TLS certificate; empty: the system's CAs."""
    prometheus_headers: str = ""
    """Extra HTTP headers of every query as a JSON object, for example '{"X-Scope-OrgID": "ml"}'
    (Cortex, Mimir and Thanos tenants)."""
    prometheus_timeout_seconds: float = 5.0
    """A query slower than this counts as Prometheus being down (no scale-in, retried)."""
    prometheus_rate_window_seconds: float = DEFAULT_RATE_WINDOW_SECONDS
    """Window of token rates and the request mix; at least two scrape intervals. A policy whose
    queue-work drain target is longer reads over its drain target (`rate_window_seconds`)."""
    prometheus_batch_seconds: float = 0.5
    """How long the autoscaler gathers the reads of ModelGroups ticking at the same moment (ticks
    are aligned to the policy interval) into one Prometheus query per query shape; 0: one query per
    ModelGroup per interval."""
    prometheus_label_namespace: str = "namespace"
    """Series label holding the pod's namespace, as the user's Prometheus relabels it."""
    prometheus_label_model_group: str = "model_group"
    """Series label holding the pod's ModelGroup (from pod label goodput.dev/model-group)."""
    prometheus_label_group: str = "group"
    """Series label holding the pod's group (from pod label goodput.dev/group)."""
    autoscaler_state_refresh_seconds: float = 60.0
    """Longest the persisted decision state may lag while nothing in it changes."""
    agent_image: str = ""
    """Image of the GPU and NCCL health agent, injected as a sidecar into every rank of a ModelGroup
    whose readiness requires the NCCL check; empty: no agent is injected (its conditions must then
    come from elsewhere, or the ModelGroup sets `ncclCheck: Skip`)."""

    @classmethod
    def from_sources(cls, flags: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
        """Flags (None: not given) over GOODPUT_<FIELD> environment variables over the defaults."""
        values: dict[str, Any] = {}
        for spec in fields(cls):
            flag = flags.get(spec.name)
            raw = environ.get(f"GOODPUT_{spec.name.upper()}")
            if flag is not None:
                values[spec.name] = flag
            elif raw is not None:
                values[spec.name] = _parse(spec.name, raw, getattr(cls(), spec.name))
        if values.get("priority") == AUTO_PRIORITY:
            values["priority"] = auto_priority(environ.get(POD_ID_ENV, ""))
        if values.get("liveness_endpoint") == "":
            values["liveness_endpoint"] = None
        return cls(**values)

    def election_timing(self) -> ElectionTiming:
        """The Lease timing; ValueError naming the setting when it is unsafe."""
        return ElectionTiming(
            lease_duration_seconds=self.lease_duration_seconds,
            renew_deadline_seconds=self.renew_deadline_seconds,
            retry_period_seconds=self.retry_period_seconds,
        )


def auto_priority(pod_id: str) -> int:
    """A peering priority of one replica's own: a CRC-32 of its pod name, so replicas of one
    Deployment differ (kopf pauses every replica when the highest priority is shared) and a
    restarted pod keeps its priority."""
    if not pod_id:
        raise ValueError(f"GOODPUT_PRIORITY={AUTO_PRIORITY} needs the pod name in ${POD_ID_ENV}")
    return zlib.crc32(pod_id.encode()) & 0x7FFFFFFF


def _priority(raw: str) -> int | str:
    """--priority: an integer, or 'auto'."""
    if raw == AUTO_PRIORITY:
        return raw
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is neither an integer nor {AUTO_PRIORITY!r}") from None


def _parse(name: str, raw: str, default: object) -> object:
    if name == "priority" and raw == AUTO_PRIORITY:
        return raw
    if name == "namespaces":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if isinstance(default, bool):
        if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
            raise ValueError(f"GOODPUT_{name.upper()}={raw!r} is not a boolean")
        return raw.lower() in ("1", "true", "yes")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `goodput run`; each defaults to None so the environment or the default applies."""
    parser.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        help="namespace to watch (repeatable; default: every namespace) [GOODPUT_NAMESPACES]",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        default=None,
        help="run without peering (tests, single replica) [GOODPUT_STANDALONE]",
    )
    parser.add_argument("--peering-name", help="kopf peering name shared by replicas [GOODPUT_PEERING_NAME]")
    parser.add_argument(
        "--priority",
        type=_priority,
        help="peering priority of this replica, or 'auto' to derive it from $POD_ID [GOODPUT_PRIORITY]",
    )
    parser.add_argument(
        "--leader-elect",
        dest="leader_election",
        action="store_true",
        default=None,
        help="act only while holding the leader Lease [GOODPUT_LEADER_ELECTION]",
    )
    parser.add_argument(
        "--leader-election-namespace",
        help="namespace of the Lease (default: the pod's) [GOODPUT_LEADER_ELECTION_NAMESPACE]",
    )
    parser.add_argument("--leader-election-name", help="name of the Lease [GOODPUT_LEADER_ELECTION_NAME]")
    parser.add_argument(
        "--leader-election-identity",
        help="name in the Lease (default: $POD_ID_<random>) [GOODPUT_LEADER_ELECTION_IDENTITY]",
    )
    parser.add_argument(
        "--lease-duration",
        dest="lease_duration_seconds",
        type=int,
        help="seconds a follower waits before taking over [GOODPUT_LEASE_DURATION_SECONDS]",
    )
    parser.add_argument(
        "--renew-deadline",
        dest="renew_deadline_seconds",
        type=float,
        help="seconds the leader may go unrenewed before it exits [GOODPUT_RENEW_DEADLINE_SECONDS]",
    )
    parser.add_argument(
        "--retry-period",
        dest="retry_period_seconds",
        type=float,
        help="seconds between renewals and acquire attempts [GOODPUT_RETRY_PERIOD_SECONDS]",
    )
    parser.add_argument(
        "--log-format", choices=["json", "plain", "full"], help="log format [GOODPUT_LOG_FORMAT]"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=None, help="debug logging [GOODPUT_VERBOSE]"
    )
    parser.add_argument(
        "--liveness",
        dest="liveness_endpoint",
        help="liveness endpoint URL, empty to disable [GOODPUT_LIVENESS_ENDPOINT]",
    )
    parser.add_argument(
        "--metrics-address", help="listen address of the operator's metrics [GOODPUT_METRICS_ADDRESS]"
    )
    parser.add_argument(
        "--metrics-port", type=int, help="port of the operator's metrics, 0 disables [GOODPUT_METRICS_PORT]"
    )
    parser.add_argument(
        "--reconcile-interval",
        dest="reconcile_interval_seconds",
        type=float,
        help="seconds between reconciles of a ModelGroup [GOODPUT_RECONCILE_INTERVAL_SECONDS]",
    )
    parser.add_argument(
        "--policy-interval",
        dest="policy_interval_seconds",
        type=float,
        help="seconds between SLOPolicy status updates [GOODPUT_POLICY_INTERVAL_SECONDS]",
    )


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    flags = dict(vars(args))
    if flags.get("namespaces") is not None:
        flags["namespaces"] = tuple(flags["namespaces"])
    return Settings.from_sources(flags, os.environ if environ is None else environ)
