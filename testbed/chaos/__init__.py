"""The chaos run: seeded faults against the local cluster, the live emulator and streaming load, with
invariants checked every second and a report (`make chaos`, `e2e/test_chaos.py`).

- `schedule`: the plan of faults and stimuli from a seed (pure);
- `invariants`: the rules over a frozen observation and the accounting of streams (pure);
- `faults`: the injectors (operator kills aimed at moments, API server / etcd restarts, Prometheus
  stopped, slowed or missing series through `promproxy`, a node lost, ranks crashed, engines hung);
- `run`: the stage, the loops that inject, observe and load, and the report.
"""
