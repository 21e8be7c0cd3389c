"""`goodput run`: the operator against the current kubeconfig (or the pod's service account)."""

from __future__ import annotations

import argparse
import logging

import kopf

from goodput.operator import settings as settings_module
from goodput.operator.autoscaler import AutoscalerSettings, register_autoscaler
from goodput.operator.handlers import Runtime, register
from goodput.operator.kube import KubeApi
from goodput.operator.metrics import OperatorMetrics

_LOG_FORMATS = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings_module.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    settings = settings_module.settings_from_args(args)
    # Logging is configured before kopf starts: its startup handlers run too late for that.
    kopf.configure(
        verbose=settings.verbose, log_format=_LOG_FORMATS[settings.log_format], log_refkey="object"
    )
    logging.getLogger("goodput").setLevel(logging.DEBUG if settings.verbose else logging.INFO)

    metrics = OperatorMetrics()
    runtime = Runtime(
        settings=settings,
        kube=KubeApi.from_environment(metrics, timeout_seconds=settings.kube_timeout_seconds),
        metrics=metrics,
    )
    registry = kopf.OperatorRegistry()
    register(registry, settings)
    register_autoscaler(registry, AutoscalerSettings.from_settings(settings))
    kopf.run(
        registry=registry,
        standalone=settings.standalone,
        priority=settings.priority,
        peering_name=settings.peering_name,
        liveness_endpoint=settings.liveness_endpoint,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        memo=kopf.Memo(runtime=runtime),
    )
    return 0
