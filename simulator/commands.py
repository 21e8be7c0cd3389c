"""The simulator's `goodput` subcommands, published to the CLI through the `goodput.commands` entry
points: a table of module names and help lines, cheap to import (no simulator code is loaded)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("goodput.simulator.cli_simulate", "replay a trace through a simulated vLLM fleet"),
    "bench": ("goodput.simulator.cli_bench", "compare scaling policies on one trace and seed"),
}
