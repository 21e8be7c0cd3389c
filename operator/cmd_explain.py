"""`goodput explain mg/<name> [-n NS]`: why a ModelGroup has the number of groups it has.

Prints the autoscaler's conditions and its recorded decisions as a table, newest first: time, count
from → to, mode, reason, winning signal, every signal's proposal, the guards that held or cut the
count, and the SLOPolicy revision that decided (after a line per SLO class on its feasible demand);
then each proposal's inputs for the latest decision,
and the shadow policy's latest decision beside it. `-o json` prints the records as stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from goodput.api.base import GROUP, VERSION
from goodput.operator.kube import KubeApi, KubeError

RESOURCE_NAMES = ("mg", "modelgroup", "modelgroups", f"modelgroup.{GROUP}", f"modelgroups.{GROUP}")
CONDITIONS = ("ScalingActive", "MetricsAvailable", "DecisionLimited", "ScalingLimited", "SLOAttainable")
EXPLAIN_COLUMNS = ("TIME", "FROM→TO", "MODE", "REASON", "SIGNAL", "PROPOSALS", "GUARDS", "REVISION")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="the ModelGroup: mg/NAME (or NAME)")
    parser.add_argument(
        "-n", "--namespace", help="namespace (default: the kubeconfig context's, else 'default')"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def parse_target(target: str) -> str:
    """The ModelGroup name in `mg/NAME`, `modelgroup/NAME`, `modelgroups.goodput.dev/NAME` or `NAME`."""
    kind, slash, name = target.rpartition("/")
    if slash and kind.lower() not in RESOURCE_NAMES:
        raise ValueError(f"{target!r} is not a ModelGroup: use mg/NAME")
    if not name:
        raise ValueError("name the ModelGroup: mg/NAME")
    return name


def _cell(value: object) -> str:
    return "-" if value in (None, "", (), []) else str(value)


def decision_row(entry: Mapping[str, Any], *, latest: bool = False) -> tuple[str, ...]:
    proposals = " ".join(f"{p.get('signal')}={p.get('replicas')}" for p in entry.get("proposals") or ())
    mode = str(entry.get("mode") or "")
    if entry.get("shadow"):
        mode += " (shadow)"
    return (
        f"{entry.get('time', '?')}{' *' if latest else ''}",
        f"{entry.get('fromReplicas', '?')}→{entry.get('toReplicas', '?')}",
        _cell(mode),
        _cell(entry.get("reason")),
        _cell(entry.get("signal")),
        _cell(proposals),
        _cell(",".join(entry.get("guards") or ())),
        _cell(entry.get("policyRevision")),
    )


def table(rows: Sequence[Sequence[str]], header: Sequence[str] = EXPLAIN_COLUMNS) -> str:
    widths = [max(len(row[index]) for row in (header, *rows)) for index in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )


def _details(title: str, entry: Mapping[str, Any]) -> list[str]:
    change = f"{entry.get('fromReplicas', '?')}→{entry.get('toReplicas', '?')}"
    revision = f"policy revision {entry.get('policyRevision', '?')}, {entry.get('mode', '?')}"
    why = f"{entry.get('reason', '?')}; {revision}"
    lines = [f"{title} at {entry.get('time', '?')}: {change} ({why})"]
    proposals = list(entry.get("proposals") or ())
    width = max((len(str(p.get("signal", ""))) for p in proposals), default=0)
    for proposal in proposals:
        signal = str(proposal.get("signal", "")).ljust(width)
        lines.append(
            f"  {signal}  {proposal.get('replicas', '?'):>3}  {proposal.get('detail') or ''}".rstrip()
        )
    if entry.get("guards"):
        lines.append(f"  guards: {', '.join(entry['guards'])}")
    return lines


def _ratio(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else "unknown"


def feasibility_line(entry: Mapping[str, Any]) -> str:
    """One class's feasible demand: where its TTFT target becomes unreachable, the share of prompts
    past it, and attainment against offered and against attainable requests."""
    name = entry.get("name", "?")
    threshold = entry.get("longestFeasiblePromptTokens")
    unmet = entry.get("unmetField")
    if unmet:
        head = f"feasibility {name}: no request can meet {unmet}"
    else:
        share = entry.get("infeasibleShare")
        past = "share unknown" if share is None else f"{share:.1%} of prompts"
        head = f"feasibility {name}: prompts over {threshold} tokens cannot meet the TTFT target ({past})"
    offered, attainable = entry.get("attainmentOffered"), entry.get("attainmentAttainable")
    if offered is None and attainable is None:
        return head
    return f"{head}; attainment {_ratio(offered)} of offered, {_ratio(attainable)} of attainable"


def explain(model_group: Mapping[str, Any]) -> str:
    """The readable account of a ModelGroup's scaling decisions."""
    metadata = model_group.get("metadata") or {}
    spec = model_group.get("spec") or {}
    status = model_group.get("status") or {}
    policy = (spec.get("policyRef") or {}).get("name")
    shadow = (spec.get("shadowPolicyRef") or {}).get("name")
    lines = [
        f"ModelGroup {metadata.get('namespace', '?')}/{metadata.get('name', '?')}: "
        f"policy {policy or '(none)'}" + (f", shadow policy {shadow}" if shadow else ""),
        f"groups: spec.replicas {spec.get('replicas', '?')} (min {spec.get('minReplicas', '?')}, "
        f"max {spec.get('maxReplicas', '?')}), ready {status.get('readyGroups', 0)}, "
        f"coming {sum(status.get(k, 0) for k in ('placingGroups', 'provisioningGroups', 'warmingGroups'))}, "
        f"draining {status.get('drainingGroups', 0)}",
    ]
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    for kind in CONDITIONS:
        condition = conditions.get(kind)
        if condition is not None:
            lines.append(
                f"{kind}={condition.get('status')} {condition.get('reason')}: {condition.get('message', '')}"
            )
    lines += [feasibility_line(entry) for entry in status.get("feasibility") or ()]
    last = status.get("lastDecision")
    history = list(status.get("decisions") or ())
    rows = []
    if last is not None and (not history or history[0] != last):
        rows.append(decision_row(last, latest=True))
    rows += [decision_row(entry, latest=last is not None and entry == last) for entry in history]
    lines.append("")
    if rows:
        lines.append(table(rows))
        lines.append("(* the latest decision; the others changed the count or would have)")
    else:
        lines.append("no decision recorded yet")
    if last is not None:
        lines += ["", *_details("Latest decision", last)]
    shadow_decision = status.get("shadowDecision")
    if shadow_decision is not None:
        lines += ["", *_details(f"Shadow policy {shadow or ''}".rstrip(), shadow_decision)]
    return "\n".join(lines)


def records(model_group: Mapping[str, Any]) -> dict[str, Any]:
    status = model_group.get("status") or {}
    return {key: status.get(key) for key in ("lastDecision", "decisions", "shadowDecision", "feasibility")}


def run(args: argparse.Namespace) -> int:
    try:
        name = parse_target(args.target)
        kube, default_namespace = KubeApi.from_kubeconfig(args.kubeconfig, args.context)
    except Exception as error:  # a bad target or kubeconfig: say so, not a traceback
        print(f"goodput explain: {error}", file=sys.stderr)
        return 2
    namespace = args.namespace or default_namespace
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modelgroups/{name}"
    try:
        model_group = kube.request("GET", "modelgroups", path)
    except KubeError as error:
        print(f"goodput explain: ModelGroup {namespace}/{name}: {error}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(records(model_group), indent=2))
    else:
        print(explain(model_group))
    return 0
