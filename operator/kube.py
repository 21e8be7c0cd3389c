"""The operator's Kubernetes writes, behind one small adapter over the `kubernetes` package.

The package loads the kubeconfig or the in-cluster service account and owns TLS and credentials;
requests go through its low-level API client with plain JSON bodies, so the manifests the pure
layer renders are sent as they are, without a round trip through generated model classes. Every
call is synchronous (the handlers run them with `asyncio.to_thread`), bounded by a timeout, counted
in the operator's metrics, and idempotent where the controller needs it: creating an object that
exists or deleting one that is gone is not an error.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import client, config
from urllib3.exceptions import HTTPError

from goodput.api.base import GROUP, STRATEGIC_MERGE_PATCH, VERSION
from goodput.controllers.ownership import status_owner, upgrade_patch

# goodput's own resources, as (group, version, plural): the handlers and the autoscaler name them alike.
MODEL_GROUPS = (GROUP, VERSION, "modelgroups")
SLO_POLICIES = (GROUP, VERSION, "slopolicies")

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "goodput"


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason


class KubeUnreachableError(KubeError):
    """No answer from the API server: refused, reset or timed out (during a restart of the API server
    or of etcd, a partition). Transient, and a KubeError, so every caller's handling of a refused
    request applies: the autoscaler retries after a short delay instead of its loop dying and kopf
    restarting it only after a daemon's backoff of a minute. A write that timed out may still have
    been applied; callers re-read before acting again."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "NoAnswer", message)


class RequestRecorder(Protocol):
    def kube_request(self, verb: str, resource: str, code: int) -> None: ...


