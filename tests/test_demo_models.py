"""The demo's second model behind the same gateway: read from manifests/demo/second-model, probed
through the gateway, counted per model (goodput.testbed.demo_models), and the gateway's own counts
read for the demo's ModelGroup only."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.testbed.demo import count_by_tenant, read_manifests
from goodput.testbed.demo_models import (
    ModelProbe,
    OtherModel,
    ProbeCount,
    read_other_models,
    render_other_models,
)

DEMO_MANIFESTS = Path(__file__).resolve().parents[1] / "manifests" / "demo"


def test_the_demo_serves_a_second_model_under_its_own_name_and_the_demos_policy() -> None:
    objects = read_manifests(DEMO_MANIFESTS)
    (other,) = read_other_models(DEMO_MANIFESTS)
    assert other.served_name != objects.served_name and other.model_group != objects.model_group
    group = ModelGroup.model_validate(yaml.safe_load(other.path.read_text()))
    policy = SloPolicy.model_validate(yaml.safe_load((DEMO_MANIFESTS / "slopolicy-demo.yaml").read_text()))
    assert group.spec.min_replicas == group.spec.max_replicas == 1  # a fixed group: the burst is elsewhere
    compiled = compile_request_path(group, policy)
    assert isinstance(compiled, RequestPathPolicy) and compiled.served_model == other.served_name


def test_a_directory_without_other_models_has_none(tmp_path: Path) -> None:
    assert read_other_models(tmp_path) == ()


def test_the_gateways_counts_are_read_for_one_model_group() -> None:
    text = """# TYPE goodput_gateway_requests_offered_total counter
goodput_gateway_requests_offered_total{model_group="llama-8b",slo_class="chat",tenant="a"} 7.0
goodput_gateway_requests_offered_total{model_group="qwen-7b",slo_class="chat",tenant="a"} 30.0
# TYPE goodput_gateway_requests_total counter
goodput_gateway_requests_total{model_group="llama-8b",slo_class="chat",tenant="a",outcome="admitted"} 7.0
goodput_gateway_requests_total{model_group="qwen-7b",slo_class="chat",tenant="a",outcome="admitted"} 30.0
"""
    assert count_by_tenant(text, "llama-8b") == {"a": {"offered": 7, "admitted": 7}}
    assert count_by_tenant(text) == {"a": {"offered": 37, "admitted": 37}}


@contextmanager
def answering(answers_as: dict[str, str]) -> Iterator[str]:
    """A stand-in gateway: a completion for model m answers as model `answers_as[m]`; 404 otherwise."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model = answers_as.get(body["model"])
            payload = json.dumps({"model": model} if model else {"error": {}}).encode()
            self.send_response(200 if model else 404)
            if model:
                self.send_header("X-Goodput-Group", f"{body['model']}-g1")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_counts_statuses_groups_and_answers_from_another_model() -> None:
    models = tuple(OtherModel(name, name, Path("x.yaml")) for name in ("qwen", "mistral", "phi"))
    with answering({"qwen": "qwen", "mistral": "llama"}) as url:
        probe = ModelProbe(url, models, tenant="a")
        probe.counts = {model.served_name: ProbeCount() for model in models}
        for _ in range(2):
            for model in models:
                probe._send(model.served_name)
    report = probe.report()
    assert report["qwen"] == {"statuses": {"200": 2}, "groups": ["qwen-g1"], "wrong_model": 0}
    assert report["mistral"]["wrong_model"] == 2
    assert report["phi"] == {"statuses": {"404": 2}, "groups": [], "wrong_model": 0}
    text = render_other_models(models, report)
    assert "qwen (ModelGroup qwen): answers by status {200: 2}, served by qwen-g1" in text
