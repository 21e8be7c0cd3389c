"""Which ModelGroup serves which model name: the gateway's table from a request's `model` to the
ModelGroup whose groups, admission and fairness take it.

One gateway process serves every ModelGroup it is told to (`--selector`, `--model-group`), each
under the served model name its engine answers to. Two ModelGroups may claim the same name; the
gateway never splits one name's requests over both (their policies, queues and signals would stop
meaning one thing). The ModelGroup created first keeps the name (ties by name), so adding a
ModelGroup never takes requests away from one already serving them; every other claimant is left
out and reported as a conflict, until it is renamed or the first one goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from goodput.controllers.compile.request_path import RequestPathPolicy


@dataclass(frozen=True, slots=True)
class ModelClaim:
    """One ModelGroup's claim to a served model name; `created` is its creationTimestamp as the API
    server writes it (RFC 3339, UTC, so text order is time order; "" when unknown, which sorts first)."""

    model_group: str
    served_model: str
    created: str = ""


@dataclass(frozen=True, slots=True)
class NameConflict:
    """A served model name claimed by more than one ModelGroup: who serves it, who is left out."""

    served_model: str
    serving: str
    left_out: tuple[str, ...]

    def message(self) -> str:
        others = ", ".join(self.left_out)
        return (
            f"served model {self.served_model!r} is claimed by ModelGroups {self.serving} and {others}: "
            f"{self.serving} (created first) serves it, {others} serve nothing until renamed"
        )


@dataclass(frozen=True, slots=True)
class ServedModels:
    """The routing table: served model name -> ModelGroup, and the conflicts behind it."""

    by_model: Mapping[str, str]
    conflicts: tuple[NameConflict, ...] = ()

    def model_group_for(self, served_model: str) -> str | None:
        return self.by_model.get(served_model)


def resolve_served_models(claims: Iterable[ModelClaim]) -> ServedModels:
    """Each name to the earliest-created claimant (then by name): deterministic whatever the order
    the watch saw the ModelGroups in."""
    by_name: dict[str, list[ModelClaim]] = {}
    for claim in claims:
        by_name.setdefault(claim.served_model, []).append(claim)
    table: dict[str, str] = {}
    conflicts: list[NameConflict] = []
    for served_model in sorted(by_name):
        ranked = sorted(by_name[served_model], key=lambda claim: (claim.created, claim.model_group))
        table[served_model] = ranked[0].model_group
        if len(ranked) > 1:
            left_out = tuple(claim.model_group for claim in ranked[1:])
            conflicts.append(NameConflict(served_model, ranked[0].model_group, left_out))
    return ServedModels(table, tuple(conflicts))


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """What to change so the gateway serves what the watch selects: ModelGroups to start serving,
    served ones whose policy changed, served ones to retire (deleted or no longer selected), and
    selected ones whose policy cannot be compiled, with why (a served one keeps its last good policy)."""

    start: tuple[str, ...] = ()
    update: tuple[str, ...] = ()
    retire: tuple[str, ...] = ()
    unservable: Mapping[str, str] = field(default_factory=dict)


def plan_serving(
    served: Mapping[str, RequestPathPolicy], watched: Mapping[str, RequestPathPolicy | str]
) -> ServingPlan:
    """From the served ModelGroups' policies and the watch's report (each selected ModelGroup's
    compiled policy, or why it has none)."""
    start = tuple(
        sorted(name for name, policy in watched.items() if name not in served and not isinstance(policy, str))
    )
    update = tuple(
        sorted(
            name
            for name, policy in watched.items()
            if name in served and not isinstance(policy, str) and policy != served[name]
        )
    )
    retire = tuple(sorted(name for name in served if name not in watched))
    unservable = {name: why for name, why in sorted(watched.items()) if isinstance(why, str)}
    return ServingPlan(start, update, retire, unservable)
