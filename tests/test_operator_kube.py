"""The operator's Kubernetes adapter when the API server does not answer (a restart, a partition).

Real `kubernetes` clients against loopback sockets: one port where nothing listens (refused), one
that accepts connections and never answers (a read timeout). No answer must surface as a KubeError,
which every caller already handles (the autoscaler retries after a short delay, the group loop
records the failed write, the elector counts a failed round), and not as a urllib3 exception that
ends a loop.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from goodput.controllers.leader_election import ElectionTiming
from goodput.operator.kube import KubeApi, KubeError, KubeUnreachableError
from goodput.operator.leader_election import Elector, LeaseStore


def api_at(port: int, timeout_seconds: float = 0.5) -> KubeApi:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0  # one attempt: the adapter's caller decides when to try again
    return KubeApi(client.ApiClient(configuration), timeout_seconds=timeout_seconds)


@pytest.fixture
def refusing_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections into its backlog and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


@pytest.mark.parametrize("verb", ["GET", "PATCH"])
def test_a_refused_connection_is_a_kube_error_naming_the_request(refusing_port: int, verb: str) -> None:
    with pytest.raises(KubeUnreachableError) as raised:
        api_at(refusing_port).request(verb, "modelgroups", "/apis/goodput.dev/v1alpha1/modelgroups", {})
    assert isinstance(raised.value, KubeError) and raised.value.status == 0
    assert f"{verb} /apis/goodput.dev/v1alpha1/modelgroups" in str(raised.value)


def test_an_api_server_that_never_answers_is_a_kube_error_within_the_timeout(silent_port: int) -> None:
    started = time.monotonic()
    with pytest.raises(KubeUnreachableError) as raised:
        api_at(silent_port, timeout_seconds=0.3).request("GET", "pods", "/api/v1/pods")
    assert time.monotonic() - started < 5.0
    assert "Timeout" in str(raised.value)


def test_an_elector_counts_an_unreachable_api_server_as_a_failed_round(refusing_port: int) -> None:
    elector = Elector("a", LeaseStore(api_at(refusing_port), "goodput", "lease"), ElectionTiming())
    assert elector.try_acquire_or_renew() is False
    assert not elector.leading
