"""The autoscaler's decision, split as the HorizontalPodAutoscaler splits its own.

- `decision`: `decide`, the loop of one tick: observe, estimate, propose, combine, then the guards
  and the HPA's `behavior`, in that order;
- `observe`: the groups counted by state and the fresh metrics of the ready ones pooled;
- `estimate`: the replica calculator's half: demand, queue, slack, KV and attainment estimates;
- `proposals`: one proposed count per signal, and how they combine;
- `guards`: what may hold the count (stale metrics, capacity on its way, an unsafe scale-in);
- `behavior`: the HPA's stabilisation windows, step limits and bounds, for complete groups;
- `model`: the value types (policy, snapshot, state, decision);
- `snapshot`, `feasible_demand`, `record`: the counting rules before a decision, the demand no count
  serves, and how a decision is recorded.
"""

from goodput.controllers.autoscale.decision import decide

__all__ = ["decide"]
