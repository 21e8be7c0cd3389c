"""`goodput crds`: write the CRDs rendered from the API models into crds/, or check that they are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from goodput.api.crd import render_crds
from goodput.api.reference import REFERENCE_FILE, render_reference

# The Markdown reference is rendered from the same schema and kept in docs/.
REFERENCE_DIRECTORY = Path("docs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("crds"),
        metavar="DIR",
        help="directory of the CRD files (default: crds)",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        default=REFERENCE_DIRECTORY,
        metavar="DIR",
        help=f"directory of the API reference, {REFERENCE_FILE} (default: docs)",
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


def stale_reference(path: Path, text: str) -> list[str]:
    if not path.is_file():
        return [f"{path}: missing"]
    return [] if path.read_text(encoding="utf-8") == text else [f"{path}: stale"]


def run(args: argparse.Namespace) -> int:
    directory: Path = args.out
    rendered = render_crds()
    reference_path: Path = args.docs / REFERENCE_FILE
    reference = render_reference()
    if args.check:
        problems = stale_files(directory, rendered) + stale_reference(reference_path, reference)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `goodput crds` (or `make crds`) to regenerate", file=sys.stderr)
            return 1
        print(f"{directory}: {len(rendered)} CRDs up to date; {reference_path} up to date")
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale_reference(reference_path, reference):
        reference_path.parent.mkdir(parents=True, exist_ok=True)
        reference_path.write_text(reference, encoding="utf-8")
        print(f"wrote {reference_path}")
    return 0
