"""`goodput envelope --endpoint` against the emulated vLLM server on loopback: the sweep finds the
capacity the emulator's timing model gives, and prints a profile block that pastes into a ModelGroup.

The emulator runs the simulator's engine model in the event loop's time, so the expected figure is
the simulator's own envelope of one group of the same engine, on the same lengths and targets
(`simulator.envelope.measure_envelope`). The two differ by the sweep's resolution (the bisection
stops within 10 %), its steps' length (40 s here, where the simulator's trials last 50 TTFT targets:
a shorter step passes a rate a little above what a longer one sustains), and the attainment's
binomial noise on a few hundred requests: the test allows 15 %. The whole sweep runs on a virtual
clock (tests/virtual_time.py), over real HTTP, so it takes seconds however busy the machine is.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml
from virtual_time import run_virtual

from goodput.api.modelgroup import ModelGroup
from goodput.simulator import cli_endpoint, cli_envelope
from goodput.simulator.cli_simulate import bench_from
from goodput.simulator.envelope import EnvelopeSearch
from goodput.testbed.emulator_engine import ServingProfile
from goodput.testbed.emulator_netns import bind_listener
from goodput.testbed.emulator_server import ServerIdentity, VllmServer

SERVED = "llama-8b"
TRACE = "synthetic:rate=5,duration=600,burst_multiplier=1,input_median=300,output_median=60,output_sigma=0.5"
# Llama 3.1 8B on one L4: a server that holds a few requests per second, so a sweep is a few
# thousand requests at most.
MODEL_GROUP = """
apiVersion: goodput.dev/v1alpha1
kind: ModelGroup
metadata: {name: llama-8b-l4}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  engine: {image: vllm/vllm-openai:v0.33.0}
  parallelism: {tensor: 1, pipeline: 1, gpusPerPod: 1}
  minReplicas: 1
  maxReplicas: 4
  policyRef: {name: chat}
  profile: {gpu: l4, capacityWorkSecondsPerSecond: 0.001}
"""
POLICY = """
apiVersion: goodput.dev/v1alpha1
kind: SLOPolicy
metadata: {name: chat}
spec:
  revision: chat-1
  classes:
  - {name: chat, ttftSeconds: 2.0, itlSeconds: 0.1, attainment: 0.9}
"""
TOLERANCE = 0.15


def envelope_args(tmp_path: Path, *flags: str) -> argparse.Namespace:
    model_group, policy = tmp_path / "mg.yaml", tmp_path / "slo.yaml"
    model_group.write_text(MODEL_GROUP)
    policy.write_text(POLICY)
    parser = argparse.ArgumentParser()
    cli_envelope.add_arguments(parser)
    return parser.parse_args(
        [
            *("--trace", TRACE, "--modelgroup", str(model_group), "--policy", str(policy)),
            *("--out", str(tmp_path / "out"), "--step-noise", "0", "--model", SERVED),
            *flags,
        ]
    )


def simulated_capacity(args: argparse.Namespace) -> float:
    """The simulator's envelope of one group of the same engine: what the emulator should hold."""
    bench = bench_from(args)
    bench.setup = dataclasses.replace(bench.setup, measured_capacity_work_seconds_per_second=None)
    bench.search = EnvelopeSearch(groups=1, repeats=1, trial_seconds=60.0, refinements=6)
    return bench.envelope.work_seconds_per_second


def test_the_sweep_finds_the_emulators_capacity_and_prints_a_profile_that_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    args = envelope_args(
        tmp_path,
        "--endpoint",
        f"http://127.0.0.1:{port}",
        "--min-step-requests",
        "100",
        "--min-step-seconds",
        "20",
    )
    bench = bench_from(args)
    engine = bench.setup.engine
    server = VllmServer(
        ServingProfile(engine, SERVED, stream_interval_seconds=0.05),
        ServerIdentity("meta-llama/Llama-3.1-8B-Instruct", SERVED),
    )

    def on_the_emulator(sweep: Coroutine[Any, Any, cli_endpoint.SweepResult]) -> cli_endpoint.SweepResult:
        async def main() -> cli_endpoint.SweepResult:
            await server.listen(listener)
            try:
                return await sweep
            finally:
                await server.close()

        return run_virtual(main)

    assert cli_endpoint.run(args, on_the_emulator) == 0
    printed = capsys.readouterr().out
    profile = yaml.safe_load(printed)["profile"]
    expected = simulated_capacity(args)
    measured = profile["capacityWorkSecondsPerSecond"]
    assert abs(measured - expected) <= TOLERANCE * expected, (measured, expected, printed)
    assert profile["kvCapacityTokens"] == engine.kv_capacity_blocks * engine.block_tokens
    assert profile["gpu"] == "l4"
    manifest = yaml.safe_load(MODEL_GROUP)
    manifest["spec"]["profile"] = profile
    assert ModelGroup.model_validate(manifest).spec.profile is not None
    assert "held" in printed and "failed" in printed, "the table of steps shows both verdicts"
    assert (tmp_path / "out" / "endpoint-sweep.json").exists()


def test_the_sweep_never_sends_more_than_the_team_allows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request budget too small to find the capacity: the server receives no more requests than
    allowed (counted at the emulated engine, the check request included), no figure is printed, and
    the message says which limit to raise."""
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    args = envelope_args(
        tmp_path,
        "--endpoint",
        f"http://127.0.0.1:{port}",
        "--max-requests",
        "250",
        "--first-rate",
        "1",
        "--min-step-requests",
        "100",
        "--min-step-seconds",
        "20",
    )
    bench = bench_from(args)
    server = VllmServer(ServingProfile(bench.setup.engine, SERVED), ServerIdentity("m", SERVED))
    completions = 0

    def counted(sweep: Coroutine[Any, Any, cli_endpoint.SweepResult]) -> cli_endpoint.SweepResult:
        async def main() -> cli_endpoint.SweepResult:
            await server.listen(listener)
            engine = server.engine
            submit = engine.submit

            def counting_submit(*args: Any, **kwargs: Any) -> Any:
                nonlocal completions
                completions += 1
                return submit(*args, **kwargs)

            engine.submit = counting_submit  # type: ignore[method-assign]
            try:
                return await sweep
            finally:
                await server.close()

        return run_virtual(main)

    assert cli_endpoint.run(args, counted) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "raise --max-requests or --max-seconds" in captured.err
    assert 100 <= completions <= 250, "the server received some steps' requests and never more than allowed"
