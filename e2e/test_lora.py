"""The LoRA adapters story (issue 43, item 2), against the live emulator behind the real gateway.

A ModelGroup declares two adapters. The operator starts its engines with LoRA on; the gateway lists
the adapters in `/v1/models` under their base model; the first request for an adapter no engine
holds is loaded once (the engine's runtime adapter API) and served, and the requests after it go to
the group where it lives, without another load. An adapter nobody declared is a 404.

Outcomes are read from the client side (status, `X-Goodput-Group`, the answer's `model`) and from
the gateway's own counters (`goodput_gateway_adapter_routes_total`, `..._adapter_loads_total`).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import test_gateway
from test_autoscaler import Stage
from test_gateway import NAME, fixed_fleet, fixed_policy, gateway_metric, post, serving_fleet

from goodput.testbed.operator_process import GatewayProcess

pytestmark = pytest.mark.e2e

stage = test_gateway.stage

ADAPTERS = {"sql": "/adapters/sql-lora", "legal": "org/legal-lora"}


def fleet_with_adapters(namespace: str, groups: int) -> dict[str, Any]:
    group = fixed_fleet(namespace, groups)
    group["spec"]["adapters"] = [{"name": name, "source": source} for name, source in ADAPTERS.items()]
    group["spec"]["adapterLimits"] = {"maxLoadedPerGroup": 2}
    return group


def test_a_new_adapter_is_loaded_once_then_routed_to_where_it_lives(stage: Stage, tmp_path: Path) -> None:
    stage.apply(fixed_policy(stage.namespace), fleet_with_adapters(stage.namespace, 2))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 2, gateway)
        with urllib.request.urlopen(gateway.url + "/v1/models", timeout=10) as reply:
            listed = {model["id"]: model.get("parent") for model in json.loads(reply.read())["data"]}
        assert listed == {"llama": None, "sql": "llama", "legal": "llama"}, listed

        first = post(gateway.url, {"model": "sql", "prompt": "SELECT", "max_tokens": 4})
        assert first.status == 200, f"{first}\n{gateway.log_tail()}"
        assert first.body["model"] == "sql", "the engine answered as the adapter"
        home = first.headers["X-Goodput-Group"]
        for _ in range(3):
            again = post(gateway.url, {"model": "sql", "prompt": "SELECT", "max_tokens": 4})
            assert again.status == 200, again
            assert again.headers["X-Goodput-Group"] == home, "routed to where the adapter lives"

        loads = gateway_metric(
            gateway, "goodput_gateway_adapter_loads_total", adapter="sql", action="load", result="succeeded"
        )
        assert loads == 1, f"loaded once, not {loads}\n{gateway.log_tail()}"
        held = gateway_metric(
            gateway, "goodput_gateway_adapter_routes_total", adapter="sql", placement="held"
        )
        assert held == 3

        unknown = post(gateway.url, {"model": "poetry", "prompt": "Hi", "max_tokens": 4})
        assert unknown.status == 404
        assert unknown.body["error"]["code"] == "model_not_found"
