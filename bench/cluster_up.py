"""Measure the local control plane: warm `up` time, memory held at rest, `down` time.

    python bench/cluster_up.py [--runs 3] [--settle 20]

"Warm" means the binaries are already built (the build script returns at once). Memory is the
resident set (VmRSS from /proc) of each component after `--settle` seconds idle with the default
fleet registered. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from goodput.testbed.cluster import controlplane, processes
from goodput.testbed.cluster.binaries import ensure_binaries


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=20.0, help="idle seconds before reading memory")
    args = parser.parse_args()

    started = time.monotonic()
    bin_dir = ensure_binaries()
    print(f"binaries ready in {time.monotonic() - started:.2f} s ({bin_dir})")
    up_seconds, down_seconds = [], []
    with tempfile.TemporaryDirectory(prefix="goodput-bench-") as scratch:
        for run in range(args.runs):
            state_dir = Path(scratch) / f"run{run}"
            spec = controlplane.ClusterSpec(name=f"bench{run}", state_dir=state_dir)
            started = time.monotonic()
            cluster = controlplane.up(spec, bin_dir=bin_dir, progress=lambda _: None)
            up_seconds.append(time.monotonic() - started)
            if run == 0:
                time.sleep(args.settle)
                records = processes.read_records(cluster.layout.paths.pids)
                memory = {name: rss_kib(record.pid) for name, record in records.items()}
                print(f"memory at rest after {args.settle:g} s idle (VmRSS):")
                for name, kib in memory.items():
                    print(f"  {name:<24} {kib / 1024:7.1f} MiB")
                print(f"  {'total':<24} {sum(memory.values()) / 1024:7.1f} MiB")
            started = time.monotonic()
            controlplane.down(state_dir)
            down_seconds.append(time.monotonic() - started)
    median = statistics.median(up_seconds)
    print(
        f"up (warm, default fleet of 8 nodes, until all ready): median {median:.1f} s, "
        f"min {min(up_seconds):.1f} s, max {max(up_seconds):.1f} s over {args.runs} runs"
    )
    print(f"down: median {statistics.median(down_seconds):.1f} s")


if __name__ == "__main__":
    main()
