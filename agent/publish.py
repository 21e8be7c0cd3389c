"""Publishing what the agent found on its own pod: conditions, the revision annotation.

`condition_changes` and `annotation_changes` are pure: given the pod as the API server has it and
what the agent wants published, they return only what differs, so an unchanged verdict costs one
GET and no write. Pod conditions are patched with a strategic merge on `pods/status` (the list
merges by `type`, so the kubelet's and the operator's conditions are left alone);
`lastTransitionTime` moves only when the status flips. A refused write is retried with capped
exponential backoff, a bounded number of times; the next round tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from goodput.api.base import STRATEGIC_MERGE_PATCH
from goodput.api.conditions import ConditionStatus
from goodput.api.times import rfc3339_seconds

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class PodCondition:
    type: str
    status: ConditionStatus
    reason: str
    message: str


def condition_changes(
    pod: Mapping[str, Any], wanted: Sequence[PodCondition], now: datetime
) -> list[dict[str, str]]:
    """The condition entries to patch: those whose status, reason or message differ from the pod's."""
    current = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or ()}
    changes = []
    for condition in wanted:
        message = condition.message[:MAX_MESSAGE_CHARS]
        old = current.get(condition.type)
        if old and (old.get("status"), old.get("reason"), old.get("message", "")) == (
            condition.status,
            condition.reason,
            message,
        ):
            continue
        same_status = old is not None and old.get("status") == condition.status
        transition = old.get("lastTransitionTime") if old and same_status else None
        changes.append(
            {
                "type": condition.type,
                "status": condition.status,
                "reason": condition.reason,
                "message": message,
                "lastProbeTime": rfc3339_seconds(now),
                "lastTransitionTime": transition or rfc3339_seconds(now),
            }
        )
    return changes


def annotation_changes(pod: Mapping[str, Any], wanted: Mapping[str, str]) -> dict[str, str]:
    current = (pod.get("metadata") or {}).get("annotations") or {}
    return {key: value for key, value in wanted.items() if current.get(key) != value}


class PodApi(Protocol):
    """The three calls the agent makes, all on its own pod."""

    def get(self) -> Mapping[str, Any]: ...

    def patch_status(self, body: Mapping[str, Any]) -> None: ...

    def patch(self, body: Mapping[str, Any]) -> None: ...


class KubernetesPodApi:
    """PodApi over the `kubernetes` package, with the pod's projected service-account token."""

    def __init__(self, namespace: str, name: str, timeout_seconds: float = 10.0) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        self._api = client.CoreV1Api()
        self._namespace = namespace
        self._name = name
        self._timeout = timeout_seconds

    def get(self) -> Mapping[str, Any]:
        pod = self._api.read_namespaced_pod(self._name, self._namespace, _request_timeout=self._timeout)
        result: Mapping[str, Any] = self._api.api_client.sanitize_for_serialization(pod)
        return result

    def patch_status(self, body: Mapping[str, Any]) -> None:
        self._api.patch_namespaced_pod_status(
            self._name,
            self._namespace,
            dict(body),
            _content_type=STRATEGIC_MERGE_PATCH,
            _request_timeout=self._timeout,
        )

    def patch(self, body: Mapping[str, Any]) -> None:
        self._api.patch_namespaced_pod(
            self._name,
            self._namespace,
            dict(body),
            _content_type=STRATEGIC_MERGE_PATCH,
            _request_timeout=self._timeout,
        )


@dataclass(frozen=True, slots=True)
class PublishBackoff:
    attempts: int = 5
    first_seconds: float = 0.5
    max_seconds: float = 8.0

    def delays(self) -> list[float]:
        return [
            min(self.max_seconds, self.first_seconds * 2**attempt) for attempt in range(self.attempts - 1)
        ]


def with_backoff(
    call: Callable[[], Any], what: str, backoff: PublishBackoff, stopped: threading.Event
) -> bool:
    """Runs `call` until it succeeds or the attempts are spent; False (logged) if it never did."""
    for delay in [*backoff.delays(), None]:
        try:
            call()
            return True
        except Exception as error:  # the API server refused, timed out or is unreachable
            if delay is None:
                log.error("%s failed after %d attempts: %s", what, backoff.attempts, error)
                return False
            log.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
            if stopped.wait(delay):
                return False
    return False


class Publisher:
    def __init__(
        self, api: PodApi, backoff: PublishBackoff = PublishBackoff(), stopped: threading.Event | None = None
    ) -> None:
        self._api = api
        self._backoff = backoff
        self._stopped = stopped or threading.Event()

    def read_pod(self) -> Mapping[str, Any] | None:
        result: list[Mapping[str, Any]] = []
        ok = with_backoff(
            lambda: result.append(self._api.get()), "reading the pod", self._backoff, self._stopped
        )
        return result[0] if ok else None

    def publish(
        self, conditions: Sequence[PodCondition], annotations: Mapping[str, str], now: datetime
    ) -> Mapping[str, Any] | None:
        """Writes what changed; returns the pod as read (for the caller's annotations), None if the
        pod could not be read."""
        pod = self.read_pod()
        if pod is None:
            return None
        changed = condition_changes(pod, conditions, now)
        if changed:
            body = {"status": {"conditions": changed}}
            if with_backoff(
                lambda: self._api.patch_status(body), "patching pod conditions", self._backoff, self._stopped
            ):
                for condition in changed:
                    log.info(
                        "%s=%s %s: %s",
                        condition["type"],
                        condition["status"],
                        condition["reason"],
                        condition["message"],
                    )
        new_annotations = annotation_changes(pod, annotations)
        if new_annotations:
            metadata = {"metadata": {"annotations": new_annotations}}
            if with_backoff(
                lambda: self._api.patch(metadata), "annotating the pod", self._backoff, self._stopped
            ):
                log.info("annotated %s", new_annotations)
        return pod
