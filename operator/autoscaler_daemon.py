"""The autoscaler's kopf wiring: one daemon per bound ModelGroup, the SLOPolicy index it reads,
and the start and stop of the shared executors and metrics batch (`register_autoscaler`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from goodput.controllers.events import EventRecord
from goodput.operator.autoscaler import (
    ACT_CONCURRENCY,
    RECORD_CONCURRENCY,
    Autoscaler,
    AutoscalerSettings,
    PolicyIndex,
    log,
)
from goodput.operator.autoscaler_metrics import AutoscalerMetrics
from goodput.operator.kube import MODEL_GROUPS, SLO_POLICIES, KubeError
from goodput.operator.metrics_batch import BatchedMetricsSource
from goodput.operator.metrics_source import (
    PrometheusMetricsSource,
)


def is_bound(spec: Mapping[str, Any]) -> bool:
    return bool(spec.get("policyRef") or spec.get("shadowPolicyRef"))


def register_autoscaler(registry: kopf.OperatorRegistry, settings: AutoscalerSettings) -> None:
    """Register the autoscaler's handlers: start and stop, the SLOPolicy index, the daemon."""
    _register_lifecycle(registry, settings)
    _register_policy_index(registry)
    _register_daemon(registry)


def _register_lifecycle(registry: kopf.OperatorRegistry, settings: AutoscalerSettings) -> None:
    @kopf.on.startup(id="autoscaler_start", registry=registry)
    async def start(*, memo: Any, **_: Any) -> None:
        runtime = memo.runtime
        metrics = AutoscalerMetrics(runtime.metrics.registry)
        reader = PrometheusMetricsSource(
            settings.prometheus_url,
            settings.labels,
            timeout_seconds=settings.prometheus_timeout_seconds,
            connection=settings.prometheus_connection,
        )
        acts = ThreadPoolExecutor(ACT_CONCURRENCY, thread_name_prefix="autoscaler-act")
        records = ThreadPoolExecutor(RECORD_CONCURRENCY, thread_name_prefix="autoscaler-record")
        queries = ThreadPoolExecutor(1, thread_name_prefix="autoscaler-prometheus")
        source = BatchedMetricsSource(
            reader,
            gather_seconds=settings.prometheus_batch_seconds,
            on_query=metrics.count_query,
            executor=queries,
        )
        # the forecast's week of history is read on a thread of its own, never in the snapshots' way
        histories = ThreadPoolExecutor(1, thread_name_prefix="autoscaler-history")
        memo.autoscaler = Autoscaler(
            runtime.kube,
            source,
            metrics,
            settings,
            executor=acts,
            record_executor=records,
            history=reader,
            history_executor=histories,
        )
        memo.autoscaler_executors = (acts, records, queries, histories)
        log.info("autoscaler reading Prometheus at %s", settings.prometheus_url)

    @kopf.on.cleanup(id="autoscaler_stop", registry=registry)
    async def stop(*, memo: Any, **_: Any) -> None:
        autoscaler: Autoscaler | None = getattr(memo, "autoscaler", None)
        if autoscaler is not None and isinstance(autoscaler.source, BatchedMetricsSource):
            reader = autoscaler.source.reader
            if isinstance(reader, PrometheusMetricsSource):
                reader.close()
        for executor in getattr(memo, "autoscaler_executors", ()):
            executor.shutdown(wait=False, cancel_futures=True)


def _register_policy_index(registry: kopf.OperatorRegistry) -> None:
    @kopf.index(*SLO_POLICIES, id="autoscaler_slo_policies", registry=registry)
    async def slo_policies(
        *, body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        return {
            (namespace or "", name): {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "metadata": {"name": name, "namespace": namespace, "generation": body.meta.get("generation")},
                "spec": dict(body.get("spec") or {}),
            }
        }


def _register_daemon(registry: kopf.OperatorRegistry) -> None:
    @kopf.daemon(
        *MODEL_GROUPS,
        id="autoscaler",
        when=lambda spec, **_: is_bound(spec),
        cancellation_timeout=10,
        registry=registry,
    )
    async def autoscale(
        *,
        body: kopf.Body,
        name: str,
        namespace: str | None,
        memo: Any,
        stopped: kopf.DaemonStopped,
        **kwargs: Any,
    ) -> None:
        autoscaler: Autoscaler = memo.autoscaler
        policies: PolicyIndex = kwargs["autoscaler_slo_policies"]
        where = namespace or ""

        def post(events: Sequence[EventRecord]) -> None:
            memo.runtime.post_events(body, events)

        try:
            while not stopped:
                outcome = await autoscaler.tick(where, name, policies, post, watched=body)
                await stopped.wait(outcome.delay_seconds(autoscaler.clock()))
        finally:
            await _stop_daemon(autoscaler, where, name, stopped.reason)


async def _stop_daemon(
    autoscaler: Autoscaler, namespace: str, name: str, reason: kopf.DaemonStoppingReason | None
) -> None:
    """A deleted ModelGroup is forgotten; one that no longer names a policy is also told so."""
    reason = reason or kopf.DaemonStoppingReason.DONE
    if kopf.DaemonStoppingReason.RESOURCE_DELETED in reason:
        autoscaler.forget(namespace, name)
    elif kopf.DaemonStoppingReason.FILTERS_MISMATCH in reason:
        autoscaler.forget(namespace, name)
        with contextlib.suppress(kopf.TemporaryError, KubeError, OSError):
            await autoscaler.unbind(namespace, name)
