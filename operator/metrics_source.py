"""The autoscaler's observation of one ModelGroup: its groups from the cluster, their engine metrics
from Prometheus, as one `ModelGroupSnapshot`.

Prometheus is read with prometheus-api-client in one instant query (`promql.snapshot_query`), with
a timeout and no retries: a Prometheus that is down or slow raises `MetricsUnavailableError` at once and
the caller decides nothing (it never scales in on what it cannot see). At fleet size the ModelGroups
due at about the same moment share one query (`promql.fleet_snapshot_query`, sent by
`metrics_batch.BatchedMetricsSource`), whose answer `split_by_model_group` cuts into each
ModelGroup's part. Everything after the query is pure: `parse_query_result` splits the answer by
group, `group_metrics` turns one group's series into `GroupMetrics`, and `build_snapshot` joins them
with the group states of `status.groups`.

Nothing is guessed. A ready group whose engine gauges are absent (its target is down, or not scraped
yet) keeps its place in the snapshot with no metrics, so the decision's missing-metrics guard holds
the count; a group whose series are old carries their age, for the stale-metrics guard. Groups
wanted (`spec.replicas`) but not yet created are capacity on its way, like a placing group, and
unschedulable while the group controller reports that none can be placed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import requests
import requests.auth
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError
from urllib3.util.retry import Retry

from goodput.api.labels import SERVING_POOL
from goodput.api.modelgroup import GroupStatus, ModelGroup, ModelGroupStatus
from goodput.controllers.autoscale.model import (
    GatewayClassFigures,
    GatewayObservation,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
)
from goodput.controllers.autoscale.ready_time import estimate_ready_time
from goodput.controllers.autoscale.snapshot import (
    ModelGroupCounts,
    aligned,
    capacity_view,
    clamped,
    model_group_snapshot,
    unplaceable,
)
from goodput.controllers.compile.scaling import CompiledPolicy, drain_target_seconds
from goodput.controllers.compile.scaling import rate_window_seconds as rate_window
from goodput.controllers.pools import pool_named
from goodput.estimators.attainment import Histogram
from goodput.operator.promql import (
    GATEWAY_CLASS_LABEL,
    GATEWAY_QUANTITIES,
    HISTOGRAM_QUANTITIES,
    QUERY_LABEL,
    QueryQuantity,
    SeriesLabels,
    Windows,
    fleet_snapshot_query,
    snapshot_query,
)

# Without these a group has no engine metrics: the gauges every decision reads, and their age.
REQUIRED_QUANTITIES = (
    QueryQuantity.WAITING,
    QueryQuantity.RUNNING,
    QueryQuantity.KV_USAGE,
    QueryQuantity.SAMPLE_AGE,
)


@dataclass(frozen=True, slots=True)
class MetricsReading:
    """One answer of the snapshot query: the engines' metrics per ready group, and the gateway's
    view when a gateway in front of the ModelGroup exports its series (None otherwise)."""

    groups: dict[str, GroupMetrics] = field(default_factory=dict)
    gateway: GatewayObservation | None = None


class MetricsUnavailableError(RuntimeError):
    """Prometheus could not answer (down, slow, or an error): nothing is known about the load.
    `kind`: 'unreachable' (no connection: asking again for fewer ModelGroups cannot help),
    'timeout' (no answer in time), or 'answer' (an error or an answer that is not a vector)."""

    def __init__(self, message: str, *, kind: Literal["unreachable", "timeout", "answer"] = "answer") -> None:
        super().__init__(message)
        self.kind = kind


ModelGroupKey = tuple[str, str]
"""A ModelGroup's namespace and name."""


@dataclass(frozen=True, slots=True)
class GroupSeries:
    """One group's answers: a value per quantity, and (le, count) pairs per histogram."""

    values: dict[QueryQuantity, float] = field(default_factory=dict)
    buckets: dict[QueryQuantity, list[tuple[float, float]]] = field(default_factory=dict)


def _number(text: object) -> float | None:
    """A sample value; NaN (0/0 over an empty window) is no value."""
    try:
        value = float(str(text))
    except ValueError:
        return None
    return None if math.isnan(value) else value


