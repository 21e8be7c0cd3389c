"""The model revision the engine loaded, from evidence only.

Evidence is a Hugging Face cache snapshot path (`.../models--org--name/snapshots/<commit>/...`),
seen in the served model's metadata (`/v1/models`, field `root`, when vLLM was given a local
path) or in the weights the engine reads, plus the cache's `refs/<branch>` files that name the
commit a branch or tag pointed at when it was downloaded. The operator compares the annotation with
`spec.model.revision` as written, so a commit that the wanted branch resolves to is reported under
the wanted name; anything else is reported as the commit, which the operator then names in its
mismatch message. No evidence means no annotation: the group keeps waiting, never passes on a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SNAPSHOT = re.compile(r"/snapshots/(?P<commit>[0-9a-f]{40})(?:/|$)")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


def snapshot_commit(path: str) -> str | None:
    """The commit of a Hugging Face cache snapshot path, None for any other path."""
    match = _SNAPSHOT.search(path)
    return match["commit"] if match else None


def served_roots(models_response: Mapping[str, Any]) -> tuple[str, ...]:
    """The `root` of every model in an OpenAI `/v1/models` answer (vLLM sets it to the model it was
    given: a hub id or a local path)."""
    data = models_response.get("data")
    if not isinstance(data, list):
        raise ValueError("/v1/models: `data` is not a list")
    return tuple(str(item.get("root") or "") for item in data if isinstance(item, dict))


def loaded_revision(paths: tuple[str, ...], wanted: str, refs: Mapping[str, str]) -> str | None:
    """The revision to report: `wanted` when the loaded snapshot is what it names (a commit prefix,
    or a branch/tag whose ref file points at it), else the loaded commit; None without a snapshot.

    refs: branch or tag name -> commit, from the cache's `refs/` folder.
    """
    commits = {commit for commit in (snapshot_commit(path) for path in paths) if commit}
    if not commits:
        return None
    if len(commits) > 1:
        return ",".join(sorted(commits))  # several snapshots at once: never equal to a wanted revision
    (commit,) = commits
    if _COMMIT.match(wanted) and commit.startswith(wanted):
        return wanted
    if refs.get(wanted) == commit:
        return wanted
    return commit
