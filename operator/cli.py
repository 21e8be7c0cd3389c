"""The `goodput` command line: one entry point, each subcommand owned by the layer that does the work.

The operator's own subcommands are listed here. The other layers (the simulator, the test bed, which
is a distribution of its own and never shipped) publish a small table of theirs under the entry-point
group `goodput.commands`, so the operator names none of them and imports none of their code.
A subcommand's module is imported only when chosen, so `goodput --help` stays fast and a missing
optional component never breaks an unrelated command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points

COMMANDS_GROUP = "goodput.commands"

# name -> (module exposing add_arguments(parser) and run(args) -> int, one-line help)
CommandTable = Mapping[str, tuple[str, str]]

OPERATOR_COMMANDS: CommandTable = {
    "crds": ("goodput.operator.cmd_crds", "render the CRDs from the API models into crds/"),
    "run": ("goodput.operator.main", "run the operator against the current kubeconfig"),
    "explain": (
        "goodput.operator.cmd_explain",
        "print a ModelGroup's last scaling decisions and their reasons",
    ),
    "doctor": (
        "goodput.operator.cmd_doctor",
        "check that the cluster gives goodput what it needs, each problem with its fix",
    ),
}


def discovered_commands() -> dict[str, tuple[str, str]]:
    """The operator's commands, then each installed layer's table (first name wins on a clash)."""
    commands = dict(OPERATOR_COMMANDS)
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda entry: entry.name):
        table: CommandTable = entry.load()
        for name, command in table.items():
            commands.setdefault(name, command)
    return commands


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="goodput", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module_name, help_text) in discovered_commands().items():
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
