"""`goodput run`: the operator against the current kubeconfig (or the pod's service account).

With leader election on, the process first waits as a follower (its metrics say `goodput_leader 0`,
its liveness endpoint answers) until it holds the Lease; only then does it start kopf, whose
handlers, timers and the autoscaler are everything that acts. It never gives the Lease up and goes
on: a leader that cannot renew ends the process (see `leader_election`).

A clean stop (SIGTERM, SIGINT) hands the Lease back whenever it comes: while following (the
candidate stops asking; a Lease it won meanwhile is released), between winning the Lease and kopf
taking the signals over (kopf is not started), while kopf runs or stops, and while the Lease is being
released (a second signal is only noted). The release runs however kopf ends, an exception included:
otherwise the next replica waits out the whole lease.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
from types import FrameType
from typing import Any

import kopf

from goodput.operator import leader_election
from goodput.operator import settings as settings_module
from goodput.operator.autoscaler import AutoscalerSettings
from goodput.operator.autoscaler_daemon import register_autoscaler
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

    stop = StopRequest()
    stop.catch()
    metrics = OperatorMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_address, settings.metrics_port)
    try:
        elector = elected(settings, stop) if settings.leader_election else None
    except ValueError as error:  # settings that cannot work: say which, act on nothing
        logging.getLogger("goodput").error("leader election: %s", error)
        return 2
    try:
        if not stop.requested:
            run_kopf(settings, metrics, elector, stop)
    finally:
        stop.catch()  # kopf may have ended before its cleanup took the signals back
        if elector is not None:
            elector.release()
        stop.ignore_from_now()
    return 0


def run_kopf(
    settings: Settings, metrics: OperatorMetrics, elector: leader_election.Elector | None, stop: StopRequest
) -> None:
    """The operator proper: kopf with the group controller's and the autoscaler's handlers."""
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
    kopf.on.cleanup(id="stop_signals_back", registry=registry)(stop.take_back_from_kopf)
    kopf.run(
        registry=registry,
        standalone=settings.standalone,
        priority=settings.priority,
        peering_name=settings.peering_name,
        liveness_endpoint=settings.liveness_endpoint,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        memo=kopf.Memo(runtime=runtime),
        stop_flag=stop.event,
    )


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class StopRequest:
    """SIGTERM or SIGINT, caught from the process's start to its end.

    kopf answers the signals only from the moment its event loop has its own handlers, and gives
    them back to the default action (exit at once) when that loop closes; before and after, a
    signal would end the process holding the Lease. Caught here instead, a signal is only noted
    (`requested`, and `event`, which kopf takes as its stop flag): the handler takes no lock, so
    it cannot deadlock whatever the main thread was doing when the signal came."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signal: int | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def catch(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._noted)

    async def take_back_from_kopf(self, **_: Any) -> None:
        """A kopf cleanup handler: the signals are caught here again before kopf's event loop closes,
        which would set them to the default action (a second SIGTERM during the Lease's release
        would then end the process before the release is sent). The stop flag is raised too: kopf,
        stopped by its own signal handler, would otherwise wait 5 s for the task that watches the
        flag to end, and the Lease would be released (and taken over) that much later."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
            signal.signal(signum, self._noted)
        self.event.set()

    def ignore_from_now(self) -> None:
        """Once the Lease is handed back, a further signal only repeats the request. Ignored, it
        cannot turn the clean exit into a death by signal while the interpreter shuts down (which
        gives every caught signal back to the default action)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def _noted(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum
        self.event.set()


def elected(settings: Settings, stop: StopRequest) -> leader_election.Elector:
    """Block as a follower until this process holds the Lease; then keep it in the background.
    A stop requested meanwhile ends the wait; the elector returned then holds the Lease only if a
    write already under way won it (`run` releases it)."""
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
        acquired = elector.acquire(until=lambda: stop.requested)
    if acquired and not stop.requested:
        elector.keep()
    return elector
