"""The suite's markdown table and its cost-versus-attainment plots, from the case records."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from goodput.simulator.fair_bench import KNOBS, SUITE_POLICIES

POLICY_ORDER = SUITE_POLICIES
BASELINES = tuple(name for name in POLICY_ORDER if name != "goodput")
REACTIVE_BASELINES = tuple(name for name in BASELINES if name != "fixed")
"""The baselines whose test run can move the fleet: a fixed fleet holds its size by design."""


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or not denominator or math.isnan(numerator):
        return "-"
    return f"{numerator / denominator:.2f}x"


def _test(record: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A policy's test-window outcome, or the searched oracle's."""
    outcome: Mapping[str, Any] = (
        record["oracle"]["searched"] if name == "oracle" else record["policies"][name]["test"]
    )
    return outcome


def _good(record: Mapping[str, Any], name: str) -> float:
    return float(_test(record, name)["good_per_gpu_hour"])


def _ran(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [record for record in records if "error" not in record]


def _baselines_in(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The baselines this case tuned (a run may name fewer with `--policies`)."""
    return tuple(name for name in BASELINES if name in record["policies"])


def best_baseline(record: Mapping[str, Any]) -> str | None:
    """The tuned baseline with the most SLO-meeting requests per GPU-hour on the test day."""
    names = _baselines_in(record)
    return max(names, key=lambda name: _good(record, name)) if names else None


def summary_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Per case: each policy's test day, the searched schedule, and goodput against the best tuned
    baseline, the fluid bound and the searched schedule."""
    header = (
        "| model | case | "
        + " | ".join(POLICY_ORDER)
        + " | oracle (search) | goodput / best baseline | goodput GPU-h / fluid bound "
        "| goodput GPU-h / searched | fluid bound GPU-h | feasible share |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for record in records:
        if "error" in record:
            lines.append(f"| {record['model']} | {record['trace']} | error: {record['error']} |")
            continue
        cells = [_cell(record, name) for name in (*POLICY_ORDER, "oracle")]
        fluid = float(record["oracle"]["fluid_bound_gpu_hours"])
        if "goodput" in record["policies"]:
            test = record["policies"]["goodput"]["test"]
            best = best_baseline(record)
            versus = (
                f"{_ratio(_good(record, 'goodput'), _good(record, best))} {best}" if best is not None else "-"
            )
            ratios = (
                f" | {versus} | {_ratio(test['gpu_hours'], fluid)}"
                f" | {_ratio(test['gpu_hours'], _test(record, 'oracle')['gpu_hours'])}"
            )
        else:
            test, ratios = _test(record, "oracle"), " | - | - | -"
        share = test["feasible"] / test["offered"] if test["offered"] else math.nan
        lines.append(
            f"| {record['model']} | {record['trace']} | "
            + " | ".join(cells)
            + ratios
            + f" | {fluid:.2f} | {share:.3f} |"
        )
    return "\n".join(lines)


def _cell(record: Mapping[str, Any], name: str) -> str:
    """`attainment of offered, GPU-h, SLO-met per GPU-h`; `*` when the pick missed the target on the
    training day (none of its settings met it); `=` when its test run held its warm start (no scale
    change); `-` for a policy this run did not tune."""
    if name == "oracle":
        outcome = record["oracle"]["searched"]
        flag = "" if record["oracle"]["searched_met_target"] else "*"
    elif name not in record["policies"]:
        return "-"
    else:
        outcome = record["policies"][name]["test"]
        flag = "" if record["policies"][name]["chosen_met_target_on_train"] else "*"
        if name != "fixed" and _held(outcome):
            flag += "="
    return (
        f"{outcome['attainment_offered']:.3f}, {outcome['gpu_hours']:.1f} GPU-h, "
        f"{outcome['good_per_gpu_hour']:.0f}/GPU-h{flag}"
    )


def _held(outcome: Mapping[str, Any]) -> bool:
    return outcome.get("scale_outs") == outcome.get("scale_ins") == 0


def settings_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The setting each policy's training sweep chose, per case (`-`: not tuned in this run)."""
    header = (
        "| model | case | "
        + " | ".join(f"{name}: {KNOBS[name]}" for name in POLICY_ORDER)
        + " | oracle: factor (group-intervals shaved)"
        + " | C req/s/group on the trace's shape (95 % LB attainment) | goodput's C on steady arrivals |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for record in _ran(records):
        policies = record["policies"]
        chosen = [
            f"{policies[name]['chosen_setting']:g}" if name in policies else "-" for name in POLICY_ORDER
        ]
        oracle = record["oracle"]
        lines.append(
            f"| {record['model']} | {record['trace']} | "
            + " | ".join(chosen)
            + f" | {oracle['searched_factor']:.3g} ({oracle['shaved_group_intervals']})"
            + f" | {_envelope_cell(record['envelope'])} | {_envelope_cell(record.get('goodput_envelope'))} |"
        )
    return "\n".join(lines)


def _envelope_cell(envelope: Mapping[str, Any] | None) -> str:
    """Requests per second per group, then per class the 95 % lower bound of the attainment there."""
    if envelope is None:
        return "-"
    bounds = ", ".join(f"{value:.3f}" for value in envelope["attainment_lower_bounds_95"])
    return f"{envelope['requests_per_second_per_group']:.2f} ({bounds})"


def policies_below_the_oracle(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each test run that met at least as many requests as the searched oracle on fewer GPU-hours:
    a policy beating the hindsight schedule at equal attainment, which says the search fell short."""
    beaten = []
    for record in _ran(records):
        oracle = record["oracle"]["searched"]
        for name in POLICY_ORDER:
            if name not in record["policies"]:
                continue
            test = record["policies"][name]["test"]
            if test["met"] >= oracle["met"] and test["gpu_hours"] < oracle["gpu_hours"]:
                beaten.append(
                    f"{record['model']} {record['trace']}: {name} met {test['met']} on "
                    f"{test['gpu_hours']:.2f} GPU-h, the oracle {oracle['met']} on {oracle['gpu_hours']:.2f}"
                )
    return beaten


ATTAINMENT_GOAL = 0.99
"""goodput's goal on every test day: at least this share of offered requests meet their SLO..."""
FLUID_SHARE_GOAL = 1.15
"""...on at most this multiple of the fluid bound's GPU-hours..."""
BEST_BASELINE_GOAL = 1.3
"""...with at least this multiple of the best tuned baseline's SLO-meeting requests per GPU-hour..."""
BEHIND_TOLERANCE = 0.05
"""...and never further than this behind a baseline of equal or better attainment; and no more
GPU-hours than the searched schedule."""
HELD_SHARE_GOAL = 0.25
"""The suite's own goal: fewer than this share of the reactive baselines' test runs hold their warm
start, or the suite cannot tell policies apart."""


@dataclass(frozen=True, slots=True)
class GoalTally:
    """How many cases one subject (goodput, or the searched oracle as a ceiling) meets each part of
    the goal in, counted from the records so the report's figures are the command's own."""

    subject: str
    cases: int
    attained: int
    """Cases at `ATTAINMENT_GOAL` of offered or more."""
    within_fluid: int
    """Cases on at most `FLUID_SHARE_GOAL` times the fluid bound's GPU-hours."""
    ahead_of_best: int
    """Cases at `BEST_BASELINE_GOAL` times the best tuned baseline's SLO-met per GPU-hour or more, at
    equal or better attainment."""
    not_above_searched: int
    """Cases on no more GPU-hours than the searched schedule."""
    behind: tuple[str, ...]
    """Cases more than `BEHIND_TOLERANCE` behind a baseline of equal or better attainment, each with
    the ratios."""


def _as_attained(subject: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether `subject` reached at least `other`'s attainment against offered load."""
    return float(subject["attainment_offered"]) >= float(other["attainment_offered"]) - 1e-12


def _ahead_of_best(record: Mapping[str, Any], subject: str) -> bool:
    best = best_baseline(record)
    if best is None:
        return False
    own = _test(record, subject)
    return _as_attained(own, _test(record, best)) and _good(record, subject) >= BEST_BASELINE_GOAL * _good(
        record, best
    )


def goal_tally(records: Sequence[Mapping[str, Any]], subject: str = "goodput") -> GoalTally:
    """Each part of the goal counted over the cases that ran with `subject`."""
    ran = [r for r in _ran(records) if subject == "oracle" or subject in r["policies"]]
    attained = within_fluid = ahead = not_above = 0
    behind: list[str] = []
    for record in ran:
        own = _test(record, subject)
        attained += float(own["attainment_offered"]) >= ATTAINMENT_GOAL
        within_fluid += float(own["gpu_hours"]) <= FLUID_SHARE_GOAL * float(
            record["oracle"]["fluid_bound_gpu_hours"]
        )
        ahead += _ahead_of_best(record, subject)
        not_above += float(own["gpu_hours"]) <= float(_test(record, "oracle")["gpu_hours"])
        lagging = _lagging(record, subject)
        if lagging:
            behind.append(f"{record['model']} {record['trace']} ({', '.join(lagging)})")
    return GoalTally(subject, len(ran), attained, within_fluid, ahead, not_above, tuple(behind))


def _lagging(record: Mapping[str, Any], subject: str) -> list[str]:
    """The baselines of equal or better attainment that `subject` is more than `BEHIND_TOLERANCE`
    behind in this case, each as `0.81x kpa`."""
    own, good = _test(record, subject), _good(record, subject)
    return [
        f"{good / _good(record, name):.2f}x {name}"
        for name in _baselines_in(record)
        if name != subject
        and _as_attained(_test(record, name), own)
        and good < (1 - BEHIND_TOLERANCE) * _good(record, name)
    ]


def held_warm_start(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Per policy, the cases whose test run changed the group count not once, then the reactive
    baselines' runs together against `HELD_SHARE_GOAL`. Why: a baseline tuned to a setting that
    never moves the fleet is a fixed fleet of the warm start's size, and a suite where most do
    cannot tell policies apart. None for records written before runs counted their scale changes."""
    ran = _ran(records)
    runs = [(name, _test(r, name)) for r in ran for name in POLICY_ORDER if name in r["policies"]]
    if not runs or any("scale_outs" not in outcome for _, outcome in runs):
        return None
    held = {name: 0 for name in POLICY_ORDER if any(n == name for n, _ in runs)}
    for name, outcome in runs:
        held[name] += _held(outcome)
    reactive = [outcome for name, outcome in runs if name in REACTIVE_BASELINES]
    count = sum(_held(outcome) for outcome in reactive)
    verdict = "under" if count < HELD_SHARE_GOAL * len(reactive) else "not under"
    return (
        ", ".join(f"{name} {value}" for name, value in held.items())
        + f"; reactive baselines {count} of {len(reactive)} ({verdict} a quarter)"
    )


def render_goals(records: Sequence[Mapping[str, Any]]) -> str:
    """goodput's count for each part of the goal, beside the searched oracle's where it applies."""
    own, ceiling = goal_tally(records), goal_tally(records, "oracle")
    parts = [
        f"at least {ATTAINMENT_GOAL:g} of offered met: goodput {own.attained} of {own.cases} cases, "
        f"the searched oracle {ceiling.attained}",
        f"on at most {FLUID_SHARE_GOAL:g}x the fluid bound's GPU-hours: goodput {own.within_fluid}, "
        f"the searched oracle {ceiling.within_fluid}",
        f"at {BEST_BASELINE_GOAL:g}x the best tuned baseline's SLO-met requests per GPU-hour or more, at "
        f"equal or better attainment: goodput {own.ahead_of_best}, "
        f"the searched oracle {ceiling.ahead_of_best}",
        f"on no more GPU-hours than the searched schedule: goodput {own.not_above_searched}",
        f"not more than {BEHIND_TOLERANCE:.0%} behind a baseline of equal or better attainment: "
        f"{own.cases - len(own.behind)} (behind: {'; '.join(own.behind) or 'none'})",
    ]
    held = held_warm_start(records)
    if held is not None:
        parts.append(f"test runs that held their warm start throughout (no scale change): {held}")
    return "The goal, counted on the test days: " + "; ".join(parts) + "."


def plot_curves(record: Mapping[str, Any], out_dir: Path) -> Path:
    """cost-vs-attainment.png: each policy's training sweep (one point per setting) and its test point."""
    figure, axes = plt.subplots(figsize=(7, 5))
    for index, name in enumerate(name for name in POLICY_ORDER if name in record["policies"]):
        policy = record["policies"][name]
        color = f"C{index}"
        sweep = sorted(policy["sweep"], key=lambda outcome: outcome["gpu_hours"])
        axes.plot(
            [o["gpu_hours"] for o in sweep],
            [o["attainment_feasible"] for o in sweep],
            marker="o",
            color=color,
            label=f"{name} train sweep",
        )
        test = policy["test"]
        axes.scatter(
            [test["gpu_hours"]],
            [test["attainment_feasible"]],
            marker="*",
            s=160,
            color=color,
            label=f"{name} test ({KNOBS[name]} {test['setting']:g})",
        )
    searched = record["oracle"]["searched"]
    axes.scatter(
        [searched["gpu_hours"]],
        [searched["attainment_feasible"]],
        marker="D",
        color="black",
        label="oracle search (test)",
    )
    axes.axvline(
        record["oracle"]["fluid_bound_gpu_hours"], color="grey", linestyle="--", label="fluid bound (test)"
    )
    axes.set_xlabel("GPU-hours (train sweep and test window)")
    axes.set_ylabel("attainment of feasible requests")
    axes.set_title(f"{record['model']} on {record['trace']}")
    axes.legend(fontsize=7)
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "cost-vs-attainment.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def markdown(records: Sequence[Mapping[str, Any]], preamble: str) -> str:
    return (
        "\n\n".join(
            (
                preamble,
                "Test day, per policy: attainment of offered requests, GPU-hours, SLO-meeting requests "
                "per GPU-hour; `*`: no setting met the attainment target on the training day (oracle: no "
                "schedule the search tried met it on the test day); `=`: the test run held its warm "
                "start (no scale change); `-`: not tuned in this run.",
                summary_table(records),
                "Settings chosen on the training day (the cheapest meeting the target, past the "
                "grid's safe end while none did, bisected where settings stop meeting it), and the "
                "envelopes measured there:",
                settings_table(records),
                "Test runs that met as many requests as the searched oracle on fewer GPU-hours: "
                + ("; ".join(policies_below_the_oracle(records)) or "none")
                + ".",
                render_goals(records),
            )
        )
        + "\n"
    )


def _draw_cell(record: Mapping[str, Any] | None) -> str:
    """goodput's multiple of the best tuned baseline's SLO-meeting requests per GPU-hour (`↓` where
    goodput met a lower share of the offered load), and the baselines it is behind in this draw."""
    if record is None:
        return "-"
    if "error" in record:
        return "error"
    best = best_baseline(record)
    if best is None or "goodput" not in record["policies"]:
        return "-"
    own = _test(record, "goodput")
    multiple = (
        _ratio(_good(record, "goodput"), _good(record, best))
        + ("" if _as_attained(own, _test(record, best)) else "↓")
        + f" {best}"
    )
    lagging = _lagging(record, "goodput")
    return multiple + (f"; behind {', '.join(lagging)}" if lagging else "")


def _geometric_mean_ratio(records: Sequence[Mapping[str, Any]], over: tuple[str, str]) -> str:
    """One policy's SLO-meeting requests per GPU-hour over another's (`over`: the pair), the geometric
    mean over the cases that ran both where both served some (a ratio's mean is geometric so that 2x
    and 0.5x cancel)."""
    own, other = over

    def has(record: Mapping[str, Any], name: str) -> bool:
        return name == "oracle" or name in record["policies"]

    logs = [
        math.log(_good(record, own) / _good(record, other))
        for record in _ran(records)
        if has(record, own) and has(record, other) and _good(record, own) > 0 and _good(record, other) > 0
    ]
    return f"{math.exp(sum(logs) / len(logs)):.3f}" if logs else "-"


# goodput over each baseline and the oracle; then the searched oracle over each baseline: the
# multiple a hindsight schedule reaches, the ceiling of goodput's own.
_MEAN_RATIOS = (
    *(("goodput", name) for name in BASELINES),
    ("goodput", "oracle"),
    *(("oracle", name) for name in BASELINES),
)


def draws_markdown(draws: Mapping[int, Sequence[Mapping[str, Any]]]) -> str:
    """The suite run once per seed, side by side: per case goodput's multiple of the best tuned
    baseline and the baselines it is behind, in each draw, and how many draws it is behind in; then
    the goal counted per draw, with the geometric means of goodput's ratios to each baseline and the
    oracle, and of the searched oracle's to each baseline (how far a hindsight schedule gets), and
    how many of each policy's test runs held their warm start. Why: each test day is one draw of
    its arrivals, lengths, classes and step-time noise, and a verdict that one burst decides can
    turn with the draw; a verdict that holds in every draw does not rest on one."""
    seeds = sorted(draws)
    by_case = {seed: {(r["model"], r["trace"]): r for r in draws[seed]} for seed in seeds}
    cases = list(dict.fromkeys(key for seed in seeds for key in by_case[seed]))
    header = "| model | case | " + " | ".join(f"seed {seed}" for seed in seeds) + " | behind a baseline in |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for model, trace in cases:
        records = [by_case[seed].get((model, trace)) for seed in seeds]
        ran = [record for record in records if record is not None and "error" not in record]
        behind = sum(1 for record in ran if "goodput" in record["policies"] and _lagging(record, "goodput"))
        lines.append(
            f"| {model} | {trace} | "
            + " | ".join(_draw_cell(record) for record in records)
            + f" | {behind} of {len(ran)} draws |"
        )
    goals = (
        "| seed | cases | "
        + f"≥{ATTAINMENT_GOAL:g} met | ≤{FLUID_SHARE_GOAL:g}x fluid | ≥{BEST_BASELINE_GOAL:g}x best baseline "
        "(oracle) | ≤ searched GPU-h | "
        + " | ".join(f"geometric mean {'/'.join(pair)}" for pair in _MEAN_RATIOS)
        + " | held the warm start |"
    )
    rows = [goals, "|" + "---|" * (goals.count("|") - 1)]
    for seed in seeds:
        own, ceiling = goal_tally(draws[seed]), goal_tally(draws[seed], "oracle")
        rows.append(
            f"| {seed} | {own.cases} | {own.attained} | {own.within_fluid} | "
            f"{own.ahead_of_best} ({ceiling.ahead_of_best}) | {own.not_above_searched} | "
            + " | ".join(_geometric_mean_ratio(draws[seed], pair) for pair in _MEAN_RATIOS)
            + f" | {held_warm_start(draws[seed]) or '-'} |"
        )
    return "\n".join(lines) + "\n\nThe goal, counted per draw:\n\n" + "\n".join(rows) + "\n"