def parse_query_result(result: Sequence[Mapping[str, Any]], labels: SeriesLabels) -> dict[str, GroupSeries]:
    """The answer of `snapshot_query`, by group name. Series without a group or a known quantity
    (another exporter's labels, a newer query) are ignored."""
    groups: dict[str, GroupSeries] = {}
    for series in result:
        metric = series.get("metric") or {}
        group = metric.get(labels.group)
        try:
            quantity = QueryQuantity(str(metric.get(QUERY_LABEL, "")))
        except ValueError:
            continue
        sample = series.get("value") or (None, None)
        value = _number(sample[1]) if len(sample) == 2 else None
        if not group or value is None:
            continue
        entry = groups.setdefault(group, GroupSeries())
        if quantity in HISTOGRAM_QUANTITIES:
            bound = _number(metric.get("le"))
            if bound is not None:
                entry.buckets.setdefault(quantity, []).append((bound, value))
        else:
            entry.values[quantity] = value
    return groups


def histogram_from_buckets(pairs: Sequence[tuple[float, float]]) -> Histogram | None:
    """A window's histogram from its cumulative `le` buckets; None without the +Inf bucket.

    `increase()` extrapolates each bucket series on its own, so neighbouring counts can cross by a
    fraction; the running maximum restores the cumulative order.
    """
    ordered = sorted(pairs)
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    counts: list[float] = []
    running = 0.0
    for _, count in ordered:
        running = max(running, count, 0.0)
        counts.append(running)
    return Histogram(tuple(bound for bound, _ in ordered[:-1]), tuple(counts))


def group_metrics(series: GroupSeries) -> GroupMetrics | None:
    """One group's `GroupMetrics`, or None when its engine gauges are absent."""
    values = series.values
    if any(quantity not in values for quantity in REQUIRED_QUANTITIES):
        return None

    def histogram(quantity: QueryQuantity) -> Histogram | None:
        pairs = series.buckets.get(quantity)
        return histogram_from_buckets(pairs) if pairs else None

    return clamped(
        GroupMetrics(
            age_seconds=values[QueryQuantity.SAMPLE_AGE],
            waiting_requests=values[QueryQuantity.WAITING],
            running_requests=values[QueryQuantity.RUNNING],
            kv_usage_fraction=values[QueryQuantity.KV_USAGE],
            prompt_tokens_per_second=values.get(QueryQuantity.PROMPT_TOKENS_RATE, 0.0),
            generation_tokens_per_second=values.get(QueryQuantity.GENERATION_TOKENS_RATE, 0.0),
            prompt_tokens_sum=values.get(QueryQuantity.PROMPT_TOKENS_SUM, 0.0),
            prompt_tokens_count=values.get(QueryQuantity.PROMPT_TOKENS_COUNT, 0.0),
            prompts_started=values.get(QueryQuantity.PROMPTS_STARTED, 0.0),
            prompt_tokens_started=values.get(QueryQuantity.PROMPT_TOKENS_STARTED, 0.0),
            generation_tokens_sum=values.get(QueryQuantity.GENERATION_TOKENS_SUM, 0.0),
            generation_tokens_count=values.get(QueryQuantity.GENERATION_TOKENS_COUNT, 0.0),
            prefix_hits=values.get(QueryQuantity.PREFIX_HITS, 0.0),
            prefix_queries=values.get(QueryQuantity.PREFIX_QUERIES, 0.0),
            finished_requests=values.get(QueryQuantity.FINISHED, 0.0),
            aborted_requests=values.get(QueryQuantity.ABORTED, 0.0),
            rejected_requests=values.get(QueryQuantity.REJECTED, 0.0),
            ttft=histogram(QueryQuantity.TTFT_BUCKETS),
            itl=histogram(QueryQuantity.ITL_BUCKETS),
            queue_time=histogram(QueryQuantity.QUEUE_TIME_BUCKETS),
            tpot=histogram(QueryQuantity.TPOT_BUCKETS),
            prompt_tokens=histogram(QueryQuantity.PROMPT_TOKENS_BUCKETS),
            prompt_tokens_lookback=histogram(QueryQuantity.PROMPT_TOKENS_LOOKBACK_BUCKETS),
        )
    )


