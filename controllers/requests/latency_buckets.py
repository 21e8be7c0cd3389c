"""The bucket bounds of the request path's latency histograms, declared once for the gateway that
exports them and the simulator's gateway that stands in for it, so a simulated run reads its
attainment at the resolution a deployed gateway gives the autoscaler.

vLLM's own TTFT and E2E buckets reach minutes; the gateway's ITL buckets are finer.
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
