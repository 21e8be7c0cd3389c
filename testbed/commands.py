"""The test bed's `goodput` subcommands, published to the CLI through the `goodput.commands` entry
points when the test bed is installed (development machines and CI; never the operator's image)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "ab": ("goodput.testbed.ab", "goodput, the real KEDA and the real HPA on one cluster and replay"),
    "cluster": (
        "goodput.testbed.cluster.cli",
        "a local control plane with fake GPU nodes (up|down|status|env)",
    ),
    "demo": ("goodput.testbed.demo", "the whole loop on a local cluster under a replayed trace"),
    "emulate": ("goodput.testbed.cli_emulate", "serve vLLM's endpoints and metrics at the cluster's pod IPs"),
    "load": ("goodput.testbed.cli_load", "replay a trace as real HTTP requests, open loop, bounded"),
}
