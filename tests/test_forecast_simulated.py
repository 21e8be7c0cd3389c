"""The simulator's goodput policy runs the operator's forecaster on the same history rules: refitted
every refresh of simulated time on what it was given and what its decisions estimated."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_autoscale_world import PERMISSIVE, PROFILE
from test_forecast import HORIZON, history

from goodput.api.modelgroup import ScheduledReplicas
from goodput.controllers.autoscale.forecast import DAY_SECONDS, DEFAULT_FORECAST_SETTINGS, WorkForecaster
from goodput.simulator.config import build_setup
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.runner import Bench, RunOptions

REFRESH = DEFAULT_FORECAST_SETTINGS.refresh_seconds


def shifted(days: float) -> list[tuple[float, float]]:
    """`days` of history ending at simulated time 0, as a benchmark seeds it."""
    end = days * DAY_SECONDS
    return [(at - end, value) for at, value in history(days)]


def test_a_seeded_history_gives_a_forecaster_from_the_first_tick_and_is_refitted_each_refresh() -> None:
    policy = GoodputPolicy(PERMISSIVE, PROFILE, forecast=True, offered_history=shifted(2))
    first = policy.forecaster_at(0.0, HORIZON)
    assert isinstance(first, WorkForecaster) and first.horizon_seconds == HORIZON
    assert policy.forecaster_at(REFRESH - 1, HORIZON) is first
    policy.offered_history.append((REFRESH - 1, 1.0))
    assert policy.forecaster_at(REFRESH, HORIZON) is not first
    assert [outcome for _, outcome in policy.forecast_outcomes] == ["ForecastReady", "ForecastReady"]


def test_a_short_history_or_no_ready_time_forecasts_nothing_and_says_why() -> None:
    short = GoodputPolicy(PERMISSIVE, PROFILE, forecast=True, offered_history=shifted(0.5))
    assert short.forecaster_at(0.0, HORIZON) is None
    unknown = GoodputPolicy(PERMISSIVE, PROFILE, forecast=True, offered_history=shifted(2))
    assert unknown.forecaster_at(0.0, None) is None
    assert [o for _, o in short.forecast_outcomes + unknown.forecast_outcomes] == [
        "HistoryTooShort",
        "ReadyTimeUnknown",
    ]


def test_without_the_flag_nothing_is_fitted() -> None:
    policy = GoodputPolicy(PERMISSIVE, PROFILE, offered_history=shifted(2))
    assert policy.forecaster_at(0.0, HORIZON) is None and policy.forecast_outcomes == []


def test_goodput_simulate_forecast_runs_the_forecaster_with_the_modelgroups_schedule() -> None:
    samples = Path(__file__).resolve().parent.parent / "manifests" / "samples"
    setup = build_setup(samples / "modelgroup-llama-8b-tp1.yaml", samples / "slopolicy-interactive.yaml")
    window = ScheduledReplicas(name="day", start="08:00", end="18:00", min_replicas=2)
    group = setup.model_group
    assert group is not None
    spec = group.spec.model_copy(update={"replica_schedule": (window,)})
    setup = dataclasses.replace(setup, model_group=group.model_copy(update={"spec": spec}))
    bench = Bench(setup, RunOptions(trace="synthetic:rate=1,duration=30", forecast=True))
    policy = bench.autoscaler("goodput")
    assert isinstance(policy, GoodputPolicy)
    assert policy.forecast and policy.describe()["forecast"] == "on"
    assert policy.replica_schedule == (window,)
