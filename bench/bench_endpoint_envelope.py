"""`goodput envelope --endpoint` against the emulated vLLM server in real time, beside the simulator's
envelope of the same engine.

    python bench/bench_endpoint_envelope.py [--max-seconds 900]

Starts the emulator (`testbed.emulator_server`, Llama 3.1 8B timed as on one L4, so a few requests a
second fill it) on 127.0.0.1 in a process of its own, runs the command exactly as a team would, and
prints the steps it took, the figure it measured, the wall time it took, and the simulator's envelope
of one group of the same engine on the same lengths and targets (what the emulator's timing model
says the figure should be). On a busy machine the client's and the emulator's own delays count as
the server's: the figure is then lower. tests/test_endpoint_emulator.py makes the same comparison
on a virtual clock, where it is exact. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from goodput.simulator import cli_envelope
from goodput.simulator.cli_simulate import bench_from
from goodput.simulator.envelope import EnvelopeSearch

SERVED = "llama-8b"
TRACE = "synthetic:rate=5,duration=600,burst_multiplier=1,input_median=300,output_median=60,output_sigma=0.5"
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
  profile: {gpu: l4}
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


def manifests(folder: Path) -> list[str]:
    (folder / "mg.yaml").write_text(MODEL_GROUP)
    (folder / "slo.yaml").write_text(POLICY)
    return ["--trace", TRACE, "--modelgroup", str(folder / "mg.yaml"), "--policy", str(folder / "slo.yaml")]


def serve(port: int, folder: Path) -> None:
    """The emulator of the ModelGroup's engine on 127.0.0.1:`port`, until killed."""
    from goodput.testbed.emulator_engine import ServingProfile
    from goodput.testbed.emulator_netns import bind_listener
    from goodput.testbed.emulator_server import ServerIdentity, VllmServer

    parser = argparse.ArgumentParser()
    cli_envelope.add_arguments(parser)
    args = parser.parse_args([*manifests(folder), "--out", str(folder / "sim"), "--step-noise", "0"])
    engine = bench_from(args).setup.engine

    async def main() -> None:
        server = VllmServer(
            ServingProfile(engine, SERVED), ServerIdentity("meta-llama/Llama-3.1-8B-Instruct", SERVED)
        )
        await server.listen(bind_listener("127.0.0.1", port))
        await asyncio.Event().wait()

    asyncio.run(main())


def simulated(folder: Path) -> tuple[float, float]:
    """(requests/s, work-seconds/s) of one group of the same engine in the simulator."""
    parser = argparse.ArgumentParser()
    cli_envelope.add_arguments(parser)
    args = parser.parse_args([*manifests(folder), "--out", str(folder / "sim"), "--step-noise", "0"])
    bench = bench_from(args)
    bench.setup = dataclasses.replace(bench.setup, measured_capacity_work_seconds_per_second=None)
    bench.search = EnvelopeSearch(groups=1, repeats=1, trial_seconds=60.0, refinements=6)
    return bench.envelope.requests_per_second, bench.envelope.work_seconds_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve is not None:
        serve(options.serve, options.folder)
        return
    with tempfile.TemporaryDirectory() as name, socket.socket() as probe:
        folder = Path(name)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port), "--folder", str(folder)],
            stdout=subprocess.DEVNULL,
        )
        try:
            for _ in range(600):
                with socket.socket() as check:
                    if check.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.1)
            command = [
                *("goodput", "envelope", *manifests(folder), "--out", str(folder / "endpoint")),
                *("--endpoint", f"http://127.0.0.1:{port}", "--model", SERVED),
                *(
                    "--max-seconds",
                    str(options.max_seconds),
                    "--min-step-requests",
                    "100",
                    "--min-step-seconds",
                    "20",
                ),
            ]
            print("$", " ".join(command))
            started = time.monotonic()
            run = subprocess.run(
                [str(Path(sys.executable).parent / "goodput"), *command[1:]],
                check=False,
                capture_output=True,
                text=True,
            )
            took = time.monotonic() - started
        finally:
            server.kill()
            server.wait()
        print(run.stdout or run.stderr)
        print(f"exit {run.returncode}, {took:.0f} s")
        if run.returncode == 0:
            measured = yaml.safe_load(run.stdout)["profile"]["capacityWorkSecondsPerSecond"]
            rate, work = simulated(folder)
            print(f"simulator, one group of the same engine: {rate:.3g} req/s, {work:.4g} work-seconds/s")
            print(f"measured / simulated: {measured / work:.3f}")


if __name__ == "__main__":
    main()
