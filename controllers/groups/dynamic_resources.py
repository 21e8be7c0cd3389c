"""GPUs under dynamic resource allocation (DRA): what placement counts for a DeviceClass.

A ModelGroup with `engine.gpuDeviceClassName` gets each pod's GPUs from its own ResourceClaim, which
the engine and the health agent share, so the agent sees exactly its pod's GPUs (under a device
plugin it sees none, or the whole node). The scheduler allocates the devices, but a group is useful
only whole, so placement must still know where a group fits before it creates any pod. It counts
devices the way it counts a device plugin's: a node's devices of the class are those of the node's
ResourceSlices that every CEL selector of the DeviceClass accepts; the devices in use are those that
allocated ResourceClaims hold, plus the devices our not yet scheduled pods ask for (their
annotations say how many).

The selectors are evaluated with a CEL library, on a device shaped as the Kubernetes CEL environment
shapes it (`device.driver`, `device.attributes[domain].name`, `device.capacity[domain].name`).
Kubernetes' own CEL extensions (`quantity()`, `semver()`) are not there: a selector that needs them,
or that fails on a device, accepts nothing, and the count says how many devices it could not read, so
the condition names the class instead of a silent zero. Only node-local slices count (a slice for a
set of nodes or the whole cluster is network-attached, and a rank's GPUs are local), and only the
newest generation of each pool.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from goodput.controllers import naming
from goodput.controllers.groups.placement import GpuClaim, NodeInventory

DeviceKey = tuple[str, str, str]
"""A device as an allocation names it: (driver, pool, device)."""
AttributeValue = str | int | bool
_ATTRIBUTE_KINDS = ("string", "int", "bool", "version")


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice; attributes and capacity as (domain, name, value), names qualified."""

    driver: str
    pool: str
    name: str
    attributes: tuple[tuple[str, str, AttributeValue], ...] = ()
    capacity: tuple[tuple[str, str, str], ...] = ()

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True, slots=True, eq=False)
class ResourceSliceView:
    """A node-local ResourceSlice. Compared by identity: the index holds one object per slice
    version, so what a class selects of it is worked out once (`_selection`), not on every pass."""

    driver: str
    pool: str
    generation: int
    node_name: str
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True, slots=True)
class DeviceClassView:
    name: str
    selectors: tuple[str, ...]
    """The CEL expressions of `spec.selectors`; a device must satisfy all of them."""


@dataclass(frozen=True, slots=True)
class ClassDevices:
    """A DeviceClass's devices per node, and what allocated claims hold of them."""

    total_by_node: Mapping[str, int]
    claims: tuple[GpuClaim, ...]
    unreadable_devices: int = 0
    """Devices a selector could not be evaluated on (an error, an unsupported function)."""
    class_found: bool = True


def inventory_note(devices: ClassDevices, device_class: str) -> str:
    """What placement could not count of a DeviceClass, for its "no fit" messages; empty when all."""
    if not devices.class_found:
        return f"DeviceClass {device_class!r} (spec.engine.gpuDeviceClassName) does not exist"
    if devices.unreadable_devices:
        return (
            f"{devices.unreadable_devices} device(s) of the nodes' ResourceSlices could not be judged by "
            f"DeviceClass {device_class!r}'s selectors here (an evaluation error, or a Kubernetes CEL "
            "function such as quantity() or semver()) and are not counted"
        )
    return ""


def parse_resource_slice(body: Mapping[str, Any]) -> ResourceSliceView | None:
    """A node-local ResourceSlice (resource.k8s.io/v1); None for one that is not tied to one node."""
    spec = body.get("spec") or {}
    node_name = spec.get("nodeName")
    driver = str(spec.get("driver") or "")
    pool = spec.get("pool") or {}
    if not node_name or not driver or not pool.get("name"):
        return None
    devices = tuple(
        _slice_device(driver, str(pool["name"]), device)
        for device in spec.get("devices") or ()
        if isinstance(device, Mapping) and device.get("name")
    )
    return ResourceSliceView(driver, str(pool["name"]), _int(pool.get("generation")), str(node_name), devices)


def _slice_device(driver: str, pool: str, device: Mapping[str, Any]) -> SliceDevice:
    attributes = []
    for name, value in (device.get("attributes") or {}).items():
        kind = next((k for k in _ATTRIBUTE_KINDS if k in (value or {})), None)
        if kind is not None:
            attributes.append((*_qualified(driver, name), value[kind]))
    capacity = [
        (*_qualified(driver, name), str((value or {}).get("value")))
        for name, value in (device.get("capacity") or {}).items()
    ]
    return SliceDevice(driver, pool, str(device["name"]), tuple(sorted(attributes)), tuple(sorted(capacity)))


def _qualified(driver: str, name: str) -> tuple[str, str]:
    """An attribute's (domain, name): an unqualified name belongs to the driver's own domain."""
    domain, _, short = name.rpartition("/")
    return (domain or driver, short)


def parse_device_class(body: Mapping[str, Any]) -> DeviceClassView:
    selectors = tuple(
        str(selector["cel"]["expression"])
        for selector in (body.get("spec") or {}).get("selectors") or ()
        if isinstance(selector, Mapping) and (selector.get("cel") or {}).get("expression")
    )
    return DeviceClassView(str((body.get("metadata") or {}).get("name") or ""), selectors)


