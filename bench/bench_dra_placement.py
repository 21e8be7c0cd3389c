"""What placement pays to count a DeviceClass's free devices on a large DRA cluster.

    python bench/bench_dra_placement.py [--nodes 1000] [--devices-per-node 8] [--passes 50]

Every pass of a ModelGroup with `engine.gpuDeviceClassName` counts, from the indexes, the devices of
the nodes' ResourceSlices that the class's CEL selectors accept and no allocated claim holds
(`controllers/dynamic_resources.class_devices`). Here: `--nodes` node-local slices of
`--devices-per-node` GPUs each plus as many MIG devices (which the class rejects), half the GPUs held
by allocated claims, and NVIDIA's `gpu.nvidia.com` selector. Printed: the first pass (every selector
evaluated on every device) and the median of the later ones (slices unchanged, so each one's
selection is remembered), and a pass after one slice changed. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from goodput.controllers.groups.dynamic_resources import (
    DeviceClassView,
    ResourceSliceView,
    class_devices,
    parse_resource_slice,
)

DRIVER = "gpu.nvidia.com"
GPU_CLASS = DeviceClassView(
    DRIVER, (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",)
)


def node_slice(node: int, gpus: int, generation: int = 1) -> ResourceSliceView:
    devices = [
        {
            "name": f"{kind}-{index}",
            "attributes": {"type": {"string": kind}, "uuid": {"string": f"{node}-{index}"}},
        }
        for kind in ("gpu", "mig")
        for index in range(gpus)
    ]
    body = {
        "spec": {
            "driver": DRIVER,
            "nodeName": f"node-{node}",
            "pool": {"name": f"node-{node}", "generation": generation},
            "devices": devices,
        }
    }
    view = parse_resource_slice(body)
    assert view is not None
    return view


def timed_ms(slices: list[ResourceSliceView], held: list[tuple[str, str, str]]) -> float:
    started = time.perf_counter()
    class_devices(GPU_CLASS, slices, held)
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--passes", type=int, default=50)
    args = parser.parse_args()
    gpus = args.devices_per_node
    slices = [node_slice(node, gpus) for node in range(args.nodes)]
    held = [
        (DRIVER, f"node-{node}", f"gpu-{index}") for node in range(args.nodes) for index in range(gpus // 2)
    ]
    first = timed_ms(slices, held)
    later = statistics.median(timed_ms(slices, held) for _ in range(args.passes))
    slices[0] = node_slice(0, gpus, generation=2)
    changed = timed_ms(slices, held)
    devices = sum(len(view.devices) for view in slices)
    print(
        f"{args.nodes} nodes, {devices} devices ({args.nodes * gpus} GPUs of the class), {len(held)} held: "
        f"first pass {first:.1f} ms, then median {later:.2f} ms per pass over {args.passes}, "
        f"{changed:.2f} ms after one slice changed"
    )


if __name__ == "__main__":
    main()
