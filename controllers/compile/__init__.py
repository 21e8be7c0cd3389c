"""The one compile: from a ModelGroup and its SLOPolicy to what each program obeys.

- `slo_policy`: whether an SLOPolicy revision is accepted, and why not (`policy_problems`);
- `scaling`: `compile_policy`, the autoscaler's policy and capacity profile, the only way in for
  the operator, the simulator and the gateway;
- `request_path`: the request path's policy (admission, fairness, routing) built on the same
  compile.

It sits above the programs (`autoscale`, `groups`, `requests`), which never import it.
The package imports nothing itself.
"""