def metrics_by_group(result: Sequence[Mapping[str, Any]], labels: SeriesLabels) -> dict[str, GroupMetrics]:
    """Every group's metrics in a `snapshot_query` answer; groups without engine gauges are left out."""
    parsed = {group: group_metrics(series) for group, series in parse_query_result(result, labels).items()}
    return aligned({group: metrics for group, metrics in parsed.items() if metrics is not None})


def _gateway_series(
    result: Sequence[Mapping[str, Any]],
) -> tuple[dict[QueryQuantity, float], dict[str, GroupSeries]]:
    """The gateway's answers: the ModelGroup-wide values, and per SLO class a `GroupSeries`."""
    overall: dict[QueryQuantity, float] = {}
    classes: dict[str, GroupSeries] = {}
    for series in result:
        metric = series.get("metric") or {}
        try:
            quantity = QueryQuantity(str(metric.get(QUERY_LABEL, "")))
        except ValueError:
            continue
        sample = series.get("value") or (None, None)
        value = _number(sample[1]) if len(sample) == 2 else None
        if quantity not in GATEWAY_QUANTITIES or value is None:
            continue
        class_name = metric.get(GATEWAY_CLASS_LABEL)
        if not class_name:
            overall[quantity] = value
            continue
        entry = classes.setdefault(str(class_name), GroupSeries())
        if quantity in HISTOGRAM_QUANTITIES:
            bound = _number(metric.get("le"))
            if bound is not None:
                entry.buckets.setdefault(quantity, []).append((bound, value))
        else:
            entry.values[quantity] = value
    return overall, classes


def _class_figures(class_name: str, series: GroupSeries) -> GatewayClassFigures:
    values = series.values

    def count(quantity: QueryQuantity) -> float:
        value = values.get(quantity, 0.0)
        return max(0.0, value) if math.isfinite(value) else 0.0

    def histogram(quantity: QueryQuantity) -> Histogram | None:
        pairs = series.buckets.get(quantity)
        return histogram_from_buckets(pairs) if pairs else None

    slack = values.get(QueryQuantity.GATEWAY_EARLIEST_SLACK)
    admitted, rejected = count(QueryQuantity.GATEWAY_ADMITTED), count(QueryQuantity.GATEWAY_REJECTED)
    waiting = count(QueryQuantity.GATEWAY_QUEUED_REQUESTS)
    return GatewayClassFigures(
        class_name=class_name,
        waiting_requests=waiting,
        waiting_prompt_tokens=count(QueryQuantity.GATEWAY_QUEUED_PROMPT_TOKENS),
        waiting_work_seconds=count(QueryQuantity.GATEWAY_QUEUED_WORK),
        # +Inf is the gateway's "nothing waits"; -Inf (nothing serves what waits) is kept.
        earliest_slack_seconds=None if slack is None or waiting == 0 or slack == math.inf else slack,
        offered_requests=admitted + rejected,
        admitted_requests=admitted,
        rejected_requests=rejected,
        infeasible_requests=count(QueryQuantity.GATEWAY_INFEASIBLE),
        attaining_requests=count(QueryQuantity.GATEWAY_ATTAINING),
        missed_requests=count(QueryQuantity.GATEWAY_MISSED),
        ttft=histogram(QueryQuantity.GATEWAY_TTFT_BUCKETS),
        itl=histogram(QueryQuantity.GATEWAY_ITL_BUCKETS),
        recent_offered_per_second=(
            count(QueryQuantity.GATEWAY_OFFERED_RECENT)
            if QueryQuantity.GATEWAY_OFFERED_RECENT in values
            else None
        ),
    )


def gateway_from_result(result: Sequence[Mapping[str, Any]]) -> GatewayObservation | None:
    """The gateway's view in a `snapshot_query` answer; None when no gateway exports the
    ModelGroup's series (its sample age, read from a gauge every gateway writes, is absent)."""
    overall, classes = _gateway_series(result)
    age = overall.get(QueryQuantity.GATEWAY_SAMPLE_AGE)
    if age is None or not math.isfinite(age):
        return None

    def value(quantity: QueryQuantity) -> float:
        number = overall.get(quantity, 0.0)
        return max(0.0, number) if math.isfinite(number) else 0.0

    return GatewayObservation(
        age_seconds=max(0.0, age),
        classes=tuple(_class_figures(name, series) for name, series in sorted(classes.items())),
        running_requests=value(QueryQuantity.GATEWAY_RUNNING_REQUESTS),
        running_work_seconds=value(QueryQuantity.GATEWAY_RUNNING_WORK),
        routable_groups=round(value(QueryQuantity.GATEWAY_ROUTABLE_GROUPS)),
        kept_session_kv_tokens=value(QueryQuantity.GATEWAY_KEPT_SESSION_KV),
    )


