"""The emulated vLLM server's runtime LoRA API, as vLLM answers it: a load takes its time, an adapter
loaded twice or past `max_loras` or from an unreadable source is refused, `/v1/models` lists each
loaded adapter under its base model, and a request for an adapter not loaded is vLLM's 404."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig
from goodput.testbed.emulator import parse_vllm_args
from goodput.testbed.emulator_engine import ServingProfile
from goodput.testbed.emulator_netns import bind_listener
from goodput.testbed.emulator_server import ServerIdentity, VllmServer

SERVED = "llama"
LOAD_SECONDS = 0.2


def test_lora_flags_are_read_from_the_pods_command() -> None:
    args = parse_vllm_args(
        ["vllm", "serve"], ["m", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "32"]
    )
    assert (args.enable_lora, args.max_loras, args.model) == (True, 4, "m")
    assert parse_vllm_args(["vllm", "serve"], ["m"]).enable_lora is False


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with session.post(url, json=body) as response:
        return response.status, await response.text()


def test_the_runtime_adapter_api() -> None:
    async def main() -> None:
        profile = ServingProfile(
            EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G),
            SERVED,
            max_loras=1,
            lora_load_seconds=LOAD_SECONDS,
            unreadable_lora_paths=frozenset({"/missing"}),
        )
        server = VllmServer(profile, ServerIdentity("m", SERVED))
        await server.listen(bind_listener("127.0.0.1", 0))
        assert server.address is not None
        url = f"http://127.0.0.1:{server.address[1]}"
        completion = {"model": "sql", "prompt": "x", "max_tokens": 2}
        try:
            async with aiohttp.ClientSession() as session:
                status, text = await _post(session, url + "/v1/completions", completion)
                assert (status, "The model `sql` does not exist." in text) == (404, True)
                started = time.monotonic()
                status, text = await _post(
                    session, url + "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/a/sql"}
                )
                assert status == 200 and "added successfully" in text
                assert time.monotonic() - started >= LOAD_SECONDS, "a load takes its load time"
                status, text = await _post(
                    session, url + "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/a/sql"}
                )
                assert (status, "has already been loaded" in text) == (400, True)
                status, text = await _post(
                    session, url + "/v1/load_lora_adapter", {"lora_name": "legal", "lora_path": "/a/l"}
                )
                assert (status, "max_loras" in text) == (400, True), "one slot, already taken"
                async with session.get(url + "/v1/models") as response:
                    models = {m["id"]: (m["parent"], m["root"]) for m in (await response.json())["data"]}
                assert models == {SERVED: (None, "m"), "sql": (SERVED, "/a/sql")}
                status, text = await _post(session, url + "/v1/completions", completion)
                assert status == 200 and '"model":"sql"' in text.replace(" ", "")
                assert (await _post(session, url + "/v1/unload_lora_adapter", {"lora_name": "sql"}))[0] == 200
                assert (await _post(session, url + "/v1/unload_lora_adapter", {"lora_name": "sql"}))[0] == 404
                status, text = await _post(
                    session, url + "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": "/missing"}
                )
                assert (status, "No adapter found for /missing" in text) == (400, True)
                assert server.adapter_loads == 1
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), timeout=30))
