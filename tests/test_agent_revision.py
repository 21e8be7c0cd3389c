"""The loaded revision comes from a snapshot path only, and is reported under the name the operator
compares with."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from goodput.agent import revision

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
SNAPSHOT = f"/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/{COMMIT}/"


@dataclass(frozen=True)
class Case:
    name: str
    paths: tuple[str, ...]
    wanted: str
    expected: str | None
    refs: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("no snapshot: no evidence", ("meta-llama/Llama-3.1-8B",), "main", None),
    Case("nothing at all", (), "main", None),
    Case("the wanted full commit", (SNAPSHOT,), COMMIT, COMMIT),
    Case("a short commit prefix", (SNAPSHOT,), COMMIT[:7], COMMIT[:7]),
    Case("a branch whose ref names the snapshot", (SNAPSHOT,), "main", "main", {"main": COMMIT}),
    Case("a branch pointing elsewhere reports the commit", (SNAPSHOT,), "main", COMMIT, {"main": OTHER}),
    Case("a branch without a ref reports the commit", (SNAPSHOT,), "main", COMMIT),
    Case("another commit", (SNAPSHOT,), OTHER, COMMIT),
    Case(
        "two snapshots never match",
        (SNAPSHOT, SNAPSHOT.replace(COMMIT, OTHER)),
        COMMIT,
        f"{COMMIT},{OTHER}",
    ),
    Case("a snapshot path without trailing slash", (SNAPSHOT.rstrip("/"),), COMMIT, COMMIT),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_loaded_revision(case: Case) -> None:
    assert revision.loaded_revision(case.paths, case.wanted, case.refs) == case.expected


def test_served_roots_read_the_models_listing() -> None:
    listing = {"object": "list", "data": [{"id": "llama", "root": SNAPSHOT}, {"id": "x"}]}

    assert revision.served_roots(listing) == (SNAPSHOT, "")
    with pytest.raises(ValueError, match="`data`"):
        revision.served_roots({"data": "nope"})


def test_a_non_snapshot_path_has_no_commit() -> None:
    assert revision.snapshot_commit(f"/models/llama/{COMMIT}/") is None
    assert revision.snapshot_commit(f"/x/snapshots/{COMMIT[:20]}/") is None
