"""The endpoint picker's story (issue 43, item 3), against the real API server with the InferencePool
CRD of the Gateway API Inference Extension's pinned release installed (tools/build-binaries.sh
fetches it from the release's Go module).

A team applies an InferencePool that names no goodput ModelGroup: every request the proxy hands the
picker is answered 503, naming the pool and the field. They fix the pool's selector: the picker,
still the same process, picks the ModelGroup's Ready leader; the request sent there (as the proxy
would) is answered by the engine, and the answer, passed back through the picker, is counted in the
gateway's series the autoscaler reads.

No Envoy runs here: the test plays the proxy with a gRPC client built from Envoy's published
ext-proc definitions (xds-protos) and sends the request to the endpoint the picker chose itself.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import test_autoscaler
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from test_autoscaler import Stage, model_group, slo_policy

from goodput.api.labels import LABEL_MODEL_GROUP, LABEL_RANK, LEADER_RANK
from goodput.testbed.cluster.controlplane import LocalCluster, free_ports
from goodput.testbed.cluster.processes import log_tail, stop_child
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import operator_metric

pytestmark = pytest.mark.e2e

NAME = "chat"
POLICY = "interactive"
POOL = "chat-pool"
DESTINATION = "x-gateway-destination-endpoint"

stage = test_autoscaler.stage


@pytest.fixture
def inference_pool_crd(cluster: LocalCluster) -> None:
    """The InferencePool CRD of the pinned inference extension release, applied and Established."""
    crds = cluster.bin_dir / "inference-crds"
    if not crds.is_dir():
        pytest.fail(f"{crds} is missing: run tools/build-binaries.sh (it fetches the CRD)", pytrace=False)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/inferencepools.inference.networking.k8s.io",
    )


def inference_pool(namespace: str, labels: dict[str, str], port: int) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": POOL, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "goodput-endpoint-picker", "port": {"number": 9002}},
        },
    }


@dataclass
class Picker:
    """`goodput gateway endpoint-picker` on the host, as a separate process, for the test's pool."""

    cluster: LocalCluster
    namespace: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    metrics_port: int = 0

    def __enter__(self) -> Picker:
        self.port, self.metrics_port = free_ports(2)
        argv = [
            sys.executable,
            "-m",
            "goodput.operator.cli",
            "gateway",
            "endpoint-picker",
            f"--pool={POOL}",
            f"--namespace={self.namespace}",
            "--listen-host=127.0.0.1",
            f"--grpc-port={self.port}",
            f"--metrics-port={self.metrics_port}",
        ]
        environment = {"KUBECONFIG": self.cluster.kubeconfig, "PATH": "/usr/bin:/bin"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
        return self

    def wait_serving(self, timeout_seconds: float = 60.0) -> None:
        """Until the gRPC service accepts a connection (the process has imported and bound)."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout_seconds)
            except grpc.FutureTimeoutError:
                raise TimeoutError(
                    f"the picker did not serve in {timeout_seconds:g}s:\n{self.log()}"
                ) from None

    def __exit__(self, *_: object) -> None:
        stop_child(self.process, grace_seconds=10)

    def log(self) -> str:
        return log_tail(self.log_path, 30)

    def exchange(self, messages: list[ext_proc.ProcessingRequest]) -> list[ext_proc.ProcessingResponse]:
        """One whole stream: every message sent, every answer read (the stream ends with them)."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = ext_proc_grpc.ExternalProcessorStub(channel)
            return list(stub.Process(iter(messages), timeout=30))

    def metric(self, name: str, **labels: str) -> float:
        value = operator_metric(self.metrics_port, name, {"model_group": NAME, **labels})
        return 0.0 if value is None else value


def headers(pairs: list[tuple[str, str]]) -> ext_proc.HttpHeaders:
    return ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]
        )
    )


REQUEST = {"model": "llama", "prompt": "Hello", "max_tokens": 4}


def request_messages() -> list[ext_proc.ProcessingRequest]:
    return [
        ext_proc.ProcessingRequest(
            request_headers=headers([(":method", "POST"), (":path", "/v1/completions")])
        ),
        ext_proc.ProcessingRequest(
            request_body=ext_proc.HttpBody(body=json.dumps(REQUEST).encode(), end_of_stream=True)
        ),
    ]