def reading_from_result(result: Sequence[Mapping[str, Any]], labels: SeriesLabels) -> MetricsReading:
    """Both views of one `snapshot_query` answer."""
    return MetricsReading(metrics_by_group(result, labels), gateway_from_result(result))


def split_by_model_group(
    result: Sequence[Mapping[str, Any]], labels: SeriesLabels
) -> dict[ModelGroupKey, list[Mapping[str, Any]]]:
    """A `fleet_snapshot_query` answer cut into each ModelGroup's series, by their namespace and
    ModelGroup labels; a series without both belongs to no ModelGroup and is dropped."""
    parts: dict[ModelGroupKey, list[Mapping[str, Any]]] = {}
    for series in result:
        metric = series.get("metric") or {}
        namespace, model_group = metric.get(labels.namespace), metric.get(labels.model_group)
        if namespace and model_group:
            parts.setdefault((str(namespace), str(model_group)), []).append(series)
    return parts


def readings_by_model_group(
    keys: Sequence[ModelGroupKey], result: Sequence[Mapping[str, Any]], labels: SeriesLabels
) -> dict[ModelGroupKey, MetricsReading]:
    """Each asked ModelGroup's reading from one fleet answer. A ModelGroup without series in it gets
    an empty reading (its ready groups have no metrics: the missing-metrics guard holds its count),
    never an error: one ModelGroup's absent series say nothing about the others'."""
    parts = split_by_model_group(result, labels)
    return {key: reading_from_result(parts.get(key, []), labels) for key in keys}


def pool_groups(status: ModelGroupStatus, pool: str) -> tuple[GroupStatus, ...]:
    """The groups of `status.groups` in `pool` (a record without a pool is an older operator's,
    whose groups are all the serving pool's)."""
    return tuple(group for group in status.groups if (group.pool or SERVING_POOL) == pool)


def _observed(
    status: ModelGroupStatus, metrics: Mapping[str, GroupMetrics], pool: str
) -> list[GroupObservation]:
    """The pool's groups of `status.groups`, with the metrics of the ready ones."""
    return [
        GroupObservation(
            name=group.name,
            state=group.state,
            created_at=group.created_at.timestamp(),
            metrics=metrics.get(group.name) if group.state == "Ready" else None,
        )
        for group in pool_groups(status, pool)
    ]


def group_counts(
    model_group: ModelGroup, status: ModelGroupStatus, pool: str = SERVING_POOL
) -> ModelGroupCounts:
    """One pool's counts as the spec and the group controller's status say."""
    declared = pool_named(model_group.spec, pool)
    return ModelGroupCounts(
        spec_replicas=declared.replicas,
        min_replicas=declared.min_replicas,
        max_replicas=declared.max_replicas,
        outdated=frozenset(group.name for group in pool_groups(status, pool) if group.outdated),
        unschedulable=unplaceable(status.conditions),
    )


def group_observations(
    model_group: ModelGroup,
    status: ModelGroupStatus,
    metrics: Mapping[str, GroupMetrics],
    *,
    now: float,
    pool: str = SERVING_POOL,
) -> tuple[GroupObservation, ...]:
    """The pool's groups of `status.groups` with the metrics of the ready ones, plus the groups
    wanted but not created yet (see the module docstring)."""
    return capacity_view(_observed(status, metrics, pool), group_counts(model_group, status, pool), now=now)


