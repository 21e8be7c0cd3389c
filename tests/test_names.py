"""One name, one concept: no two product modules define a class or a constant under the same public
name, so a name read anywhere in api, estimators, controllers, operator, simulator, gateway or agent
means one thing.

Two exceptions, each explicit below:

- an API model and the frozen value the compile (`controllers.compile`) makes of it carry the same
  name, because they are one concept in two forms: what a user writes and what a decision reads;
- the entry point each program registers its subcommands as, a name pyproject.toml fixes.

Names of another system are spelled once too: vLLM's metric names only in `api/vllm_names.py`,
which every program (the agent included) imports.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_LAYERS = ("api", "estimators", "controllers", "operator", "simulator", "gateway", "agent")

COMPILED_FROM_THE_API = {
    # name: (the API model's module, the compiled value's module)
    "CostWeights": ("api/slopolicy.py", "controllers/requests/fairness.py"),
    "GoodputSignal": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    "KvCacheSignal": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    "QueueWorkSignal": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    "SlackSignal": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    "Signals": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    "ScalingRules": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    "StepPolicy": ("api/slopolicy.py", "controllers/autoscale/model.py"),
    # `status.decisions[].proposals[]` records the decision's proposals as they were made.
    "Proposal": ("api/modelgroup.py", "controllers/autoscale/model.py"),
}

ENTRY_POINTS = {
    # The object each program registers its subcommands as: pyproject.toml's entry points name
    # `module:COMMANDS`, one per program, each holding that program's own subcommands.
    "COMMANDS": ("gateway/commands.py", "simulator/commands.py"),
}

VLLM_NAMES_MODULE = "api/vllm_names.py"
VLLM_NAME_USERS = (*PRODUCT_LAYERS, "testbed")


def public_definitions() -> dict[str, list[tuple[str, ast.stmt]]]:
    """Every public class and UPPER_CASE constant defined at a product module's top level (imports,
    which only re-use a name, are not definitions)."""
    found: dict[str, list[tuple[str, ast.stmt]]] = defaultdict(list)
    for layer in PRODUCT_LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            for node in ast.parse(path.read_text()).body:
                for name in _defined(node):
                    if not name.startswith("_"):
                        found[name].append((module, node))
    return found


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id] if node.target.id.isupper() else []
    return []


def test_no_public_name_is_defined_by_two_product_modules() -> None:
    twice = {
        name: sorted(module for module, _ in places)
        for name, places in public_definitions().items()
        if len(places) > 1
    }
    allowed = {**COMPILED_FROM_THE_API, **ENTRY_POINTS}

    unexplained = {name: modules for name, modules in twice.items() if name not in allowed}

    assert not unexplained, f"one name for two concepts, or one concept written twice: {unexplained}"


def test_every_allowed_name_is_still_defined_exactly_where_it_says() -> None:
    """An entry that no longer matches the code is removed, not kept as a standing licence."""
    found = public_definitions()
    for name, modules in {**COMPILED_FROM_THE_API, **ENTRY_POINTS}.items():
        assert sorted(module for module, _ in found[name]) == sorted(modules), name


def _code_strings(tree: ast.Module) -> list[str]:
    """Every string literal in a module's code (f-strings' literal parts included), docstrings left
    out: a docstring may name a metric, only code spells one."""
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_vllm_metric_names_are_spelled_only_in_their_module() -> None:
    """The operator's queries and probe, the doctor, the agent, the simulator's and the emulator's
    exposition all import vLLM's names; a second spelling is the drift this keeps out."""
    spelled = sorted(
        path.relative_to(ROOT).as_posix()
        for layer in VLLM_NAME_USERS
        for path in (ROOT / layer).rglob("*.py")
        if path.relative_to(ROOT).as_posix() != VLLM_NAMES_MODULE
        and any("vllm:" in text for text in _code_strings(ast.parse(path.read_text())))
    )
    assert not spelled, f"vLLM metric names spelled outside {VLLM_NAMES_MODULE}: {spelled}"


