"""The README and docs/ hold only what the repository can back: links that resolve, no reference to
anything outside it, and commands that run as written.

Every fenced ```bash, ```sh or ```console block is read as shell: each `goodput` command is parsed
by the CLI's own argparse parser (subcommand, flags and choices), each `make` target must exist in
the Makefile, each path into the repository must exist (and a manifest applied with kubectl must
parse), and each `helm install`/`helm upgrade` must name the chart and values that exist; those are
then rendered for real with `helm template` where helm is built. Inline `goodput ...` and
`make ...` spans of the prose are held to the same names and flags, and every code name the glossary
of docs/concepts.md gives must be defined in the product's sources.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from goodput.operator.cli import build_parser, discovered_commands

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = (README, *sorted((ROOT / "docs").glob("*.md")))
CHART = ROOT / "charts" / "goodput"
README_MAX_LINES = 260

# Top-level folders of the repository: a command token that starts with one of them names a file here.
REPO_DIRS = (
    "agent",
    "api",
    "bench",
    "charts",
    "controllers",
    "crds",
    "docs",
    "e2e",
    "estimators",
    "gateway",
    "manifests",
    "operator",
    "simulator",
    "testbed",
    "tests",
    "tools",
)
REPO_PATH = re.compile(rf"^(?:\./)?(?:{'|'.join(REPO_DIRS)})/[\w./-]*$")
OUTSIDE = (
    re.compile(r"\.\./shared"),
    re.compile(r"/work/"),
    re.compile(r"\bseed/"),
    re.compile(r"DESIGN\.md"),
    re.compile(r"§"),
    re.compile(r"design note", re.IGNORECASE),
)
FENCE = re.compile(r"^```([\w-]*)\s*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
SHELL_LANGUAGES = {"bash", "sh", "console", "shell"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _without_fences(text: str) -> str:
    return FENCE.sub("", text)


# --- the README's size ------------------------------------------------------------------------------


def test_readme_is_at_most_260_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


# --- links ------------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but `-` and `_`, spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _without_fences(path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = _slug(match[1])
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


def _links() -> Iterator[tuple[Path, str]]:
    for doc in DOCS:
        for target in LINK.findall(_without_fences(doc.read_text())):
            yield doc, target


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_relative_link_resolves_to_a_file_of_the_repository(doc: Path) -> None:
    problems = []
    for target in LINK.findall(_without_fences(doc.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            problems.append(f"{target}: no such file in the repository")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            problems.append(f"{target}: {_rel(resolved)} has no heading with anchor #{anchor}")
    assert not problems, f"{_rel(doc)}:\n" + "\n".join(problems)


def test_the_links_are_found() -> None:
    """The link pattern still matches the docs' links (a test of the test)."""
    assert sum(1 for _ in _links()) > 30


# --- nothing outside the repository -----------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_no_doc_cites_anything_outside_the_repository(doc: Path) -> None:
    found = [
        f"line {number}: {pattern.pattern!r} in {line.strip()[:100]!r}"
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        for pattern in OUTSIDE
        if pattern.search(line)
    ]
    assert not found, f"{_rel(doc)} refers outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_repository_path_in_backticks_exists(doc: Path) -> None:
    missing = [
        span
        for span in INLINE_CODE.findall(_without_fences(doc.read_text()))
        if REPO_PATH.match(span) and not (ROOT / span).exists()
    ]
    assert not missing, f"{_rel(doc)} names paths that do not exist: {missing}"


# --- commands ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    doc: Path
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{_rel(self.doc)}: {shlex.join(self.words)}"


def _shell_lines(language: str, body: str) -> Iterator[str]:
    """The command lines of a block: continuations joined; in a console block only `$ ` lines."""
    lines: list[str] = []
    pending = ""
    continuing = False
    for raw in body.splitlines():
        line = raw.rstrip()
        if language == "console" and not continuing:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continuing = True
            continue
        lines.append(pending + line)
        pending = ""
        continuing = False
    if pending:
        lines.append(pending)
    yield from (line for line in lines if line.strip())


SEPARATORS = {"&&", "||", ";", "|"}


def _commands_of_line(doc: Path, line: str) -> Iterator[Command]:
    for inner in re.findall(r"\$\(([^()]*)\)", line):
        yield from _commands_of_line(doc, inner)
    line = re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in lexer:
        if token in SEPARATORS:
            if words:
                yield Command(doc, tuple(words))
            words = []
        else:
            words.append(token)
    if words:
        yield Command(doc, tuple(words))


@cache
def documented_commands() -> tuple[Command, ...]:
    commands: list[Command] = []
    for doc in DOCS:
        for language, body in FENCE.findall(doc.read_text()):
            if language in SHELL_LANGUAGES:
                for line in _shell_lines(language, body):
                    commands.extend(_commands_of_line(doc, line))
    return tuple(commands)


def _program(command: Command) -> tuple[str, tuple[str, ...]]:
    """The program's base name and its arguments, past `sudo` and leading VAR=value assignments."""
    words = list(command.words)
    while words and (
        words[0] in {"sudo", "time", "/usr/bin/time", "-v", "eval"} or re.match(r"^\w+=", words[0])
    ):
        words.pop(0)
    if not words:
        return "", ()
    return Path(words[0]).name, tuple(words[1:])


