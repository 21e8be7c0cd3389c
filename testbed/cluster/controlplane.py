"""Bring a local control plane up and down: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (the fake GPU nodes' kubelet) and Prometheus, all on loopback.

Everything a cluster owns lives in its state directory (PKI, etcd data, configs, logs, PID files,
`cluster.json`), so `down`, `status` and `env` work from any later process, and tests can hold a
`LocalCluster` handle to drive it from Python.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from goodput.testbed.cluster import netns, pki, processes
from goodput.testbed.cluster.config import (
    COMPONENTS,
    ClusterLayout,
    Ports,
    StatePaths,
    component_commands,
    health_urls,
    render_audit_policy,
    render_kubeconfig,
    render_kwok_config,
    render_prometheus_config,
    stage_files,
)
from goodput.testbed.cluster.kube import ApiError, KubeClient, probe
from goodput.testbed.cluster.topology import (
    CLIQUE_LABEL,
    GPU_RESOURCE,
    NODE_LOST_ANNOTATION,
    FakeGpuNode,
    PodNetwork,
    Topology,
    extra_gpu_node,
    fake_gpu_nodes,
    first_free_node_index,
)

CLUSTER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$")
LOG_TAIL_LINES = 25
LOST_NODE_LEASE_HOLDER = "goodput-lost-node"  # kwok does not renew a lease another holder has
Progress = Callable[[str], None]


class ClusterError(RuntimeError):
    """The cluster could not be started, found or stopped; the message says which component and why."""


def default_state_dir(name: str) -> Path:
    cache = Path(os.environ.get("GOODPUT_CACHE", Path.home() / ".cache" / "goodput"))
    return cache / "cluster" / name


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to start."""

    name: str
    state_dir: Path
    topology: Topology = field(default_factory=Topology)
    scrape_interval_seconds: float = 5.0
    with_netns: bool = True
    ready_timeout_seconds: float = 180.0

    def __post_init__(self) -> None:
        if not CLUSTER_NAME.match(self.name):
            raise ValueError(
                f"cluster name must be 1-20 of [a-z0-9-], not starting/ending with '-': {self.name!r}"
            )


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What was started, persisted as `cluster.json` in the state directory."""

    name: str
    state_dir: Path
    bin_dir: Path
    ports: Ports
    network_octet: int
    netns: str | None
    topology: Topology
    scrape_interval_seconds: float

    @property
    def layout(self) -> ClusterLayout:
        return ClusterLayout(
            name=self.name,
            bin_dir=self.bin_dir,
            paths=StatePaths(self.state_dir),
            ports=self.ports,
            network=PodNetwork(self.network_octet),
            scrape_interval_seconds=self.scrape_interval_seconds,
        )

    def to_json(self) -> str:
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        data["bin_dir"] = str(self.bin_dir)
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        return cls(
            name=data["name"],
            state_dir=Path(data["state_dir"]),
            bin_dir=Path(data["bin_dir"]),
            ports=Ports(**data["ports"]),
            network_octet=int(data["network_octet"]),
            netns=data["netns"],
            topology=Topology(**data["topology"]),
            scrape_interval_seconds=float(data["scrape_interval_seconds"]),
        )


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str


@dataclass(frozen=True, slots=True)
class DownReport:
    stopped: tuple[str, ...]
    """Every process that was running; each has exited unless it is in `still_exiting`."""
    not_running: tuple[str, ...]
    netns_removed: str | None
    netns_processes_stopped: tuple[int, ...]
    logs_kept_in: Path | None
    killed: tuple[str, ...] = ()
    """Exited only after SIGKILL: still running at the end of their SIGTERM grace."""
    still_exiting: tuple[str, ...] = ()
    """Processes (by name, or 'pid N' inside the network namespace) that had not exited even after
    SIGKILL and its wait: they may still hold their ports."""


class LocalCluster:
    """Handle on a running local cluster: kubeconfig, binaries, Prometheus, the pod network namespace."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.layout: ClusterLayout = state.layout
        self.api = KubeClient.from_kubeconfig(self.layout.paths.kubeconfig)

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def state_dir(self) -> Path:
        return self.state.state_dir

    @property
    def kubeconfig(self) -> str:
        return str(self.layout.paths.kubeconfig)

    @property
    def bin_dir(self) -> Path:
        return self.state.bin_dir

    @property
    def prometheus_url(self) -> str:
        return str(self.layout.prometheus_url)

    @property
    def netns(self) -> str:
        if self.state.netns is None:
            raise ClusterError(f"cluster {self.name} was started without a network namespace")
        return self.state.netns

    @property
    def network(self) -> PodNetwork:
        return self.layout.network

    def client_kubeconfig(self, user: str, path: Path) -> Path:
        """A kubeconfig at `path` for a client certificate of its own, user `user` in group
        system:masters: a second client that the audit log tells apart from the admin."""
        pki.issue_client_certificate(self.layout.paths.pki, user, pki.Subject(user, "system:masters"))
        path.write_text(render_kubeconfig(self.layout, user=user))
        path.chmod(0o600)
        return path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout_seconds: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's kubectl against its kubeconfig; on failure (when `check`) raise with the
        command's stdout and stderr in the message."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, check=False, timeout=timeout_seconds
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed with exit code {result.returncode}\n"
                f"stdout: {result.stdout.strip()}\nstderr: {result.stderr.strip()}"
            )
        return result

    def run_in_netns(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a process inside the pod network namespace; it may listen on any pod IP."""
        process: subprocess.Popen[bytes] = netns.run_in_netns(self.netns, argv, **popen_kwargs)
        return process

    def node_names(self) -> list[str]:
        nodes = self.api.request("GET", "/api/v1/nodes")
        return sorted(item["metadata"]["name"] for item in nodes["items"])

    def add_gpu_node(
        self,
        name: str,
        *,
        zone: str,
        clique: str,
        gpus: int = 8,
        gpu_product: str | None = None,
        labels: dict[str, str] | None = None,
        wait_ready_seconds: float = 30.0,
    ) -> FakeGpuNode:
        """Add a fake GPU node (own /24 of the pod range) and wait until kwok reports it Ready."""
        used = []
        for item in self.api.request("GET", "/api/v1/nodes")["items"]:
            index = self.network.node_index_of(item.get("spec", {}).get("podCIDR", ""))
            if index is not None:
                used.append(index)
        topology = self.state.topology
        node = extra_gpu_node(
            name,
            index=first_free_node_index(used),
            network=self.network,
            zone=zone,
            clique=clique,
            gpus=gpus,
            gpu_product=gpu_product or topology.gpu_product,
            gpu_memory_mib=topology.gpu_memory_mib,
            labels=labels,
        )
        register_nodes(self.api, [node])
        wait_nodes_ready(self.api, [node.name], timeout_seconds=wait_ready_seconds)
        return node

    def lose_node(self, name: str) -> None:
        """Simulate losing a node (machine down, kubelet silent): its status is no longer written and
        its lease is taken from kwok and left to expire, so after the grace period the node lifecycle
        controller marks it Unknown, taints it unreachable and marks its pods not ready."""
        self.api.patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {NODE_LOST_ANNOTATION: "true"}}})
        lease = {"spec": {"holderIdentity": LOST_NODE_LEASE_HOLDER, "leaseDurationSeconds": 86400}}
        self.api.patch(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}", lease)

    def restore_node(self, name: str) -> None:
        """Bring a lost node back: kwok takes a fresh lease and reports the node Ready again."""
        self.api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
        self.api.patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {NODE_LOST_ANNOTATION: None}}})

    def remove_node(self, name: str) -> bool:
        """Delete a node object (its pods are left to the real controllers, as when a machine is lost)."""
        deleted: bool = self.api.delete(f"/api/v1/nodes/{name}")
        return deleted

    def status(self) -> list[ComponentStatus]:
        return component_status(self.state)


def free_port() -> int:
    """One free loopback port; ask `free_ports` for several at once, so that none repeats."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all held open while choosing, so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def load_state(state_dir: Path) -> ClusterState:
    path = StatePaths(state_dir).state_file
    if not path.is_file():
        raise ClusterError(
            f"no cluster in {state_dir} (missing {path.name}); start one with `goodput cluster up`"
        )
    return ClusterState.from_json(path.read_text())


def load(state_dir: Path) -> LocalCluster:
    return LocalCluster(load_state(state_dir))


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def up(spec: ClusterSpec, *, bin_dir: Path, progress: Progress = _stderr) -> LocalCluster:
    """Start every component, register the fake GPU nodes and wait until all is ready.

    On any failure the components already started are stopped (logs kept) and ClusterError says
    which component failed, with the end of its log.
    """
    started = time.monotonic()
    paths = StatePaths(spec.state_dir)
    _refuse_running_cluster(paths)
    if paths.root.exists():
        down(paths.root)  # a stale, stopped cluster of the same name: also removes its namespace
    paths.root.mkdir(parents=True)
    for folder in (paths.logs, paths.pids, paths.etcd_data, paths.prometheus_data, paths.scrape_targets):
        folder.mkdir()
    progress(f"cluster {spec.name}: state in {paths.root}")
    try:
        state = _prepare(spec, bin_dir, paths, progress)
        layout = state.layout
        client = KubeClient.from_kubeconfig(paths.kubeconfig)
        commands = component_commands(layout)
        urls = health_urls(layout)
        deadline = time.monotonic() + spec.ready_timeout_seconds
        for name in ("etcd", "kube-apiserver"):  # the others need a serving API server
            _start(name, commands[name], paths)
            _wait_healthy(name, urls[name], paths, deadline, ca_file=_ca_for(name, paths))
            progress(f"cluster {spec.name}: {name} ready")
        nodes = fake_gpu_nodes(spec.topology, layout.network)
        register_nodes(client, nodes)
        for name in COMPONENTS[2:]:
            _start(name, commands[name], paths)
        for name in COMPONENTS[2:]:
            _wait_healthy(name, urls[name], paths, deadline, ca_file=None)
            progress(f"cluster {spec.name}: {name} ready")
        wait_nodes_ready(client, [node.name for node in nodes], timeout_seconds=deadline - time.monotonic())
        progress(
            f"cluster {spec.name}: {len(nodes)} fake GPU nodes Ready ({spec.topology.describe()}); "
            f"up in {time.monotonic() - started:.1f} s"
        )
        return LocalCluster(state)
    except BaseException:
        with contextlib.suppress(Exception):
            down(paths.root, keep_logs=True)
        raise


def _refuse_running_cluster(paths: StatePaths) -> None:
    running = [
        name for name, record in processes.read_records(paths.pids).items() if processes.is_running(record)
    ]
    if running:
        raise ClusterError(
            f"a cluster in {paths.root} is already running ({', '.join(running)}); "
            "use it, or stop it with `goodput cluster down`"
        )


def _prepare(spec: ClusterSpec, bin_dir: Path, paths: StatePaths, progress: Progress) -> ClusterState:
    pki.create_cluster_pki(paths.pki)
    ports = Ports(*free_ports(len(Ports.__dataclass_fields__)))
    if spec.with_netns:
        plan = netns.create(spec.name, lock_dir=netns.ALLOCATION_LOCK_DIR)
        octet, netns_name = plan.network.octet, plan.name
        progress(f"cluster {spec.name}: pod range {plan.network.pod_range} routed into netns {plan.name}")
    else:
        octet = netns.choose_octet(netns.routes_in_use(), netns.existing_octets())
        netns_name = None
    state = ClusterState(
        name=spec.name,
        state_dir=paths.root,
        bin_dir=bin_dir,
        ports=ports,
        network_octet=octet,
        netns=netns_name,
        topology=spec.topology,
        scrape_interval_seconds=spec.scrape_interval_seconds,
    )
    paths.state_file.write_text(state.to_json() + "\n")
    layout = state.layout
    paths.kubeconfig.write_text(render_kubeconfig(layout))
    paths.kubeconfig.chmod(0o600)
    paths.kwok_config.write_text(render_kwok_config([path.read_text() for path in stage_files()]))
    paths.prometheus_config.write_text(render_prometheus_config(layout))
    paths.audit_policy.write_text(render_audit_policy())
    return state


def _ca_for(component: str, paths: StatePaths) -> Path | None:
    return paths.cert("ca") if component == "kube-apiserver" else None


def _start(name: str, argv: list[str], paths: StatePaths) -> None:
    binary = Path(argv[0])
    if not os.access(binary, os.X_OK):
        raise ClusterError(f"{name}: {binary} is missing or not executable")
    processes.spawn(name, argv, log_path=paths.log(name), pid_dir=paths.pids, cwd=paths.root)


def _wait_healthy(name: str, url: str, paths: StatePaths, deadline: float, *, ca_file: Path | None) -> None:
    record = processes.read_records(paths.pids)[name]
    detail = "no answer yet"
    while time.monotonic() < deadline:
        if not processes.is_running(record):
            raise ClusterError(
                f"{name} exited during start-up; last lines of {paths.log(name)}:\n{log_tail(paths, name)}"
            )
        healthy, detail = probe(url, ca_file=ca_file)
        if healthy:
            return
        time.sleep(0.2)
    raise ClusterError(
        f"{name} not ready at {url} in time ({detail}); last lines of its log:\n{log_tail(paths, name)}"
    )


def log_tail(paths: StatePaths, name: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(paths.log(name).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def register_nodes(client: KubeClient, nodes: Sequence[FakeGpuNode]) -> None:
    """Create the Node objects with their status (capacity, addresses), as a kubelet registers."""
    for node in nodes:
        manifest = node.manifest()
        try:
            created = client.create("/api/v1/nodes", manifest)
        except ApiError as error:
            if error.status == 409:
                raise ClusterError(f"node {node.name} already exists") from None
            raise
        # Status sent on create is kept for nodes; if a future API server drops it, post it explicitly.
        if created.get("status", {}).get("capacity", {}).get(GPU_RESOURCE) != str(node.gpus):
            client.patch(f"/api/v1/nodes/{node.name}/status", {"status": manifest["status"]})


def wait_nodes_ready(client: KubeClient, names: Sequence[str], *, timeout_seconds: float) -> None:
    deadline = time.monotonic() + max(timeout_seconds, 1.0)
    pending = set(names)
    while time.monotonic() < deadline:
        items = client.request("GET", "/api/v1/nodes")["items"]
        ready = {item["metadata"]["name"] for item in items if _condition(item, "Ready") == "True"}
        pending -= ready
        if not pending:
            return
        time.sleep(0.25)
    raise ClusterError(f"nodes not Ready in time: {', '.join(sorted(pending))} (see the kwok log)")


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for condition in obj.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return None


def down(state_dir: Path, *, keep_logs: bool = False) -> DownReport:
    """Stop exactly the processes this cluster started (PID, binary and start time must match), remove
    its network namespace, and delete its state (keeping `logs/` if asked).

    Returns once every process it stopped has exited whole, its ports closed (SIGTERM, SIGKILL after
    a grace, then a bounded wait), so an `up` right after never meets them; a process that outlived
    even that is named in the report's `still_exiting`."""
    paths = StatePaths(state_dir)
    state = None
    with contextlib.suppress(ClusterError, ValueError, KeyError):
        state = load_state(state_dir)
    records = processes.read_records(paths.pids)
    add_ons = sorted(name for name in records if name not in COMPONENTS)  # KEDA: it needs the control plane
    outcomes = {
        name: processes.stop_process(records[name])
        for name in [*add_ons, *reversed(COMPONENTS)]
        if name in records
    }
    netns_removed = None
    netns_pids: list[int] = []
    netns_exiting: list[int] = []
    if state is not None and state.netns is not None:
        plan = netns.NetnsPlan(state.netns, PodNetwork(state.network_octet))
        netns_pids, netns_exiting = netns.delete(plan)
        netns_removed = state.netns
    logs_kept = None
    if paths.root.exists():
        if keep_logs and paths.logs.is_dir():
            for entry in paths.root.iterdir():
                if entry != paths.logs:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            logs_kept = paths.logs
        else:
            shutil.rmtree(paths.root)
    return DownReport(
        stopped=tuple(name for name, outcome in outcomes.items() if outcome != "not running"),
        not_running=tuple(name for name, outcome in outcomes.items() if outcome == "not running"),
        netns_removed=netns_removed,
        netns_processes_stopped=tuple(netns_pids),
        logs_kept_in=logs_kept,
        killed=tuple(name for name, outcome in outcomes.items() if outcome == "killed"),
        still_exiting=(
            *(name for name, outcome in outcomes.items() if outcome == "still exiting"),
            *(f"pid {pid}" for pid in netns_exiting),
        ),
    )


def component_status(state: ClusterState) -> list[ComponentStatus]:
    layout = state.layout
    records = processes.read_records(layout.paths.pids)
    urls = health_urls(layout)
    statuses = []
    for name in COMPONENTS:
        record = records.get(name)
        running = record is not None and processes.is_running(record)
        healthy, detail = (False, "not running")
        if running:
            healthy, detail = probe(urls[name], ca_file=_ca_for(name, layout.paths))
        statuses.append(
            ComponentStatus(
                name=name,
                pid=record.pid if record else None,
                running=running,
                healthy=healthy,
                detail=detail if running else "not running",
            )
        )
    return statuses


def gpu_nodes_by_clique(cluster: LocalCluster) -> dict[str, list[str]]:
    """Node names per NVLink domain, read from the cluster (so nodes added later count too)."""
    result: dict[str, list[str]] = {}
    for item in cluster.api.request("GET", "/api/v1/nodes")["items"]:
        clique = item["metadata"].get("labels", {}).get(CLIQUE_LABEL)
        if clique:
            result.setdefault(clique, []).append(item["metadata"]["name"])
    return {clique: sorted(names) for clique, names in sorted(result.items())}
