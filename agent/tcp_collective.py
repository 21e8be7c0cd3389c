"""An emulated collective: a real all-reduce of numpy buffers across processes over TCP.

Gather to the leader and broadcast back: every follower sends its buffer to rank 0, which sums
them and sends the sum to each. It stands in for NCCL where there is no GPU (tests, the live
emulator) and keeps the check's behaviour real: a missing rank stalls the rendezvous, a slow
link (`delay_seconds`) lowers the measured bandwidth, a hung rank (`hang`) stalls everyone until
the check's bound. Every socket wait is bounded by the rendezvous timeout.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np

from goodput.agent.nccl import CollectiveError, RankSpec

_HEADER = struct.Struct("!Q")
_HELLO = struct.Struct("!I")


class TcpCollective:
    def __init__(self, spec: RankSpec) -> None:
        self._spec = spec
        self._peers: dict[int, socket.socket] = {}
        self._leader: socket.socket | None = None
        deadline = time.monotonic() + spec.rendezvous_timeout_seconds
        if spec.rank == 0:
            self._accept_peers(deadline)
        else:
            self._leader = _connect(spec.leader_host, spec.port, deadline)
            self._leader.sendall(_HELLO.pack(spec.rank))

    def _accept_peers(self, deadline: float) -> None:
        spec = self._spec
        listener = socket.create_server(("", spec.port), reuse_port=False)
        try:
            while len(self._peers) < spec.world_size - 1:
                listener.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    peer, _ = listener.accept()
                except TimeoutError as error:
                    raise TimeoutError(
                        f"rendezvous: {len(self._peers) + 1} of {spec.world_size} ranks joined "
                        f"within {spec.rendezvous_timeout_seconds:g}s"
                    ) from error
                peer.settimeout(spec.rendezvous_timeout_seconds)
                (rank,) = _HELLO.unpack(_receive(peer, _HELLO.size))
                self._peers[rank] = peer
        finally:
            listener.close()

    def all_reduce(self, size_bytes: int) -> float:
        spec = self._spec
        buffer = np.full(max(1, size_bytes // 4), spec.rank + 1, dtype=np.float32)
        start = time.perf_counter()
        if spec.hang:
            threading.Event().wait()  # joined the group, never takes part: the peers wait on us
        if spec.rank == 0:
            total = buffer.copy()
            for peer in self._peers.values():
                total += _receive_array(peer, buffer.nbytes)
            for peer in self._peers.values():
                self._send(peer, total)
        else:
            assert self._leader is not None
            self._send(self._leader, buffer)
            total = _receive_array(self._leader, buffer.nbytes)
        elapsed = time.perf_counter() - start
        expected = spec.world_size * (spec.world_size + 1) / 2
        if not np.all(total == expected):
            raise CollectiveError(f"all-reduce returned {float(total[0])}, expected {expected}")
        return elapsed

    def _send(self, peer: socket.socket, array: np.ndarray) -> None:
        if self._spec.delay_seconds:
            time.sleep(self._spec.delay_seconds)
        payload = array.tobytes()
        peer.sendall(_HEADER.pack(len(payload)) + payload)

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()
        if self._leader is not None:
            self._leader.close()


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """Retries until the leader listens (it may start later than us) or the deadline passes."""
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            peer = socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic()))
            peer.settimeout(max(0.01, deadline - time.monotonic()))
            return peer
        except OSError as error:
            last = error
            time.sleep(0.05)
    raise TimeoutError(f"rendezvous: the leader at {host}:{port} did not answer ({last})")


def _receive(peer: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = peer.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise CollectiveError("a peer closed the connection during the all-reduce")
        chunks += chunk
    return bytes(chunks)


def _receive_array(peer: socket.socket, size: int) -> np.ndarray:
    (length,) = _HEADER.unpack(_receive(peer, _HEADER.size))
    if length != size:
        raise CollectiveError(f"a peer sent {length} bytes, expected {size}")
    return np.frombuffer(_receive(peer, length), dtype=np.float32)