def test_the_vllm_names_module_spells_each_name_once() -> None:
    from goodput.api import vllm_names

    names = [value for key, value in vars(vllm_names).items() if key.isupper() and isinstance(value, str)]
    assert names and all(name.startswith("vllm:") for name in names)
    assert len(set(names)) == len(names)


def _bucket_sets() -> dict[str, list[tuple[str, tuple[float, ...]]]]:
    """Every module-level constant named *BUCKETS* that is a literal tuple of numbers, by value."""
    found: dict[str, list[tuple[str, tuple[float, ...]]]] = defaultdict(list)
    for layer in PRODUCT_LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            for node in ast.parse(path.read_text()).body:
                names, value = _defined(node), getattr(node, "value", None)
                if not any("BUCKETS" in name for name in names) or not isinstance(value, ast.Tuple):
                    continue
                bounds = tuple(float(ast.literal_eval(item)) for item in value.elts)
                found[repr(bounds)].extend((f"{module}:{name}", bounds) for name in names)
    return found


def test_each_bucket_set_is_defined_once() -> None:
    """Two programs that must read one resolution (the gateway and the simulator's gateway) import one
    set; two constants with the same bounds are one set written twice."""
    twice = {bounds: [name for name, _ in sets] for bounds, sets in _bucket_sets().items() if len(sets) > 1}
    assert not twice, f"one bucket set defined twice: {twice}"


def test_no_histogram_writes_its_buckets_inline() -> None:
    inline = sorted(
        f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
        for layer in PRODUCT_LAYERS
        for path in (ROOT / layer).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.keyword)
        and node.arg == "buckets"
        and isinstance(node.value, ast.Tuple | ast.List)
    )
    assert not inline, f"histogram buckets written inline, not a named set: {inline}"


# A group's engine window figures, as GroupMetrics names them: a class carrying several of them is a
# second record of the same figures (one such record was copied field by field into GroupMetrics).
ENGINE_FIGURES = frozenset({
    "waiting_requests", "running_requests", "kv_usage_fraction", "prompt_tokens_per_second",
    "generation_tokens_per_second", "prompt_tokens_sum", "prompt_tokens_count", "prompts_started",
    "prompt_tokens_started", "generation_tokens_sum", "generation_tokens_count", "prefix_hits",
    "prefix_queries", "finished_requests", "aborted_requests",
})  # fmt: skip
ENGINE_FIGURES_RECORD = ("controllers/autoscale/model.py", "GroupMetrics")


def test_a_groups_engine_figures_have_one_record() -> None:
    from dataclasses import fields

    from goodput.controllers.autoscale.model import GroupMetrics

    assert {field.name for field in fields(GroupMetrics)} >= ENGINE_FIGURES
    records = sorted(
        (path.relative_to(ROOT).as_posix(), node.name)
        for layer in PRODUCT_LAYERS
        for path in (ROOT / layer).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and len(
            ENGINE_FIGURES
            & {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
        )
        >= 4
    )
    assert records == [ENGINE_FIGURES_RECORD], f"engine figures recorded twice: {records}"


# The hardware step model: what one engine step costs, priced once (`StepCostModel`). The simulator's
# event and batched engines, the capacity profile and the feasibility floors all call it.
STEP_MODEL_METHODS = frozenset(
    {"step_seconds", "step_seconds_array", "prefill_seconds", "decode_step_seconds"}
)
STEP_MODEL = ("estimators/service_time.py", "StepCostModel")


def test_the_hardware_step_model_is_defined_once() -> None:
    models = sorted(
        (path.relative_to(ROOT).as_posix(), node.name)
        for layer in (*PRODUCT_LAYERS, "testbed")
        for path in (ROOT / layer).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and STEP_MODEL_METHODS & {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    )
    assert models == [STEP_MODEL], f"a step model defined twice: {models}"
