"""Random ModelGroups and SLOPolicies, valid, nearly valid and hostile, for bad input at volume.

Each candidate starts from a valid document (a shipped sample) and, unless it is to stay valid, gets
one mutation at a random place in its spec: a value of the wrong type, a number at or past an edge,
a huge or non-finite-looking number, unicode, a very long string, deep nesting, an unknown field, a
missing field. The generator is seeded, so a failing run is replayed exactly; every candidate says
what was done to it, so a failure names the document and the mutation.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Json = Any
Path = tuple[str | int, ...]

VALID, NEARLY_VALID, HOSTILE = "valid", "nearly-valid", "hostile"

UNICODE_SAMPLES = (
    "ünïcødé-名前-🚀",
    "\u202eevil\u202c",  # right-to-left override
    "zero\u200bwidth",
    "💥" * 64,
    "null\x00byte",
)


@dataclass(frozen=True, slots=True)
class Candidate:
    kind: str
    category: str
    mutation: str
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body.get("metadata", {}).get("name"))


def leaf_paths(value: Json, prefix: Path = ()) -> Iterator[Path]:
    """Every place in a JSON value: each key of a mapping and each item of a list, depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from leaf_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from leaf_paths(item, (*prefix, index))


def _parent(document: Json, path: Path) -> Any:
    node = document
    for part in path[:-1]:
        node = node[part]
    return node


def _wrong_type(value: Json, rng: random.Random) -> Json:
    choices: list[Json] = ["a-string", 7, 2.5, True, None, ["list"], {"an": "object"}]
    return rng.choice([choice for choice in choices if type(choice) is not type(value)])


def _edge_number(value: Json, rng: random.Random) -> Json:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return rng.choice([0, -1])
    return rng.choice([0, -1, -value, value + 10**6, value * 1000, 1e-9])


def _huge_number(_: Json, rng: random.Random) -> Json:
    return rng.choice([2**63, -(2**63) - 1, 10**30, 1e308, -1e308, 1.7976931348623157e308])


def _unicode(_: Json, rng: random.Random) -> Json:
    return rng.choice(UNICODE_SAMPLES)


def _long_string(_: Json, rng: random.Random) -> Json:
    return "x" * rng.choice([254, 4097, 70_000])


def _deep_nesting(_: Json, rng: random.Random) -> Json:
    nested: Json = "bottom"
    for depth in range(rng.choice([20, 60, 120])):
        nested = {f"level{depth}": nested} if depth % 2 else [nested]
    return nested


# name -> (category, replace the value at a path with this)
VALUE_MUTATIONS: dict[str, tuple[str, Callable[[Json, random.Random], Json]]] = {
    "wrong type": (NEARLY_VALID, _wrong_type),
    "edge number": (NEARLY_VALID, _edge_number),
    "huge number": (HOSTILE, _huge_number),
    "unicode": (HOSTILE, _unicode),
    "long string": (HOSTILE, _long_string),
    "deep nesting": (HOSTILE, _deep_nesting),
}


def mutate(document: dict[str, Any], rng: random.Random) -> tuple[str, str]:
    """Apply one random mutation inside `document["spec"]`, in place; returns (category, what)."""
    paths = [("spec", *path) for path in leaf_paths(document["spec"])]
    path = rng.choice(paths)
    parent, key = _parent(document, path), path[-1]
    where = ".".join(str(part) for part in path)
    choice = rng.choice([*VALUE_MUTATIONS, "unknown field", "missing field"])
    if choice == "unknown field":
        target = parent if isinstance(parent, dict) else document["spec"]
        target[rng.choice(["spce", "replicaz", "x-extra", "ünknown"])] = rng.choice([1, "v", {"a": 1}])
        return NEARLY_VALID, f"unknown field beside {where}"
    if choice == "missing field":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
        return NEARLY_VALID, f"removed {where}"
    category, replace = VALUE_MUTATIONS[choice]
    parent[key] = replace(parent[key], rng)
    return category, f"{choice} at {where}"


def _valid_model_group(base: dict[str, Any], rng: random.Random, pool: dict[str, str]) -> dict[str, Any]:
    """The sample with random bounds, on a node pool that has no nodes (nothing is ever placed)."""
    document = copy.deepcopy(base)
    spec = document["spec"]
    maximum = rng.randint(1, 8)
    minimum = rng.randint(0, maximum)
    spec.update(maxReplicas=maximum, minReplicas=minimum, replicas=rng.randint(minimum, maximum))
    spec["warmReplicas"] = rng.randint(0, minimum)
    spec.setdefault("placement", {})["nodeSelector"] = [{"key": k, "value": v} for k, v in pool.items()]
    if rng.random() < 0.5:
        spec.pop("policyRef", None)
    return document


def candidates(
    *,
    seed: int,
    count: int,
    model_group: dict[str, Any],
    slo_policy: dict[str, Any],
    empty_pool: dict[str, str],
    valid_share: float = 0.2,
) -> list[Candidate]:
    """`count` candidates, about half of each kind, `valid_share` of them left valid."""
    rng = random.Random(seed)
    made: list[Candidate] = []
    for index in range(count):
        kind = "ModelGroup" if index % 2 == 0 else "SLOPolicy"
        if kind == "ModelGroup":
            document = _valid_model_group(model_group, rng, empty_pool)
        else:
            document = copy.deepcopy(slo_policy)
        document["metadata"] = {"name": f"{kind.lower()}-{index:04d}"}
        if rng.random() < valid_share:
            made.append(Candidate(kind, VALID, "none", document))
            continue
        category, what = mutate(document, rng)
        made.append(Candidate(kind, category, what, document))
    return made