class KubeApi:
    """The verbs the controllers need, on namespaced pods, services and goodput.dev objects."""

    def __init__(
        self,
        api_client: client.ApiClient,
        recorder: RequestRecorder | None = None,
        timeout_seconds: float = 15.0,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        """`before_write` runs before every request that is not a GET: the leader election's check
        that this replica still holds its Lease (it ends the process when it does not)."""
        self._client = api_client
        self._recorder = recorder
        self._timeout = (min(5.0, timeout_seconds), timeout_seconds)
        self._upgraded: set[tuple[str, str, str, str]] = set()
        self._before_write = before_write

    @classmethod
    def from_environment(
        cls,
        recorder: RequestRecorder | None = None,
        timeout_seconds: float = 15.0,
        before_write: Callable[[], None] | None = None,
    ) -> KubeApi:
        """In a pod: its service account; elsewhere: the current context of $KUBECONFIG or ~/.kube/config."""
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(), recorder, timeout_seconds, before_write)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, context: str | None) -> tuple[KubeApi, str]:
        """For a command run by a person: the client and the namespace of the context (default
        'default'). With neither a kubeconfig nor a context named, inside a pod: its service account."""
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                return cls(client.ApiClient()), "default"
            except config.ConfigException:
                pass
        config.load_kube_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        if context is not None:
            current = next((c for c in contexts if c.get("name") == context), current)
        namespace = ((current or {}).get("context") or {}).get("namespace") or "default"
        return cls(client.ApiClient()), str(namespace)

    def request(
        self,
        verb: str,
        resource: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """One API request; the decoded JSON response, KubeError for any non-2xx answer, or
        KubeUnreachableError (a KubeError) when there was no answer."""
        if verb != "GET" and self._before_write is not None:
            self._before_write()
        method, url, headers, payload, _ = self._client.param_serialize(
            method=verb,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._client.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=self._timeout
            )
            data = response.read()  # type: ignore[no-untyped-call]
        except (HTTPError, OSError) as error:
            raise KubeUnreachableError(f"{verb} {path}: {type(error).__name__}: {error}") from error
        if self._recorder is not None:
            self._recorder.kube_request(verb, resource, response.status)
        if not 200 <= response.status < 300:
            message = response.reason or ""
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(data).get("message", message)
            raise KubeError(response.status, response.reason or "", message)
        return json.loads(data) if data else None

    # Pods

    def create_pod(self, manifest: Mapping[str, Any]) -> bool:
        """Create a pod; False when it already exists."""
        namespace = manifest["metadata"]["namespace"]
        return self._create("pods", f"/api/v1/namespaces/{namespace}/pods", manifest)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod with its own grace period; a pod already gone is fine."""
        self._delete("pods", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def patch_pod(
        self, namespace: str, name: str, patch: Mapping[str, Any], content_type: str = MERGE_PATCH
    ) -> Any:
        return self.request(
            "PATCH",
            "pods",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            patch,
            content_type=content_type,
            query={"fieldManager": FIELD_MANAGER},
        )

    def patch_pod_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Any:
        """Strategic merge on pods/status: conditions merge by type, so the kubelet's stay."""
        return self.request(
            "PATCH",
            "pods/status",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            patch,
            content_type=STRATEGIC_MERGE_PATCH,
            query={"fieldManager": FIELD_MANAGER},
        )

    # Services

    def create_service(self, manifest: Mapping[str, Any]) -> bool:
        namespace = manifest["metadata"]["namespace"]
        return self._create("services", f"/api/v1/namespaces/{namespace}/services", manifest)

    def delete_service(self, namespace: str, name: str) -> None:
        self._delete("services", f"/api/v1/namespaces/{namespace}/services/{name}")

    # Events

    def create_event(self, manifest: Mapping[str, Any]) -> None:
        """Post a core v1 Event now (kopf's own posting is queued, and a kill can lose the queue)."""
        namespace = manifest["metadata"]["namespace"]
        self.request("POST", "events", f"/api/v1/namespaces/{namespace}/events", manifest)

    # Dynamic resource allocation

    def create_resource_claim_template(self, manifest: Mapping[str, Any]) -> bool:
        """Create a ResourceClaimTemplate; False when it already exists (its name carries its spec)."""
        namespace = manifest["metadata"]["namespace"]
        return self._create(
            "resourceclaimtemplates",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
            manifest,
        )

    # goodput.dev objects

    def patch_custom(
        self,
        plural: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> Any:
        """A JSON merge patch of a ModelGroup or SLOPolicy (or its status)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}"
        resource = plural
        if subresource:
            path += f"/{subresource}"
            resource += f"/{subresource}"
        return self.request(
            "PATCH", resource, path, patch, content_type=MERGE_PATCH, query={"fieldManager": FIELD_MANAGER}
        )

    def apply_custom_status(
        self, plural: str, namespace: str, name: str, body: Mapping[str, Any], *, field_manager: str
    ) -> Any:
        """Server-side apply of the status of a ModelGroup or SLOPolicy as `field_manager`.

        `body` (apiVersion, kind, metadata.name, and the status fields this controller owns) is the
        whole of what the manager asserts: fields and conditions it applied before and leaves out
        now are removed, those of other managers stay. `force` takes over a field another manager
        last set, since each field has one rightful owner."""
        self.upgrade_status_manager(plural, namespace, name, field_manager)
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}/status"
        return self.request(
            "PATCH",
            f"{plural}/status",
            path,
            json.dumps(body),  # JSON is YAML: sent as it is
            content_type=APPLY_PATCH,
            query={"fieldManager": field_manager, "force": "true"},
        )

    def upgrade_status_manager(self, plural: str, namespace: str, name: str, field_manager: str) -> None:
        """Once per object and manager: hand `field_manager` the status fields an older operator
        wrote as `goodput` (`ownership.upgrade_patch`), so its applies can remove them.

        The patch goes to the object itself: the API server takes managedFields from a request only
        there, never through a subresource. An object gone or changed since it was read is left for
        the next apply to try again.
        """
        key = (plural, namespace, name, field_manager)
        owner = status_owner(field_manager)
        if owner is None or key in self._upgraded:
            return
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}"
        try:
            current = self.request("GET", plural, path)
            patch = upgrade_patch((current or {}).get("metadata") or {}, owner)
            if patch:
                self.request(
                    "PATCH",
                    plural,
                    path,
                    patch,
                    content_type=JSON_PATCH,
                    query={"fieldManager": FIELD_MANAGER},
                )
        except KubeError as error:
            if error.status in {404, 409, 422}:
                return
            raise
        self._upgraded.add(key)

    def _create(self, resource: str, path: str, manifest: Mapping[str, Any]) -> bool:
        try:
            self.request("POST", resource, path, manifest, query={"fieldManager": FIELD_MANAGER})
        except KubeError as error:
            if error.status == 409:
                return False
            raise
        return True

    def _delete(self, resource: str, path: str) -> None:
        try:
            self.request("DELETE", resource, path, {"propagationPolicy": "Background"})
        except KubeError as error:
            if error.status != 404:
                raise
