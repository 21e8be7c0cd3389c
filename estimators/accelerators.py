"""Accelerators the service-time model prices: peak figures from vendor datasheets, with their source.

A GPU enters the roofline (`service_time.StepCostModel`) through its dense tensor FLOPs per GEMM
precision, its memory bandwidth and size, and its interconnect. The peaks are the vendors' figures
for dense math (half the "with sparsity" figure NVIDIA and AMD headline); what a serving engine
reaches of them is the efficiency triple, measured on the A100 and H100 (perf-model §1.2) and
carried to the others as an assumption, since no public measurement of vLLM's GEMM, attention and
bandwidth efficiency exists for them. Each entry names the document its figures come from, so a
platform team can check them against its own SKU (PCIe and NVL variants differ) or describe its
own accelerator in the ModelGroup instead.
"""

from __future__ import annotations

from dataclasses import dataclass

GEMM_PRECISIONS = ("bf16", "fp8", "fp4")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak figures and achieved efficiencies of one accelerator.

    flops: dense BF16/FP16 tensor FLOP/s, the rate of every GEMM without a faster format.
    fp8_flops, fp4_flops: dense FP8 and FP4 tensor FLOP/s; 0 where the chip has no such unit, and
        then weights stored in that format are dequantised into BF16 GEMMs (weight-only kernels).
    memory_gib_reported: the memory vLLM sees, in GiB; it picks vLLM's default batch limits.
    link_bytes_per_second: the GPU-to-GPU link per direction (NVLink, Infinity Fabric or PCIe).
    """

    name: str
    flops: float
    memory_bandwidth_bytes_per_second: float
    memory_bytes: float
    compute_efficiency: float
    attention_efficiency: float
    bandwidth_efficiency: float
    allreduce_latency_seconds: float
    allreduce_bytes_per_second: float
    memory_gib_reported: float
    fp8_flops: float = 0.0
    fp4_flops: float = 0.0
    link_bytes_per_second: float = 0.0
    source: str = ""

    def gemm_flops(self, precision: str) -> float:
        """Dense FLOP/s of a GEMM whose weights and activations are in `precision`, on this chip.

        A format the chip has no tensor unit for runs as a weight-only kernel at the BF16 rate
        (FP8 weights on an A100 go through Marlin; FP4 on a Hopper likewise), never faster.
        """
        rate = {"fp8": self.fp8_flops, "fp4": self.fp4_flops}.get(precision, 0.0)
        return rate if rate > 0 else self.flops


# The efficiency triple (GEMM, flash attention, HBM bandwidth) measured for the H100 and carried to
# accelerators that have no public vLLM measurement: an assumption, stated as one.
ASSUMED_COMPUTE_EFFICIENCY = 0.65
ASSUMED_ATTENTION_EFFICIENCY = 0.45
ASSUMED_BANDWIDTH_EFFICIENCY = 0.80
# The H100's all-reduce bus bandwidth (200 GB/s, Vidur's DGX profile) over its NVLink per direction
# (450 GB/s): the share of a link an all-reduce reaches, carried to the other links.
ALLREDUCE_SHARE_OF_LINK = 200e9 / 450e9
PCIE_GEN4_X16_BYTES_PER_SECOND = 32e9  # per direction: 64 GB/s bidirectional
PCIE_ALLREDUCE_LATENCY_SECONDS = 25e-6
GIB = 1024**3


def datasheet_gpu(
    name: str,
    *,
    bf16_flops: float,
    fp8_flops: float,
    memory_bytes: float,
    bandwidth_bytes_per_second: float,
    link_bytes_per_second: float,
    allreduce_latency_seconds: float,
    source: str,
    fp4_flops: float = 0.0,
) -> GpuSpec:
    """An accelerator known by its datasheet alone: the assumed efficiencies, an all-reduce at the
    H100's share of its link, and the memory vLLM sees taken as the datasheet's bytes in GiB."""
    return GpuSpec(
        name=name,
        flops=bf16_flops,
        memory_bandwidth_bytes_per_second=bandwidth_bytes_per_second,
        memory_bytes=memory_bytes,
        compute_efficiency=ASSUMED_COMPUTE_EFFICIENCY,
        attention_efficiency=ASSUMED_ATTENTION_EFFICIENCY,
        bandwidth_efficiency=ASSUMED_BANDWIDTH_EFFICIENCY,
        allreduce_latency_seconds=allreduce_latency_seconds,
        allreduce_bytes_per_second=ALLREDUCE_SHARE_OF_LINK * link_bytes_per_second,
        memory_gib_reported=memory_bytes / GIB,
        fp8_flops=fp8_flops,
        fp4_flops=fp4_flops,
        link_bytes_per_second=link_bytes_per_second,
        source=source,
    )


# The two the service-time model was built on (perf-model §1.2): measured efficiencies and
# all-reduce figures (Vidur), and the calculator's memory size (80e9 B); peaks from NVIDIA's A100
# (…1758950-r4) and H100 datasheets.
A100_80G = GpuSpec(
    "a100-80g", 312e12, 2.039e12, 80e9, 0.70, 0.45, 0.80, 25e-6, 100e9, 80.0,
    link_bytes_per_second=300e9,
    source="NVIDIA A100 datasheet (SXM 80GB): 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, NVLink 600 GB/s",
)  # fmt: skip
H100_80G = GpuSpec(
    "h100-80g", 989e12, 3.35e12, 80e9, 0.65, 0.45, 0.80, 18e-6, 200e9, 79.6,
    fp8_flops=1979e12,
    link_bytes_per_second=450e9,
    source="NVIDIA H100 datasheet (SXM): 989 TFLOPS BF16 and 1,979 FP8 dense, 3.35 TB/s HBM3, "
    "NVLink 900 GB/s",
)  # fmt: skip
A100_40G = GpuSpec(
    "a100-40g", 312e12, 1.555e12, 40e9, 0.70, 0.45, 0.80, 25e-6, 100e9, 40e9 / GIB,
    link_bytes_per_second=300e9,
    source="NVIDIA A100 datasheet (SXM 40GB): 312 TFLOPS BF16 dense, 1,555 GB/s HBM2, NVLink 600 GB/s; "
    "efficiencies and all-reduce as the A100 80GB (the same chip)",
)  # fmt: skip
H200 = datasheet_gpu(
    "h200",
    bf16_flops=989e12,
    fp8_flops=1979e12,
    memory_bytes=141e9,
    bandwidth_bytes_per_second=4.8e12,
    link_bytes_per_second=450e9,
    allreduce_latency_seconds=H100_80G.allreduce_latency_seconds,
    source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 and 1,979 FP8 dense, 141 GB HBM3e at 4.8 TB/s, "
    "NVLink 900 GB/s",
)
B200 = datasheet_gpu(
    "b200",
    bf16_flops=2250e12,
    fp8_flops=4500e12,
    fp4_flops=9000e12,
    memory_bytes=180e9,
    bandwidth_bytes_per_second=7.7e12,
    link_bytes_per_second=900e9,
    allreduce_latency_seconds=H100_80G.allreduce_latency_seconds,
    source="NVIDIA HGX B200 platform specification: 2,250 TFLOPS BF16, 4,500 FP8 and 9,000 FP4 dense, "
    "180 GB HBM3e at 7.7 TB/s, NVLink 5 1.8 TB/s",
)
MI300X = datasheet_gpu(
    "mi300x",
    bf16_flops=1307.4e12,
    fp8_flops=2614.9e12,
    memory_bytes=192e9,
    bandwidth_bytes_per_second=5.3e12,
    link_bytes_per_second=448e9,
    allreduce_latency_seconds=A100_80G.allreduce_latency_seconds,
    source="AMD Instinct MI300X data sheet: 1,307.4 TFLOPS BF16 and 2,614.9 FP8 dense, 192 GB HBM3 at "
    "5.3 TB/s, Infinity Fabric 896 GB/s aggregate",
)
L40S = datasheet_gpu(
    "l40s",
    bf16_flops=362.05e12,
    fp8_flops=733e12,
    memory_bytes=48e9,
    bandwidth_bytes_per_second=864e9,
    link_bytes_per_second=PCIE_GEN4_X16_BYTES_PER_SECOND,
    allreduce_latency_seconds=PCIE_ALLREDUCE_LATENCY_SECONDS,
    source="NVIDIA L40S datasheet: 362.05 TFLOPS BF16 and 733 FP8 dense, 48 GB GDDR6 at 864 GB/s, "
    "PCIe Gen4 x16 (no NVLink)",
)
L4 = datasheet_gpu(
    "l4",
    bf16_flops=121e12,
    fp8_flops=242.5e12,
    memory_bytes=24e9,
    bandwidth_bytes_per_second=300e9,
    link_bytes_per_second=PCIE_GEN4_X16_BYTES_PER_SECOND,
    allreduce_latency_seconds=PCIE_ALLREDUCE_LATENCY_SECONDS,
    source="NVIDIA L4 datasheet: 121 TFLOPS BF16 and 242.5 FP8 dense, 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16",
)
A10G = datasheet_gpu(
    "a10g",
    bf16_flops=70e12,
    fp8_flops=0.0,
    memory_bytes=24e9,
    bandwidth_bytes_per_second=600e9,
    link_bytes_per_second=PCIE_GEN4_X16_BYTES_PER_SECOND,
    allreduce_latency_seconds=PCIE_ALLREDUCE_LATENCY_SECONDS,
    source="AWS EC2 G5 documentation (24 GB GDDR6) and Baseten, 'NVIDIA A10 vs A10G for ML model "
    "inference' (600 GB/s; 70 TFLOPS BF16 tensor, against the A10's 125): NVIDIA publishes no A10G "
    "datasheet, so the tensor figure is a secondary one",
)

GPUS: dict[str, GpuSpec] = {
    gpu.name: gpu for gpu in (L4, L40S, A10G, A100_40G, A100_80G, H100_80G, H200, B200, MI300X)
}