def refusal(answers: list[ext_proc.ProcessingResponse]) -> tuple[int, str]:
    last = answers[-1]
    if not last.HasField("immediate_response"):
        return 0, ""
    return last.immediate_response.status.code, json.loads(last.immediate_response.body)["error"]["message"]


def picked(answers: list[ext_proc.ProcessingResponse]) -> str | None:
    last = answers[-1]
    if not last.HasField("request_body"):
        return None
    mutation = last.request_body.response.header_mutation
    header: str | None = {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}.get(
        DESTINATION
    )
    metadata = last.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value
    assert header == metadata, (header, metadata)
    return header


def leader_endpoints(stage: Stage, port: int) -> set[str]:
    selector = f"{LABEL_MODEL_GROUP}={NAME},{LABEL_RANK}={LEADER_RANK}"
    pods = stage.cluster.api.get(f"/api/v1/namespaces/{stage.namespace}/pods?labelSelector={selector}") or {}
    return {f"{pod['status']['podIP']}:{port}" for pod in pods.get("items", []) if pod["status"].get("podIP")}


def test_a_pool_naming_no_modelgroup_is_refused_by_name_and_once_fixed_its_leader_serves(
    stage: Stage, inference_pool_crd: None, tmp_path: Path
) -> None:
    group = model_group(NAME, stage.namespace, replicas=1, policy=POLICY)
    stage.apply(slo_policy(POLICY, stage.namespace, mode="Frozen"), group)
    port = int(stage.model_group(NAME)["spec"]["engine"].get("port", 8000))
    stage.apply(inference_pool(stage.namespace, {"app": "vllm"}, port))
    with Picker(stage.cluster, stage.namespace, tmp_path / "picker.log") as picker:
        picker.wait_serving()
        wait_for(
            lambda: refusal(picker.exchange(request_messages()))[0] == 503,
            timeout_seconds=60,
            interval_seconds=0.5,
            describe=lambda: f"the picker refusing for the unnamed pool\n{picker.log()}",
        )
        status, message = refusal(picker.exchange(request_messages()))
        assert (
            status == 503 and f"InferencePool {stage.namespace}/{POOL} names no goodput ModelGroup" in message
        )

        stage.wait_ready_groups(NAME, 1, timeout_seconds=120)
        leader = {LABEL_MODEL_GROUP: NAME, LABEL_RANK: LEADER_RANK}
        stage.apply(inference_pool(stage.namespace, leader, port))
        wait_for(
            lambda: picked(picker.exchange(request_messages())) is not None,
            timeout_seconds=60,
            interval_seconds=0.5,
            describe=lambda: f"the picker picking a leader of {NAME}\n{picker.log()}",
        )

        # One request as the proxy carries it: the pick, the engine's answer, the answer back.
        outgoing: queue.Queue[ext_proc.ProcessingRequest | None] = queue.Queue()
        for message in request_messages():
            outgoing.put(message)
        with grpc.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
            stub = ext_proc_grpc.ExternalProcessorStub(channel)
            answers = stub.Process(iter(outgoing.get, None), timeout=60)
            endpoint = picked([next(answers), next(answers)])
            assert endpoint in leader_endpoints(stage, port), (endpoint, leader_endpoints(stage, port))
            request = urllib.request.Request(
                f"http://{endpoint}/v1/completions",
                data=json.dumps(REQUEST).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert reply.status == 200
                answer = reply.read()
            outgoing.put(ext_proc.ProcessingRequest(response_headers=headers([(":status", "200")])))
            shown = next(answers).response_headers.response.header_mutation.set_headers
            assert {o.header.key: o.header.raw_value.decode() for o in shown}[
                "X-Goodput-Outcome"
            ] == "admitted"
            outgoing.put(
                ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=answer, end_of_stream=True))
            )
            assert next(answers).HasField("response_body")
            outgoing.put(None)
            assert list(answers) == []
        assert json.loads(answer)["usage"]["completion_tokens"] > 0
        # The one answered request is observed, as the gateway observes what it relays; every pick
        # was offered and admitted in the gateway's series.
        labels = {"slo_class": "chat"}
        wait_for(
            lambda: picker.metric("goodput_gateway_e2e_request_latency_seconds_count", **labels) == 1,
            timeout_seconds=10,
            describe=lambda: f"the answer counted\n{picker.log()}",
        )
        assert picker.metric("goodput_gateway_requests_offered_total", tenant="default", **labels) >= 2
        assert picker.process is not None and picker.process.poll() is None  # the same process throughout
