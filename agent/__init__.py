"""The GPU and NCCL health agent that runs beside vLLM in every rank (a native sidecar).

It reads the pod's GPUs through NVML, runs a small all-reduce across the group's ranks, watches the
engine's own metrics for a hang and reads the revision the engine loaded; it publishes what it found
as its pod's conditions (`goodput.dev/GPUHealthy`, `goodput.dev/NCCLHealthy`,
`goodput.dev/EngineHealthy`), the model-revision annotation and Prometheus metrics. The group
controller fails a whole group when any rank reports a critical fault, and replaces it.

Decisions are pure functions of frozen readings (`gpu`, `nccl`, `engine`, `revision`); the shell
(`nvml`, `emulated`, `collective`, `publish`, `main`) does the I/O.
"""
