"""The request path's decisions: admission at the door, tenant fairness in the queue, routing to a
group (`admission`, `fairness`, `routing`), and `path_policy`, the whole of it compiled once per
ModelGroup so that any shell (the gateway, the simulator) serves the same rules.

The package imports nothing itself.
"""
