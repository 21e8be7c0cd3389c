"""The suite's report: test runs that beat the searched oracle, goodput's goal per part against the
best tuned baseline, the fluid bound and the searched schedule, and the runs that held their warm
start, counted from the records."""

from __future__ import annotations

from typing import Any

import pytest

from goodput.simulator.suite_report import (
    POLICY_ORDER,
    REACTIVE_BASELINES,
    best_baseline,
    goal_tally,
    policies_below_the_oracle,
)


def _record(oracle: tuple[int, float], **runs: tuple[int, float]) -> dict[str, Any]:
    """A case record: (met, GPU-hours) for the oracle and each named policy (others far costlier)."""

    def outcome(met: int, gpu_hours: float) -> dict[str, Any]:
        return {"met": met, "gpu_hours": gpu_hours}

    policies = {name: {"test": outcome(*runs.get(name, (0, 99.0)))} for name in POLICY_ORDER}
    return {
        "model": "m",
        "trace": "t",
        "oracle": {"searched": outcome(*oracle)},
        "policies": policies,
    }


@pytest.mark.parametrize(
    ("name", "record", "beaten_by"),
    [
        ("cheaper and as many met", _record((100, 2.0), hpa=(100, 1.5)), ["hpa"]),
        ("cheaper and more met", _record((100, 2.0), **{"keda-queue": (101, 1.9)}), ["keda-queue"]),
        ("cheaper but fewer met", _record((100, 2.0), goodput=(99, 1.0)), []),
        ("as many met at the same cost: a tie", _record((100, 2.0), kpa=(100, 2.0)), []),
    ],
)
def test_a_policy_beats_the_oracle_only_by_meeting_as_many_for_less(
    name: str, record: dict[str, Any], beaten_by: list[str]
) -> None:
    beaten = policies_below_the_oracle([record, {"model": "m", "trace": "broken", "error": "x"}])
    assert all(line.startswith("m t: ") for line in beaten), name
    assert [line.split(": ")[1].split()[0] for line in beaten] == beaten_by, name


def _case(trace: str, fluid: float = 10.0, **runs: tuple[float, float, float]) -> dict[str, Any]:
    """A case record: (SLO-met per GPU-hour, attainment of offered, GPU-hours) per policy run."""

    def outcome(good: float, attainment: float, gpu_hours: float) -> dict[str, Any]:
        return {"good_per_gpu_hour": good, "attainment_offered": attainment, "gpu_hours": gpu_hours}

    return {
        "model": "m",
        "trace": trace,
        "policies": {name: {"test": outcome(*runs[name])} for name in POLICY_ORDER if name in runs},
        "oracle": {"searched": outcome(*runs["oracle"]), "fluid_bound_gpu_hours": fluid},
    }


EVEN = {name: (100.0, 1.0, 20.0) for name in POLICY_ORDER if name != "goodput"} | {
    "oracle": (150.0, 1.0, 12.0)
}


@pytest.mark.parametrize(
    ("name", "record", "expected"),
    [
        # (attained, within fluid, ahead of the best baseline, not above the searched GPU-hours, behind)
        ("level with every baseline", _case("t", goodput=(100.0, 1.0, 20.0), **EVEN), (1, 0, 0, 0, [])),
        (
            "1.3x the best, 1.1x fluid, under the search",
            _case("t", goodput=(130.0, 1.0, 11.0), **EVEN),
            (1, 1, 1, 1, []),
        ),
        ("1.3x but short of 0.99 met", _case("t", goodput=(130.0, 0.98, 11.0), **EVEN), (0, 1, 0, 1, [])),
        ("over 1.15x the fluid bound", _case("t", goodput=(130.0, 1.0, 11.6), **EVEN), (1, 0, 1, 1, [])),
        (
            "the best baseline sets the bar",
            _case("t", goodput=(130.0, 1.0, 11.0), **(EVEN | {"kpa": (110.0, 1.0, 20.0)})),
            (1, 1, 0, 1, []),
        ),
        (
            "6 % behind a baseline as good: behind",
            _case("t", goodput=(94.0, 1.0, 20.0), **(EVEN | {"kpa": (100.0, 1.0, 20.0)})),
            (1, 0, 0, 0, ["m t (" + ", ".join(f"0.94x {n}" for n in POLICY_ORDER if n != "goodput") + ")"]),
        ),
        (
            "behind only a baseline that attained less: not behind",
            _case(
                "t", goodput=(90.0, 1.0, 20.0), **(EVEN | dict.fromkeys(POLICY_ORDER[1:], (200.0, 0.5, 1.0)))
            ),
            (1, 0, 0, 0, []),
        ),
    ],
)
def test_the_goal_is_counted_per_part(name: str, record: dict[str, Any], expected: tuple[Any, ...]) -> None:
    tally = goal_tally([record, {"model": "m", "trace": "broken", "error": "x"}])
    assert tally.cases == 1, name
    assert (tally.attained, tally.within_fluid, tally.ahead_of_best, tally.not_above_searched) == expected[
        :4
    ], name
    assert list(tally.behind) == expected[4], name


