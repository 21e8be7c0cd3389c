"""goodput's own Prometheus series: how each program declares them, and every histogram's buckets.

The style, one for every program (the operator, its autoscaler, the gateway, the agent): a program's
series are attributes of one metrics class on a registry passed in (a test builds a fresh one and
reads it back), declared by concern in `_declare_<concern>(registry)` methods as
`Counter | Gauge | Histogram(name, documentation, labelnames, registry=…)`; a histogram's
`buckets=` is always a named set from this module, never written inline, so a set two programs
share (the gateway and the simulator's gateway) exists once and a second copy of its values is a
test failure (tests/test_names.py). Series whose values are read from a snapshot at scrape time
(the simulator's and emulator's vLLM `/metrics`, the emulated DCGM exporter) are a prometheus_client
`Collector` yielding metric families instead; vLLM's own names and bucket bounds are vLLM's contract
(`goodput.api.vllm_names`, `goodput.simulator.metrics`).

The request path's latency buckets are declared here for the gateway that exports them and the
simulator's gateway that stands in for it, so a simulated run reads its attainment at the resolution
a deployed gateway gives the autoscaler. vLLM's own TTFT and E2E buckets reach minutes; the
gateway's ITL buckets are finer.
"""

from __future__ import annotations

from typing import Final

GATEWAY_TTFT_BUCKETS_SECONDS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
GATEWAY_ITL_BUCKETS_SECONDS: Final = (
    0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
)  # fmt: skip
GATEWAY_E2E_BUCKETS_SECONDS: Final = (
    0.1, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
)  # fmt: skip

GROUP_LIFECYCLE_BUCKETS_SECONDS: Final = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
"""A group's time to ready (seconds for a warm image on a small model, an hour for a cold 405B load)
and a drain's length (one settle period for an idle group, up to drain.maxSeconds, default 600 s)."""
RECONCILE_BUCKETS_SECONDS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
"""One reconcile pass of the group controller."""
DECISION_BUCKETS_SECONDS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""One autoscaler decision, from the metrics query to the scale write."""
