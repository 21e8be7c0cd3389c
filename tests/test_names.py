"""One name, one concept: no two product modules define a class or a constant under the same public
name, so a name read anywhere in api, estimators, controllers, operator, simulator, gateway or agent
means one thing.

Three exceptions, each explicit below:

- an API model and the frozen value the compile (`controllers.compile`) makes of it carry the same
  name, because they are one concept in two forms: what a user writes and what a decision reads;
- the entry point each program registers its subcommands as, a name pyproject.toml fixes;
- a constant that two programs sharing no layer but the API each spell for themselves, with the
  same value (checked here), so it stays one concept.
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

SPELLED_BY_EACH_PROGRAM = {
    # vLLM's running-requests gauge, read by the operator's warm-up probe and by the in-pod agent.
    "RUNNING": ("agent/engine.py", "operator/engine.py"),
}


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
    allowed = {**COMPILED_FROM_THE_API, **ENTRY_POINTS, **SPELLED_BY_EACH_PROGRAM}

    unexplained = {name: modules for name, modules in twice.items() if name not in allowed}

    assert not unexplained, f"one name for two concepts, or one concept written twice: {unexplained}"


def test_every_allowed_name_is_still_defined_exactly_where_it_says() -> None:
    """An entry that no longer matches the code is removed, not kept as a standing licence."""
    found = public_definitions()
    for name, modules in {**COMPILED_FROM_THE_API, **ENTRY_POINTS, **SPELLED_BY_EACH_PROGRAM}.items():
        assert sorted(module for module, _ in found[name]) == sorted(modules), name


def test_a_constant_each_program_spells_has_one_value() -> None:
    found = public_definitions()
    for name in SPELLED_BY_EACH_PROGRAM:
        values = {ast.unparse(node).split("=", 1)[1].strip() for _, node in found[name]}
        assert len(values) == 1, f"{name} has two values: {values}"