def _commands_of(program: str) -> list[Command]:
    return [command for command in documented_commands() if _program(command)[0] == program]


def test_the_documented_commands_are_found() -> None:
    """Each kind of command the docs show is extracted (a test of the test)."""
    programs = {_program(command)[0] for command in documented_commands()}
    assert {"goodput", "make", "helm", "kubectl"} <= programs


# --- goodput ----------------------------------------------------------------------------------------


def _parse(args: tuple[str, ...]) -> str | None:
    """None when the CLI's own parser accepts the arguments, else what it said."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            build_parser(args).parse_args(args)
    except SystemExit as stop:
        if stop.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {stop.code}"
    return None


@pytest.mark.parametrize("command", _commands_of("goodput"), ids=str)
def test_every_documented_goodput_command_parses(command: Command) -> None:
    _, args = _program(command)
    problem = _parse(args)
    assert problem is None, f"{command}: {problem}"


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser([name])
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    raise AssertionError("the goodput parser has no subcommands")


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    options: set[str] = set()
    for action in parser._actions:
        options.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= _option_strings(sub)
    return options


def _inline_spans(prefix: str) -> Iterator[tuple[Path, str]]:
    for doc in DOCS:
        for span in INLINE_CODE.findall(_without_fences(doc.read_text())):
            words = span.split()
            if words and Path(words[0]).name == prefix and len(words) > 1:
                yield doc, span


def test_every_goodput_subcommand_and_flag_named_in_the_prose_exists() -> None:
    commands = discovered_commands()
    problems = []
    for doc, span in _inline_spans("goodput"):
        words = span.split()
        name = words[1]
        if name.startswith("-") or name.isupper():
            continue  # `goodput --help`, `goodput COMMAND --help`
        if name not in commands:
            problems.append(f"{_rel(doc)}: `{span}`: no subcommand {name!r}")
            continue
        flags = {word.split("=")[0] for word in words[2:] if word.startswith("--")}
        unknown = flags - _option_strings(_subparser(name))
        if unknown:
            problems.append(f"{_rel(doc)}: `{span}`: goodput {name} has no {sorted(unknown)}")
    assert not problems, "\n".join(problems)


def test_goodput_help_lists_every_subcommand_the_docs_use() -> None:
    """`goodput --help` run for real, as a user would, names every subcommand the docs run."""
    goodput = ROOT / ".venv" / "bin" / "goodput"
    if not goodput.exists():
        pytest.skip("no .venv/bin/goodput: run `make venv`")
    shown = subprocess.run([str(goodput), "--help"], capture_output=True, text=True, check=True).stdout
    used = {_program(command)[1][0] for command in _commands_of("goodput") if _program(command)[1]}
    missing = {
        name for name in used if not name.startswith("-") and not re.search(rf"^\s+{name}\b", shown, re.M)
    }
    assert not missing, f"`goodput --help` does not list {sorted(missing)}"


# --- make -------------------------------------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE))
    for phony in re.findall(r"^\.PHONY:(.*)$", text, re.MULTILINE):
        targets.update(phony.split())
    return frozenset(targets)


def _make_problems(doc: Path, args: tuple[str, ...] | list[str], shown: str) -> list[str]:
    targets = [word for word in args if not word.startswith("-") and "=" not in word]
    return [
        f"{_rel(doc)}: `{shown}`: no target {t!r} in the Makefile" for t in targets if t not in make_targets()
    ]


def test_every_make_target_the_docs_run_exists() -> None:
    problems = []
    for command in _commands_of("make"):
        problems += _make_problems(command.doc, _program(command)[1], shlex.join(command.words))
    for doc, span in _inline_spans("make"):
        words = span.split()
        if all(re.match(r"^[\w.-]+$|^\w+=", word) for word in words[1:]):
            problems += _make_problems(doc, words[1:], span)
    assert not problems, "\n".join(problems)


# --- paths and manifests ----------------------------------------------------------------------------


def test_every_repository_path_a_command_names_exists() -> None:
    missing = []
    for command in documented_commands():
        for word in command.words:
            value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
            if "$" not in value and REPO_PATH.match(value) and not (ROOT / value).exists():
                missing.append(f"{command}: {value}")
    assert not missing, "no such file:\n" + "\n".join(missing)


def _kubectl_files(args: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    for flag, value in itertools.pairwise(args):
        if flag in {"-f", "--filename", "-k", "--kustomize"}:
            yield flag, value


@pytest.mark.parametrize("command", _commands_of("kubectl"), ids=str)
def test_every_manifest_kubectl_applies_exists_and_parses(command: Command) -> None:
    _, args = _program(command)
    for flag, value in _kubectl_files(args):
        if "$" in value or not REPO_PATH.match(value):
            continue
        path = ROOT / value
        assert path.exists(), f"{command}: no {value}"
        if flag in {"-k", "--kustomize"}:
            assert (path / "kustomization.yaml").exists(), f"{command}: {value} is no kustomize base"
            continue
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        assert files, f"{command}: {value} holds no YAML"
        for file in files:
            documents = [doc for doc in yaml.safe_load_all(file.read_text()) if doc]
            assert documents and all("kind" in doc for doc in documents), f"{command}: {file} is no manifest"


# --- helm -------------------------------------------------------------------------------------------


@cache
def chart_values() -> dict[str, object]:
    values: dict[str, object] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


@cache
def chart_version() -> str:
    chart: dict[str, str] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return chart["version"]


def _value_key_exists(key: str) -> bool:
    """A `--set` key names a value of values.yaml, or a key inside one of its free-form maps."""
    node: object = chart_values()
    for part in key.split("."):
        if not isinstance(node, dict):
            return False
        if part not in node:
            return node == {} or key.split(".", maxsplit=1)[0] == "global"
        node = node[part]
    return True


@dataclass(frozen=True, slots=True)
class HelmCall:
    verb: str
    release: str
    chart: str
    sets: tuple[str, ...]


def _helm_call(command: Command) -> HelmCall | None:
    _, args = _program(command)
    if not args or args[0] not in {"install", "upgrade"}:
        return None
    verb, rest = args[0], list(args[1:])
    positional, sets = [], []
    index = 0
    while index < len(rest):
        word = rest[index]
        if word in {"--set", "--set-string"}:
            sets.append(rest[index + 1])
            index += 2
            continue
        if word in {"-n", "--namespace", "-f", "--values", "--version"}:
            index += 2
            continue
        if not word.startswith("-"):
            positional.append(word)
        index += 1
    assert len(positional) == 2, f"{command}: expected RELEASE CHART, got {positional}"
    return HelmCall(verb, positional[0], positional[1], tuple(sets))


def _helm_calls() -> list[tuple[Command, HelmCall]]:
    calls = []
    for command in _commands_of("helm"):
        call = _helm_call(command)
        if call is not None:
            calls.append((command, call))
    return calls


def test_the_docs_install_the_chart_with_helm() -> None:
    assert any(call.chart == "charts/goodput" for _, call in _helm_calls())


@pytest.mark.parametrize(("command", "call"), _helm_calls(), ids=[str(c) for c, _ in _helm_calls()])
def test_every_helm_install_names_the_chart_and_its_values(command: Command, call: HelmCall) -> None:
    packaged = f"out/goodput-{chart_version()}.tgz"
    assert call.chart in {"charts/goodput", packaged}, f"{command}: the chart is charts/goodput or {packaged}"
    unknown = [item.split("=", 1)[0] for item in call.sets if not _value_key_exists(item.split("=", 1)[0])]
    assert not unknown, f"{command}: not a value of charts/goodput/values.yaml: {unknown}"


def _helm() -> Path | None:
    override = os.environ.get("GOODPUT_BIN_DIR")
    if override:
        bin_dir = Path(override)
    else:
        script = ROOT / "tools" / "build-binaries.sh"
        result = subprocess.run([str(script), "--print-bin-dir"], check=False, capture_output=True, text=True)
        if result.returncode != 0:
            return None
        bin_dir = Path(result.stdout.strip())
    helm = bin_dir / "helm"
    return helm if os.access(helm, os.X_OK) else None


def test_every_documented_helm_install_renders() -> None:
    """Each `helm install`/`helm upgrade` of the docs, rendered for real from charts/goodput with its
    `--set` values (the packaged chart is the same chart), so the schema and templates accept them."""
    helm = _helm()
    if helm is None:
        pytest.skip("helm is not built: tools/build-binaries.sh")
    value_sets = {call.sets for _, call in _helm_calls()}
    for sets in sorted(value_sets):
        arguments = [argument for item in sets for argument in ("--set", item)]
        result = subprocess.run(
            [str(helm), "template", "goodput", str(CHART), "--namespace", "goodput-system", *arguments],
            check=False,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"helm template with {list(sets)} failed:\n{result.stderr}"


# --- the glossary -----------------------------------------------------------------------------------

SOURCE_LAYERS = ("api", "estimators", "controllers", "operator", "simulator", "gateway", "agent")


@cache
def _source_words() -> frozenset[str]:
    """Every word of the product's Python sources: names, and the words of their strings."""
    return frozenset(
        word
        for layer in SOURCE_LAYERS
        for path in (ROOT / layer).rglob("*.py")
        for word in re.findall(r"\w+", path.read_text())
    )


def test_every_code_name_in_the_glossary_exists_in_the_code() -> None:
    """The glossary of docs/concepts.md maps each term to names of the code: each name it gives (a class,
    a function, a reason or a metric) must occur in the product's sources, so a rename shows here."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    glossary = text[text.index("## Glossary") :]
    rows = [line.split("|") for line in glossary.splitlines() if line.startswith("| ") and "---" not in line]
    names = {
        span.split(" ")[0]
        for row in rows[1:]
        for span in INLINE_CODE.findall(row[3])
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*( =.*)?", span)
    }
    assert len(names) > 40, "the glossary's code names are no longer found (a test of the test)"
    missing = sorted(names - _source_words())
    assert not missing, f"docs/concepts.md names what the code does not define: {missing}"
