"""The deadline gate with and without its measured TTFT correction, in front of engines slower than
the ModelGroup says.

Run: .venv/bin/python bench/bench_deadline_calibration.py [--engine-gpu a100-80g] [--seed-gpu h100-80g]

The gateway's stories of e2e/test_gateway.py, replayed on a virtual clock (tests/virtual_time.py)
over real HTTP: the real gateway (`gateway.server.Gateway` behind `gateway.front.GatewayFront`) in
front of one emulated vLLM server (`testbed.emulator_server.VllmServer`). The ModelGroup is the
stories' (Llama-3.1-8B, `--seed-gpu`, maxNumSeqs 2) and the SLOPolicy's chat class has a 1 s TTFT
target; the emulated engine runs on `--engine-gpu`, so with a slower GPU every figure the gateway
holds is optimistic, as on a loaded host. Streamed 256-in/64-out requests:

1. overload: 12 requests a second for 20 s from one tenant (three times what the group serves);
2. noisy tenant: 6 a second from `noisy`, 0.6 from `light`, for 30 s, both weighted 1.

Each runs with the correction held at 1 (as before it existed) and measured. Printed per tenant:
requests offered and admitted, the attainment of the admitted (TTFT within 1 s, measured by the
client) and the tenant's correction at the end. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the virtual clock the unit tests run on, not duplicated
from virtual_time import run_virtual  # noqa: E402

from goodput.api.modelgroup import ModelGroup  # noqa: E402
from goodput.api.slopolicy import SloPolicy  # noqa: E402
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path  # noqa: E402
from goodput.controllers.requests.calibration import TtftCalibrationSettings  # noqa: E402
from goodput.gateway.connections import start_serving  # noqa: E402
from goodput.gateway.front import GatewayFront  # noqa: E402
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource  # noqa: E402
from goodput.gateway.limits import ClientLimits  # noqa: E402
from goodput.gateway.server import Gateway  # noqa: E402
from goodput.testbed.emulator import ProfileDefaults, VllmArgs, serving_profile  # noqa: E402
from goodput.testbed.emulator_netns import bind_listener  # noqa: E402
from goodput.testbed.emulator_server import ServerIdentity, VllmServer  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_TARGET_SECONDS = 1.0
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 64


def model_group(gpu: str) -> ModelGroup:
    spec = {
        "model": {"name": MODEL, "servedName": "llama"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
        "replicas": 1,
        "minReplicas": 1,
        "maxReplicas": 1,
        "policyRef": {"name": "interactive"},
        "profile": {"gpu": gpu, "maxNumSeqs": 2, "maxNumBatchedTokens": 2048},
    }
    return ModelGroup.model_validate({"kind": "ModelGroup", "metadata": {"name": "chat"}, "spec": spec})


def request_path(gpu: str, tenants: list[str]) -> RequestPathPolicy:
    spec: dict[str, Any] = {
        "revision": "r1",
        "classes": [
            {"name": "chat", "ttftSeconds": TTFT_TARGET_SECONDS, "itlSeconds": 0.05, "attainment": 0.9}
        ],
        "autoscaling": {"mode": "Frozen", "signals": {"goodput": {"enabled": False}}},
    }
    if tenants:
        spec["fairness"] = {"tenants": [{"name": tenant, "weight": 1} for tenant in tenants]}
    policy = SloPolicy.model_validate(
        {"kind": "SLOPolicy", "metadata": {"name": "interactive"}, "spec": spec}
    )
    compiled = compile_request_path(model_group(gpu), policy)
    if not isinstance(compiled, RequestPathPolicy):
        raise SystemExit(f"the policy does not compile: {compiled}")
    return compiled


@dataclass(frozen=True)
class Seen:
    tenant: str
    status: int
    ttft_seconds: float | None


async def send(
    session: aiohttp.ClientSession, url: str, at: float, tenant: str, loop: asyncio.AbstractEventLoop
) -> Seen:
    await asyncio.sleep(max(0.0, at - loop.time()))
    sent = loop.time()
    prompt = (f"{tenant}-{at:.3f} " + "word " * PROMPT_TOKENS)[: 4 * PROMPT_TOKENS]
    body = {"model": "llama", "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "stream": True}
    first: float | None = None
    async with session.post(
        url + "/v1/completions", json=body, headers={"X-Goodput-Tenant": tenant}
    ) as answer:
        async for chunk in answer.content.iter_any():
            if first is None and answer.status == 200 and b"data: " in chunk:
                first = loop.time() - sent
        return Seen(tenant, answer.status, first)


def story(
    args: argparse.Namespace, settings: TtftCalibrationSettings, plan: list[tuple[float, str]]
) -> tuple[list[Seen], dict[str, float]]:
    tenants = sorted({tenant for _, tenant in plan} - {"default"})
    policy = request_path(args.seed_gpu, tenants)
    profile = serving_profile(
        model_group(args.engine_gpu).spec, VllmArgs(model=MODEL, served_model_name="llama"), ProfileDefaults()
    )

    async def main() -> tuple[list[Seen], dict[str, float]]:
        loop = asyncio.get_running_loop()
        listener = bind_listener("127.0.0.1", 0)
        server = VllmServer(profile, ServerIdentity(MODEL, "llama"))
        await server.listen(listener)
        upstream = f"http://127.0.0.1:{listener.getsockname()[1]}"
        gateway = Gateway(
            policy, StaticGroupSource([GroupEndpoint("g1", upstream, True, False)]), clock=loop.time
        )
        gateway.calibration_settings = settings
        front = GatewayFront(metrics=gateway.metrics, limits=ClientLimits(), label="chat", clock=loop.time)
        front.serve(gateway)
        runner = await start_serving(
            front.app(), "127.0.0.1", 0, ClientLimits(), front.count_connection_closed
        )
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                start = loop.time() + 0.2
                seen = await asyncio.gather(*(send(session, url, start + at, t, loop) for at, t in plan))
            now = loop.time()
            return list(seen), {label: gateway.ttft_correction(label, now) for label in gateway.corrections}
        finally:
            await runner.cleanup()
            await server.close()

    result: tuple[list[Seen], dict[str, float]] = run_virtual(main)
    return result


def steady(rate_per_second: float, seconds: float, tenant: str) -> list[tuple[float, str]]:
    return [(index / rate_per_second, tenant) for index in range(int(rate_per_second * seconds))]


def report(name: str, seen: list[Seen], corrections: dict[str, float]) -> None:
    for tenant in sorted({one.tenant for one in seen}):
        offered = [one for one in seen if one.tenant == tenant]
        admitted = [one for one in offered if one.status == 200]
        met = [
            one
            for one in admitted
            if one.ttft_seconds is not None and one.ttft_seconds <= TTFT_TARGET_SECONDS
        ]
        attainment = len(met) / len(admitted) if admitted else float("nan")
        print(
            f"{name:<32} {tenant:<8} offered {len(offered):4d}  admitted {len(admitted):4d}  "
            f"attainment {attainment:.3f}  correction {corrections.get(tenant, 1.0):.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine-gpu", default="a100-80g", help="the GPU the emulated engine runs on")
    parser.add_argument(
        "--seed-gpu", default="h100-80g", help="the GPU the ModelGroup (and the gateway) says"
    )
    args = parser.parse_args()
    stories = {
        "overload": steady(12.0, 20.0, "default"),
        "noisy tenant": steady(6.0, 30.0, "noisy") + steady(0.6, 30.0, "light"),
    }
    print(f"ModelGroup on {args.seed_gpu}, emulated engine on {args.engine_gpu}; virtual clock")
    for name, plan in stories.items():
        for label, settings in (
            ("as the figures say", TtftCalibrationSettings(max_ttft_correction=1.0)),
            ("corrected", TtftCalibrationSettings()),
        ):
            seen, corrections = story(args, settings, plan)
            report(f"{name}, {label}", seen, corrections)


if __name__ == "__main__":
    main()
