"""Leader election for the operator's replicas: the Lease I/O and the process-level guarantees.

The rules (who creates, renews, takes over or waits, and when a holder must stop) live in
`goodput.controllers.leader_election`. This module reads and writes the Lease, and makes the
guarantee that matters hold in the process: once the renew deadline has passed without a successful
renewal, nothing more is written. Three things enforce it, because any one alone leaves a gap:

- a watchdog thread that exits the process the moment the deadline passes (a partition from the
  API server, a renewal that hangs);
- a check before every write the controllers send (`KubeApi(before_write=...)`), so a worker thread
  that wakes up late cannot write on a lease that has run out;
- a SIGCONT handler: a process stopped past its deadline (SIGSTOP, a frozen VM, a long GC pause of
  the whole process) checks first thing when it resumes; Python runs signal handlers in the main
  thread, where kopf's event loop and its own writes run, before that thread does anything else.

Losing the Lease ends the process with `EXIT_LEADERSHIP_LOST` (as client-go's controllers exit):
nothing of the leader's in-memory state is trusted again, and the Deployment restarts the
container as a follower. A clean stop (SIGTERM) releases the Lease so the next replica need not wait.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import random
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from goodput.controllers.leader_election import (
    RETRY_JITTER_FRACTION,
    ElectionTiming,
    LeaseRecord,
    Observation,
    Step,
    claimed,
    decide,
    leadership_lost,
    lease_object,
    observe,
    record_of,
    released,
)
from goodput.operator.kube import KubeApi, KubeError

# EX_TEMPFAIL: the process is fine, its leadership is not; restarting it (as a follower) is the cure.
EXIT_LEADERSHIP_LOST = 75
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCHDOG_PERIOD_SECONDS = 0.1
# How often a waiting follower asks whether the process is stopping.
STOP_CHECK_PERIOD_SECONDS = 0.1

log = logging.getLogger("goodput.leader_election")


class LeaseStorage(Protocol):
    """Where the Lease is kept: the API server (`LeaseStore`), or a stand-in in tests."""

    namespace: str
    name: str

    def read(self) -> tuple[LeaseRecord, str] | None: ...
    def create(self, record: LeaseRecord) -> str | None: ...
    def replace(self, record: LeaseRecord, resource_version: str) -> str | None: ...


class LeaseStore:
    """One Lease, read and written whole; writes are conditional on the resourceVersion read."""

    def __init__(self, kube: KubeApi, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def read(self) -> tuple[LeaseRecord, str] | None:
        """The Lease's record and resourceVersion; None when it does not exist."""
        try:
            found = self.kube.request("GET", "leases", f"{self._collection}/{self.name}")
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        return record_of(found), str(found["metadata"]["resourceVersion"])

    def create(self, record: LeaseRecord) -> str | None:
        """Create the Lease holding `record`; its resourceVersion, or None when another was faster."""
        body = lease_object(self.name, self.namespace, record)
        return self._write("POST", self._collection, body)

    def replace(self, record: LeaseRecord, resource_version: str) -> str | None:
        """Replace the Lease if nobody wrote it since `resource_version`; None when someone did."""
        body = lease_object(self.name, self.namespace, record, resource_version)
        return self._write("PUT", f"{self._collection}/{self.name}", body)

    def _write(self, verb: str, path: str, body: dict[str, object]) -> str | None:
        try:
            written = self.kube.request(verb, "leases", path, body)
        except KubeError as error:
            if error.status == 409:
                return None
            raise
        return str(written["metadata"]["resourceVersion"])