def build_snapshot(
    model_group: ModelGroup,
    status: ModelGroupStatus,
    compiled: CompiledPolicy,
    metrics: Mapping[str, GroupMetrics],
    *,
    now: float,
    gateway: GatewayObservation | None = None,
    pool: str = SERVING_POOL,
) -> ModelGroupSnapshot:
    """The snapshot of one pool of `model_group` (the serving pool: the ModelGroup's only one)."""
    return model_group_snapshot(
        _observed(status, metrics, pool),
        group_counts(model_group, status, pool),
        profile=compiled.profile,
        policy=compiled.policy,
        name=model_group.metadata.name or "",
        metrics_window_seconds=compiled.metrics_window_seconds,
        now=now,
        gateway=gateway,
        ready_time=estimate_ready_time(
            model_group.spec.profile.ready_time_seconds if model_group.spec.profile is not None else None,
            measured_ready_seconds(status),
        ),
    )


def measured_ready_seconds(status: ModelGroupStatus) -> list[float]:
    """The recent groups' ready times: `status.readyTime.recent`, and any group serving now that is
    not in it yet (a status written before the record existed)."""
    recent = status.ready_time.recent if status.ready_time is not None else ()
    recorded = {sample.group for sample in recent}
    current = [
        group.ready_time.total_seconds
        for group in status.groups
        if group.ready_time is not None and group.name not in recorded
    ]
    return [sample.total_seconds for sample in recent] + current


def query_windows(compiled: CompiledPolicy, rate_window_seconds: float) -> Windows:
    """The rate window (the setting, or the policy's drain target where longer), never longer than
    the policy's goodput window."""
    histogram = max(1, round(compiled.metrics_window_seconds))
    drain = drain_target_seconds(compiled.policy)
    return Windows(
        rate_seconds=max(1, round(rate_window(histogram, rate_window_seconds, drain))),
        histogram_seconds=histogram,
    )


@dataclass(frozen=True, slots=True)
class PrometheusConnection:
    """How every query reaches Prometheus beyond its URL: a bearer token, a CA bundle, extra headers."""

    bearer_token_file: str = ""
    ca_file: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_settings(
        cls, *, bearer_token_file: str, ca_file: str, headers_json: str
    ) -> PrometheusConnection:
        """Checked at start-up, so a typo stops the operator with the setting's name, not every query."""
        headers: tuple[tuple[str, str], ...] = ()
        if headers_json.strip():
            try:
                parsed = json.loads(headers_json)
            except ValueError as error:
                raise ValueError(f"GOODPUT_PROMETHEUS_HEADERS is not a JSON object: {error}") from None
            if not isinstance(parsed, dict) or not all(
                isinstance(key, str) and isinstance(value, str) for key, value in parsed.items()
            ):
                raise ValueError(
                    "GOODPUT_PROMETHEUS_HEADERS must be a JSON object of strings, "
                    'e.g. {"X-Scope-OrgID": "ml"}'
                )
            headers = tuple(sorted(parsed.items()))
        for name, path in (("BEARER_TOKEN_FILE", bearer_token_file), ("CA_FILE", ca_file)):
            if path and not Path(path).is_file():
                raise ValueError(f"GOODPUT_PROMETHEUS_{name}={path!r} is not a readable file")
        return cls(bearer_token_file, ca_file, headers)

    def session(self) -> requests.Session:
        session = requests.Session()
        session.verify = self.ca_file or True
        session.headers.update(dict(self.headers))
        if self.bearer_token_file:
            session.auth = _BearerTokenFile(Path(self.bearer_token_file))
        return session