def test_the_best_baseline_is_the_one_with_most_met_per_gpu_hour_among_those_tuned() -> None:
    record = _case(
        "t", goodput=(100.0, 1.0, 10.0), kpa=(90.0, 1.0, 10.0), fixed=(120.0, 1.0, 10.0), oracle=(1, 1, 1)
    )
    assert best_baseline(record) == "fixed"
    assert best_baseline(_case("t", goodput=(100.0, 1.0, 10.0), oracle=(1, 1, 1))) is None


def test_the_settings_table_shows_both_envelopes_and_a_dash_where_one_was_not_recorded() -> None:
    from goodput.simulator.suite_report import settings_table

    def envelope(rate: float, bound: float) -> dict[str, Any]:
        return {"requests_per_second_per_group": rate, "attainment_lower_bounds_95": [bound]}

    record = _record((100, 2.0))
    for policy in record["policies"].values():
        policy["chosen_setting"] = 1.0
    del record["policies"]["hpa"]
    record["oracle"] |= {"searched_factor": 0.5, "shaved_group_intervals": 3}
    record["envelope"] = envelope(4.18, 0.995)
    both = settings_table([record | {"goodput_envelope": envelope(10.94, 0.991)}])
    assert both.splitlines()[-1].endswith("| 1 | - | 0.5 (3) | 4.18 (0.995) | 10.94 (0.991) |")
    assert settings_table([record]).splitlines()[-1].endswith("| 4.18 (0.995) | - |")


def _table_rows(text: str) -> dict[str, list[str]]:
    """The cells of each markdown table row, keyed by its first two cells joined."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 2 and not set(cells[0]) <= {"-"}:
            rows[" ".join(cells[:2])] = cells[2:]
    return rows


def test_the_draws_table_shows_each_case_in_each_draw_against_the_best_baseline() -> None:
    from goodput.simulator.suite_report import draws_markdown

    behind = _case("turns", goodput=(80.0, 1.0, 20.0), **EVEN)
    ahead = _case("turns", goodput=(130.0, 1.0, 11.0), **EVEN)
    lower = _case("lower", goodput=(200.0, 0.9, 5.0), **(EVEN | {"kpa": (120.0, 1.0, 20.0)}))
    text = draws_markdown({1: [ahead, {"model": "m", "trace": "lower", "error": "x"}], 0: [behind, lower]})
    rows = _table_rows(text)
    assert rows["model case"] == ["seed 0", "seed 1", "behind a baseline in"]
    first_baseline = POLICY_ORDER[1]
    assert rows["m turns"][1] == f"1.30x {first_baseline}"
    assert rows["m turns"][0].startswith(f"0.80x {first_baseline}; behind 0.80x")
    assert rows["m turns"][2] == "1 of 2 draws"
    assert rows["m lower"] == ["1.67x↓ kpa", "error", "0 of 1 draws"]
    # seed 1: met 1.0 on 11 GPU-h against a fluid bound of 10 and a search of 12
    assert rows["1 1"][:4] == ["1", "1", "1 (1)", "1"]


def test_the_report_counts_the_test_runs_that_held_their_warm_start() -> None:
    """A run whose fleet never moved is its warm start held: per policy, and the reactive baselines'
    runs together against a quarter."""
    from goodput.simulator.suite_report import render_goals

    def with_changes(record: dict[str, Any], moved: set[str]) -> dict[str, Any]:
        for name, policy in record["policies"].items():
            policy["test"] |= {"scale_outs": int(name in moved), "scale_ins": 0}
        return record

    everyone = set(POLICY_ORDER)
    records = [
        with_changes(_case("a", goodput=(130.0, 1.0, 11.0), **EVEN), everyone - {"hpa"}),
        with_changes(_case("b", goodput=(100.0, 1.0, 20.0), **EVEN), everyone - {"hpa", "fixed"}),
        {"model": "m", "trace": "c", "error": "x"},
    ]
    text = render_goals(records)
    runs = 2 * len(REACTIVE_BASELINES)
    assert f"hpa 2; reactive baselines 2 of {runs} (under a quarter)" in text
    assert "goodput 0, " in text and "fixed 1" in text
    stuck = [with_changes(_case("d", goodput=(100.0, 1.0, 20.0), **EVEN), {"goodput"})]
    assert (
        f"reactive baselines {len(REACTIVE_BASELINES)} of {len(REACTIVE_BASELINES)} (not under"
        in render_goals(stuck)
    )
    # records written before runs counted their changes: no figure rather than a wrong one
    assert "warm start" not in render_goals([_case("d", goodput=(100.0, 1.0, 20.0), **EVEN)])
