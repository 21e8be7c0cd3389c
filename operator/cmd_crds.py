"""`goodput crds`: write the CRDs rendered from the API models into crds/, or check that they are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from goodput.api.crd import render_crds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("crds"),
        metavar="DIR",
        help="directory of the CRD files (default: crds)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name each file that is missing, stale or not generated",
    )


def stale_files(directory: Path, rendered: dict[str, str]) -> list[str]:
    """Problems that make `directory` differ from the rendered CRDs, one line per file."""
    problems = []
    for name, text in rendered.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: stale")
    existing = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    problems += [
        f"{path}: not rendered from the API models" for path in existing if path.name not in rendered
    ]
    return problems


def run(args: argparse.Namespace) -> int:
    directory: Path = args.out
    rendered = render_crds()
    if args.check:
        problems = stale_files(directory, rendered)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `goodput crds` (or `make crds`) to regenerate", file=sys.stderr)
            return 1
        print(f"{directory}: {len(rendered)} CRDs up to date")
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 0