class _BearerTokenFile(requests.auth.AuthBase):
    """`Authorization: Bearer <token>` read from a file at each request: rotated tokens keep working."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.path.read_text().strip()}"
        return request


class PrometheusMetricsSource:
    """Reads one ModelGroup's engine series from Prometheus (blocking; call it from a thread)."""

    def __init__(
        self,
        url: str,
        labels: SeriesLabels,
        *,
        timeout_seconds: float,
        connection: PrometheusConnection | None = None,
    ) -> None:
        self.url = url
        self.labels = labels
        self.timeout_seconds = timeout_seconds
        self._session = (connection or PrometheusConnection()).session()
        # No retries: the decision interval is the retry, and a slow answer is as useless as none.
        self._client = PrometheusConnect(
            url=url,
            retry=Retry(total=0, connect=0, read=0, redirect=0),
            timeout=timeout_seconds,
            session=self._session,
        )

    def read(self, namespace: str, model_group: str, windows: Windows) -> MetricsReading:
        """One ModelGroup's reading, in a query of its own."""
        return reading_from_result(
            self.query(snapshot_query(self.labels, namespace, model_group, windows)), self.labels
        )

    def read_fleet(
        self, keys: Sequence[ModelGroupKey], windows: Windows
    ) -> dict[ModelGroupKey, MetricsReading]:
        """The readings of `keys`, all of one query shape, in one query for every ModelGroup."""
        return readings_by_model_group(
            keys, self.query(fleet_snapshot_query(self.labels, windows)), self.labels
        )

    def query(self, query: str) -> list[Mapping[str, Any]]:
        """The series of one instant query (the snapshot's, or `goodput doctor`'s probes), sent as
        every query of the autoscaler is: same session, token, CA, headers and timeout."""
        try:
            result = self._client.custom_query(query)
        except requests.RequestException as error:
            raise self._unavailable(error) from error
        except OSError as error:  # the bearer token file, read for each query
            raise MetricsUnavailableError(
                f"Prometheus at {self.url}: cannot read the bearer token: {_short(error)}"
            ) from error
        except (PrometheusApiClientException, ValueError, KeyError) as error:
            raise MetricsUnavailableError(f"Prometheus at {self.url} failed: {_short(error)}") from error
        if not isinstance(result, list):
            raise MetricsUnavailableError(
                f"Prometheus at {self.url} answered a {type(result).__name__}, not a vector"
            )
        return result

    def history(
        self, query: str, *, start: float, end: float, step_seconds: float
    ) -> list[tuple[float, float]]:
        """The samples of a range query's one series, (time, value), oldest first; none when
        Prometheus holds nothing. Values Prometheus writes as NaN stay NaN: the forecaster names them."""
        try:
            result = self._client.custom_query_range(
                query,
                datetime.fromtimestamp(start, UTC),
                datetime.fromtimestamp(end, UTC),
                f"{step_seconds:g}s",
            )
        except requests.RequestException as error:
            raise self._unavailable(error) from error
        except OSError as error:
            raise MetricsUnavailableError(
                f"Prometheus at {self.url}: cannot read the bearer token: {_short(error)}"
            ) from error
        except (PrometheusApiClientException, ValueError, KeyError) as error:
            raise MetricsUnavailableError(f"Prometheus at {self.url} failed: {_short(error)}") from error
        return history_from_result(result, self.url)

    def _unavailable(self, error: requests.RequestException) -> MetricsUnavailableError:
        """What went wrong, without the query (the URL of a failed request repeats all of it)."""
        cause = getattr(error.args[0], "reason", None) if error.args else None
        # urllib3's NewConnectionError (refused, no route) subclasses its ConnectTimeoutError.
        if isinstance(cause, NewConnectionError):
            return MetricsUnavailableError(
                f"Prometheus at {self.url} is unreachable: {str(cause).rsplit(': ', 1)[-1]}",
                kind="unreachable",
            )
        if isinstance(error, requests.Timeout) or isinstance(cause, ReadTimeoutError | ConnectTimeoutError):
            return MetricsUnavailableError(
                f"Prometheus at {self.url} did not answer within {self.timeout_seconds:g}s", kind="timeout"
            )
        what = _short(cause) if cause is not None else type(error).__name__
        return MetricsUnavailableError(f"Prometheus at {self.url} failed: {what}")

    def close(self) -> None:
        self._client.close()


def history_from_result(result: object, url: str) -> list[tuple[float, float]]:
    """A range query's matrix as one series of (time, value); MetricsUnavailableError when the
    answer is not a matrix of at most one series of number pairs."""
    if not isinstance(result, list) or len(result) > 1:
        raise MetricsUnavailableError(f"Prometheus at {url} answered the history query with no single series")
    if not result:
        return []
    try:
        return [(float(at), float(value)) for at, value in result[0]["values"]]
    except (KeyError, TypeError, ValueError) as error:
        raise MetricsUnavailableError(
            f"Prometheus at {url} answered a malformed matrix: {_short(error)}"
        ) from error


def _short(error: BaseException, limit: int = 300) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
