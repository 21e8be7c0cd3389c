"""The ModelGroup controller's decisions: group lifecycle, replacement and scale, as one pure plan.

A group moves Placing → Provisioning → Warming → Ready (→ Draining), and any rank's failure makes
the whole group Failed: it leaves the ready count at once and is deleted whole, and the shortfall is
made up by a new, complete group (design note §30, §34). Every tick the operator builds a `World`
(the ModelGroup's pods, the cluster's GPU inventory, warm-up results, `now`), calls
`plan_model_group`, and applies the returned `Plan`. The plan is deterministic: the same world gives
the same plan, so a restarted operator picks up exactly where the last one stopped.

- `model`: the value types (world, assessment, actions, plan).
- `lifecycle`: the per-group state machine; every transition written once, named by its cause.
- `assess`: a group's state from its pods (the observed transitions).
- `stages`: the decisions of a tick, in a fixed order: failures, readiness, drains, scale, rollout.
- `actions`: the operator's actions each decided transition calls for.
- `controller`: `plan_model_group`, the one entry.
- the rest: the pods a group runs (`pods`, `agent_sidecar`, `template`), where it fits
  (`placement`, `dynamic_resources`), how it drains (`drain`), what the status says (`status`) and
  the operator's unobserved writes (`expectations`).

The package imports nothing itself: a module that needs one record (a drain outcome, a placement
verdict) does not load the whole controller.
"""
