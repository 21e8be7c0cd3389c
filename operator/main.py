"""`goodput run`: the operator against the current kubeconfig (or the pod's service account).

With leader election on, the process first waits as a follower (its metrics say `goodput_leader 0`,
its liveness endpoint answers) until it holds the Lease; only then does it start kopf, whose
handlers, timers and the autoscaler are everything that acts. It never gives the Lease up and goes
on: a leader that cannot renew ends the process (see `leader_election`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os

import kopf

from goodput.operator import leader_election
from goodput.operator import settings as settings_module
from goodput.operator.autoscaler import AutoscalerSettings, register_autoscaler
from goodput.operator.handlers import Runtime, register
from goodput.operator.kube import KubeApi
from goodput.operator.metrics import OperatorMetrics
from goodput.operator.settings import POD_ID_ENV, Settings

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
    if settings.metrics_port:
        metrics.serve(settings.metrics_address, settings.metrics_port)
    try:
        elector = elected(settings) if settings.leader_election else None
    except ValueError as error:  # settings that cannot work: say which, act on nothing
        logging.getLogger("goodput").error("leader election: %s", error)
        return 2
    if elector is not None:
        # The Lease decides who acts; kopf's peering would only add a second, slower opinion.
        settings = dataclasses.replace(settings, standalone=True)
    metrics.leader.set(1)
    runtime = Runtime(
        settings=settings,
        kube=KubeApi.from_environment(
            metrics,
            timeout_seconds=settings.kube_timeout_seconds,
            before_write=None if elector is None else elector.check,
        ),
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
    if elector is not None:
        elector.release()
    return 0


def elected(settings: Settings) -> leader_election.Elector:
    """Block as a follower until this process holds the Lease; then keep it in the background."""
    timing = settings.election_timing()
    namespace = leader_election.lease_namespace(settings.leader_election_namespace)
    identity = settings.leader_election_identity or leader_election.default_identity(
        os.environ.get(POD_ID_ENV, "")
    )
    # A Lease request may not outlast the time a renewal has left; its own client, never gated.
    kube = KubeApi.from_environment(timeout_seconds=timing.renew_deadline_seconds / 3)
    elector = leader_election.Elector(
        identity, leader_election.LeaseStore(kube, namespace, settings.leader_election_name), timing
    )
    with leader_election.serving_liveness(settings.liveness_endpoint):
        elector.acquire()
    elector.keep()
    return elector
