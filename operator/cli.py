"""The `goodput` command line: one entry point, each subcommand owned by the layer that does the work.

Subcommand modules are imported only when chosen, so `goodput --help` stays fast and a missing
optional component never breaks an unrelated command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module exposing add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "crds": ("goodput.operator.cmd_crds", "render the CRDs from the API models into crds/"),
    "cluster": ("goodput.cluster.cli", "a local control plane with fake GPU nodes (up|down|status|env)"),
    "simulate": ("goodput.simulator.cli_simulate", "replay a trace through a simulated vLLM fleet"),
    "bench": ("goodput.simulator.cli_bench", "compare scaling policies on one trace and seed"),
    "envelope": (
        "goodput.simulator.cli_envelope",
        "measure a ModelGroup's capacity envelope on a trace; print the profile block",
    ),
    "run": ("goodput.operator.main", "run the operator against the current kubeconfig"),
    "demo": ("goodput.operator.cmd_demo", "the whole loop on a local cluster under a replayed trace"),
    "explain": (
        "goodput.operator.cmd_explain",
        "print a ModelGroup's last scaling decisions and their reasons",
    ),
    "emulate": (
        "goodput.simulator.cli_emulate",
        "serve vLLM's endpoints and metrics at the cluster's pod IPs",
    ),
    "load": ("goodput.simulator.cli_load", "replay a trace as real HTTP requests, open loop, bounded"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="goodput", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(arguments).parse_args(arguments)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
