"""How much open-loop load `goodput load` sustains on this machine, against the emulator on loopback.

For each offered rate, Poisson arrivals of short requests (default 32 prompt + 16 output tokens,
streamed) go to an emulated vLLM (`goodput emulate --serve`, a separate process). The figures: the
achieved send rate against the offered one, the send lag (actual minus scheduled send time)
percentiles, completions, and the CPU each side used. The load generator is not the bottleneck at a
rate when it sends at that rate with a small lag while its own process stays below one core.

    .venv/bin/python bench/bench_loadgen.py                 # 200, 400 and 800 requests/s, 20 s each
    .venv/bin/python bench/bench_loadgen.py --rates 250 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from goodput.testbed.cluster.controlplane import free_port
from goodput.testbed.cluster.processes import stop_child
from goodput.testbed.loadgen import (
    LoadGenerator,
    LoadReport,
    LoadSettings,
    PlannedRequest,
    TargetPolicy,
    TargetPool,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU seconds of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_emulator(port: int) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "goodput.testbed.cli_emulate",
        "--serve",
        f"127.0.0.1:{port}",
        "--load-seconds",
        "0",
        "--log-level",
        "WARNING",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening"):
        stop_child(process, grace_seconds=5, kill=True)
        raise SystemExit(f"the emulator did not start: {line!r}")
    return process


def poisson_plan(rate: float, seconds: float, prompt: int, output: int, seed: int) -> list[PlannedRequest]:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * seconds * 1.5) + 10)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < seconds]
    return [PlannedRequest(index, float(at), prompt, output) for index, at in enumerate(arrivals)]


def run_rate(url: str, emulator_pid: int, rate: float, args: argparse.Namespace) -> tuple[LoadReport, float]:
    plan = poisson_plan(rate, args.seconds, args.prompt_tokens, args.output_tokens, args.seed)
    settings = LoadSettings(
        duration_seconds=args.seconds + 1,
        concurrency_limit=args.concurrency_limit,
        request_timeout_seconds=30.0,
    )
    emulator_cpu = cpu_seconds_of(emulator_pid)
    report = asyncio.run(LoadGenerator(TargetPool([url], TargetPolicy()), settings).run(plan))
    return report, cpu_seconds_of(emulator_pid) - emulator_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="200,400,800", help="offered requests per second, comma separated")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--concurrency-limit", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    port = free_port()
    emulator = start_emulator(port)
    url = f"http://127.0.0.1:{port}"
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(
        f"requests: {args.prompt_tokens} prompt + {args.output_tokens} output tokens, streamed; "
        f"Poisson arrivals for {args.seconds:g} s per rate"
    )
    header = (
        f"{'offered/s':>9} {'sent/s':>8} {'ok':>6} {'other':>6} {'not sent':>8} {'lag p50 ms':>10} "
        f"{'lag p99 ms':>10} {'lag max ms':>10} {'TTFT p50 ms':>11} {'client CPU':>10} {'emulator CPU':>12}"
    )
    print(header)
    try:
        for rate in (float(text) for text in args.rates.split(",")):
            started = time.monotonic()
            report, emulator_cpu = run_rate(url, emulator.pid, rate, args)
            wall = time.monotonic() - started
            lag = report.send_lag_seconds
            not_sent = (
                report.not_sent_concurrency_limit + report.not_sent_deadline + report.not_sent_no_target
            )
            print(
                f"{rate:>9.0f} {report.achieved_send_rate_per_second:>8.1f} {report.outcomes['ok']:>6} "
                f"{report.sent - report.outcomes['ok']:>6} {not_sent:>8} {lag.p50 * 1e3:>10.2f} "
                f"{lag.p99 * 1e3:>10.2f} {lag.max * 1e3:>10.2f} {report.ttft_seconds.p50 * 1e3:>11.1f} "
                f"{report.cpu_seconds / wall:>9.0%} {emulator_cpu / wall:>11.0%}"
            )
    finally:
        stop_child(emulator, grace_seconds=30)
    print("CPU columns: share of one core over the run (client: this process, emulator: its process).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
