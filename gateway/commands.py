"""The gateway's `goodput` subcommand, published to the CLI through the `goodput.commands` entry
points: a table of module names and help lines, cheap to import (no gateway code is loaded)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "gateway": (
        "goodput.gateway.cli",
        "serve the OpenAI API in front of a ModelGroup: admission, tenant fairness, work-aware routing",
    ),
}