def exit_process(code: int) -> None:
    """Leave at once: no cleanup handler may write anything more."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class Elector:
    """One candidate: acquires the Lease, keeps it, and ends the process when it cannot."""

    identity: str
    store: LeaseStorage
    timing: ElectionTiming
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    on_lost: Callable[[int], None] = exit_process
    observation: Observation | None = None
    renewal_sent_at_seconds: float | None = None
    """When the last successful write of the Lease by this candidate was sent (monotonic)."""
    _stopping: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def leading(self) -> bool:
        sent = self.renewal_sent_at_seconds
        return sent is not None and not leadership_lost(sent, self.clock(), self.timing)

    def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, decide, write if the rules allow. True when this candidate
        holds the Lease afterwards. API errors count as a failed round (retried)."""
        sent_at = self.clock()
        try:
            found = self.store.read()
            if found is not None:
                self.observation = observe(self.observation, found[0], found[1], sent_at)
            step = decide(self.identity, None if found is None else self.observation, self.clock())
            if step is Step.WAIT:
                return False
            current = None if found is None else found[0]
            record = claimed(step, self.identity, current, self.wall_clock(), self.timing)
            if step is Step.CREATE or self.observation is None:
                version = self.store.create(record)
            else:
                version = self.store.replace(record, self.observation.resource_version)
        except (KubeError, OSError, ValueError) as error:
            log.warning("leader election: the Lease could not be read or written: %s", error)
            return False
        if version is None:
            return False
        self.observation = Observation(record, version, sent_at)
        self.renewal_sent_at_seconds = sent_at
        if step is not Step.RENEW:
            log.info(
                "leader election: %s holds Lease %s/%s (%s, transition %d)",
                self.identity, self.store.namespace, self.store.name, step.value, record.lease_transitions,
            )  # fmt: skip
        return True

    def acquire(self, until: Callable[[], bool] = lambda: False) -> bool:
        """Block, as a follower, until this candidate holds the Lease (True), or until `until()`
        says to stop asking (False: the process is stopping). It is asked between rounds and
        several times a second while waiting, so a stopping follower is not held a retry period."""
        log.info(
            "leader election: %s waits for Lease %s/%s",
            self.identity, self.store.namespace, self.store.name,
        )  # fmt: skip
        while not until():
            if self.try_acquire_or_renew():
                return True
            holder = self.observation.record.holder_identity if self.observation else ""
            log.debug("leader election: held by %r; retrying", holder)
            waited_until = time.monotonic() + self._jittered_retry()
            while not until() and (left_seconds := waited_until - time.monotonic()) > 0:
                time.sleep(min(left_seconds, STOP_CHECK_PERIOD_SECONDS))
        return False

    def keep(self) -> None:
        """Renew in the background, with the watchdog and the resume check armed."""
        signal.signal(signal.SIGCONT, lambda *_: self.check())
        for target, name in ((self._renew_loop, "lease-renewer"), (self._watchdog, "lease-watchdog")):
            thread = threading.Thread(target=target, daemon=True, name=name)
            thread.start()
            self._threads.append(thread)

    def check(self) -> None:
        """Before acting: end the process unless the Lease is still this candidate's."""
        if not self.leading:
            self._lose("its renew deadline passed before it could act")

    def release(self) -> None:
        """Stop renewing and hand the Lease back, so the next replica takes it at once."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=self.timing.renew_deadline_seconds)
        if not self.leading or self.observation is None:
            return
        with contextlib.suppress(KubeError, OSError):
            record = released(self.observation.record, self.wall_clock())
            if self.store.replace(record, self.observation.resource_version) is not None:
                log.info("leader election: %s released the Lease", self.identity)

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.timing.retry_period_seconds):
            if self.try_acquire_or_renew() or self._stopping.is_set():
                continue
            holder = self.observation.record.holder_identity if self.observation else ""
            if holder and holder != self.identity:
                self._lose(f"{holder} holds the Lease now")

    def _watchdog(self) -> None:
        while not self._stopping.wait(WATCHDOG_PERIOD_SECONDS):
            self.check()

    def _lose(self, why: str) -> None:
        log.critical(
            "leader election: %s lost Lease %s/%s (%s); exiting without acting further",
            self.identity, self.store.namespace, self.store.name, why,
        )  # fmt: skip
        self.on_lost(EXIT_LEADERSHIP_LOST)

    def _jittered_retry(self) -> float:
        """The retry period and up to its jitter more, so candidates started together do not collide."""
        return self.timing.retry_period_seconds * (1 + RETRY_JITTER_FRACTION * random.random())


def lease_namespace(configured: str) -> str:
    """The configured namespace, else the pod's own (from its ServiceAccount mount)."""
    if configured:
        return configured
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    raise ValueError(
        "leader_election_namespace: not set and not running in a pod; "
        "pass --leader-election-namespace or GOODPUT_LEADER_ELECTION_NAMESPACE"
    )


def default_identity(pod_id: str) -> str:
    """The pod's name (or the host's) and a random suffix: a restarted container is a new candidate
    and never mistakes the Lease of its previous life for its own."""
    return f"{pod_id or os.uname().nodename}_{os.urandom(4).hex()}"


@contextlib.contextmanager
def serving_liveness(endpoint: str | None) -> Iterator[None]:
    """While following, answer the liveness probe that kopf answers once it runs: a follower is
    alive, and a kubelet restarting it every few minutes would only delay a takeover."""
    if not endpoint:
        yield
        return
    url = urllib.parse.urlsplit(endpoint)
    path = url.path or "/"

    class Alive(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path.split("?")[0] == path
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Alive)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="follower-liveness")
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