def allocated_devices(claim: Mapping[str, Any]) -> tuple[DeviceKey, ...]:
    """The devices an allocated ResourceClaim holds; () while it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return tuple(
        (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in results
        if isinstance(r, Mapping) and r.get("device")
    )


def class_devices(
    device_class: DeviceClassView | None,
    slices: Iterable[ResourceSliceView],
    allocated: Iterable[DeviceKey],
) -> ClassDevices:
    """Per node, the devices `device_class` selects, and GpuClaims for those allocated claims hold."""
    if device_class is None:
        return ClassDevices({}, (), class_found=False)
    resource = naming.device_class_resource(device_class.name)
    held_keys = set(allocated)
    total: Counter[str] = Counter()
    held: Counter[str] = Counter()
    unreadable = 0
    for current in newest_generations(slices):
        selected, unjudged = _selection(device_class.selectors, current)
        unreadable += unjudged
        if selected:
            total[current.node_name] += len(selected)
            held[current.node_name] += len(held_keys.intersection(selected))
    claims = tuple(GpuClaim(count, node, resource=resource) for node, count in sorted(held.items()) if count)
    return ClassDevices(dict(total), claims, unreadable)


def newest_generations(slices: Iterable[ResourceSliceView]) -> list[ResourceSliceView]:
    """The slices of each pool's newest generation (a driver republishing a pool bumps it)."""
    by_pool: dict[tuple[str, str], list[ResourceSliceView]] = defaultdict(list)
    for view in slices:
        by_pool[(view.driver, view.pool)].append(view)
    newest = []
    for views in by_pool.values():
        generation = max(view.generation for view in views)
        newest += [view for view in views if view.generation == generation]
    return newest


@functools.lru_cache(maxsize=16384)
def _selection(selectors: tuple[str, ...], view: ResourceSliceView) -> tuple[tuple[DeviceKey, ...], int]:
    """The devices of a slice the selectors accept, and how many they could not be evaluated on."""
    verdicts = [(device.key, selects(selectors, device)) for device in view.devices]
    return tuple(key for key, verdict in verdicts if verdict), sum(verdict is None for _, verdict in verdicts)


@functools.lru_cache(maxsize=65536)
def selects(selectors: tuple[str, ...], device: SliceDevice) -> bool | None:
    """Whether every selector accepts the device; None when one cannot be evaluated on it."""
    context = {"device": _cel_device(device)}
    for expression in selectors:
        try:
            accepted = _program(expression).execute(context)
        except Exception:
            return None
        if accepted is not True:
            return False if accepted is False else None
    return True


@functools.lru_cache(maxsize=1024)
def _program(expression: str) -> Any:
    # Imported on first use: the library's package also loads its command line's stack (typer, rich,
    # prompt_toolkit; about 0.18 s and 12 MiB here), which only a ModelGroup with a DeviceClass needs.
    # The compiled extension itself (`cel.cel`), not the package's re-export: xds-protos (the
    # endpoint picker's Envoy API) ships its own `cel/__init__.py` for its cel.expr messages, and
    # whichever pip unpacks last owns that file; the extension module is the library's alone.
    from cel import cel as cel_extension

    return cel_extension.compile(expression)


def _cel_device(device: SliceDevice) -> dict[str, Any]:
    attributes: dict[str, dict[str, AttributeValue]] = defaultdict(dict)
    for domain, name, value in device.attributes:
        attributes[domain][name] = value
    capacity: dict[str, dict[str, str]] = defaultdict(dict)
    for domain, name, quantity in device.capacity:
        capacity[domain][name] = quantity
    return {
        "driver": device.driver,
        "attributes": dict(attributes),
        "capacity": dict(capacity),
        "allowMultipleAllocations": False,
    }


def with_class_devices(
    nodes: Iterable[NodeInventory], devices: ClassDevices, device_class: str
) -> list[NodeInventory]:
    """The nodes with the class's devices as their allocatable of its placement resource."""
    resource = naming.device_class_resource(device_class)

    def counted(node: NodeInventory) -> NodeInventory:
        others = tuple(device for device in node.other_devices if device[0] != resource)
        total = (resource, devices.total_by_node.get(node.name, 0))
        return replace(node, other_devices=tuple(sorted((*others, total))))

    return [counted(node) for node in nodes]


@dataclass(frozen=True, slots=True)
class DevicePlacement:
    """What placement needs of a DeviceClass besides the nodes' devices: the devices allocated claims
    hold, and what it could not count (`inventory_note`)."""

    claims: tuple[GpuClaim, ...] = ()
    note: str = ""


NO_DEVICE_CLASS = DevicePlacement()
"""A ModelGroup on a device plugin's GPUs: its pods are counted from the pods themselves."""


def class_placement(
    nodes: Iterable[NodeInventory],
    device_class: str,
    found: DeviceClassView | None,
    slices: Iterable[ResourceSliceView],
    allocated: Iterable[DeviceKey],
) -> tuple[list[NodeInventory], DevicePlacement]:
    """The nodes as placement counts them for `device_class` (`found`: its DeviceClass, None when it
    does not exist), and the claims and note that go with them."""
    devices = class_devices(found, slices, allocated)
    placement = DevicePlacement(devices.claims, inventory_note(devices, device_class))
    return with_class_devices(nodes, devices, device_class), placement


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
