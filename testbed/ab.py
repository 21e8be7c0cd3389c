"""`goodput ab`: goodput, the real KEDA and the real HPA, one after another, on the same cluster and replay.

Each policy gets the demo's whole loop (`goodput demo`) in a namespace of its own (`--namespace`
and the policy's name): the same ModelGroup and
SLOPolicy from `manifests/demo/`, the same emulated fleet, the same slice of a trace with its burst,
replayed open loop straight to the Service's ready leaders (no gateway, so no policy gets goodput's
admission control). Only who sets `spec.replicas` differs:

- goodput: its autoscaler, under the SLOPolicy;
- keda: a KEDA ScaledObject on vLLM's waiting requests (`manifests/baselines/keda-num-requests-waiting.yaml`);
- hpa: the HPA on DCGM GPU utilisation through KEDA (`manifests/baselines/hpa-gpu-utilisation.yaml`);

for the last two goodput's policy only advises. Every policy's one knob is chosen first, in the fleet
simulator on a training window earlier in the trace, by the fair benchmark's rule (DESIGN §10): the
baselines' thresholds, and goodput's capacity (its envelope measured on the training window's feasible
requests, times a headroom factor), which goes into the ModelGroup's
`profile.capacityWorkSecondsPerSecond` as `goodput envelope` prints it. Then one table: SLO-meeting
requests per GPU-hour, attainment against offered requests, GPU-hours, scale events, time from the
burst to more ready groups, requests lost in scale-in; and one page plotting groups and TTFT p99 over
time for every policy. Each run's own report stays under `--out/<policy>/`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from goodput.estimators.work import WorkPricing
from goodput.simulator.baselines import HpaGpuUtilization, KedaWaitingRequests
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.envelope import CapacityEnvelope, EnvelopeNotFoundError, EnvelopeSearch
from goodput.simulator.fair_bench import SWEEPS, FairnessRunFigures, cheapest_meeting_target, swept
from goodput.simulator.feasible import NoFeasibleRequestsError, assess
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.fleet_policy import FleetPolicy
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.records import RequestExit
from goodput.simulator.report import RequestVerdicts, judge
from goodput.simulator.runner import measure_feasible_envelope
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, class_weights_from, prepare
from goodput.testbed import demo
from goodput.testbed.cluster import controlplane, keda
from goodput.testbed.cluster.binaries import ensure_binaries

POLICIES = demo.SCALERS
INTERRUPTED = demo.INTERRUPTED
"""What a run returns when interrupted (Ctrl-C, SIGTERM): the A/B run stops there too."""


@dataclass(frozen=True, slots=True)
class AbRow:
    """One policy's figures, each counted from its run's report."""

    policy: str
    offered: int
    slo_met: int
    gpu_hours: float
    attainment_offered: float | None
    scale_outs: int
    scale_ins: int
    burst_to_capacity_seconds: float | None
    """From the burst's start to the first moment more groups were ready than at its start."""
    lost_in_scale_in: int
    failed: int

    @property
    def slo_met_per_gpu_hour(self) -> float | None:
        return self.slo_met / self.gpu_hours if self.gpu_hours > 0 else None


def replica_changes(samples: Sequence[Mapping[str, Any]], end_seconds: float = math.inf) -> tuple[int, int]:
    """(scale-outs, scale-ins): changes of the wanted group count between consecutive samples, up to
    `end_seconds` (the offered window: live and simulated runs are counted over the same span)."""
    wanted = [
        int(sample["desired_groups"]) for sample in samples if float(sample["offset_seconds"]) <= end_seconds
    ]
    ups = sum(1 for before, after in itertools.pairwise(wanted) if after > before)
    downs = sum(1 for before, after in itertools.pairwise(wanted) if after < before)
    return ups, downs


def burst_to_capacity(samples: Sequence[Mapping[str, Any]], burst_start_seconds: float) -> float | None:
    """Seconds from the burst's start until more groups are ready than were at its start; None when
    no group was added after it began (or no sample precedes it to count from, which a run that
    samples from its start never has)."""
    before = [s for s in samples if float(s["offset_seconds"]) <= burst_start_seconds]
    if not before:
        return None
    ready_at_start = int(before[-1]["ready_groups"])
    for sample in samples:
        offset = float(sample["offset_seconds"])
        if offset > burst_start_seconds and int(sample["ready_groups"]) > ready_at_start:
            return offset - burst_start_seconds
    return None


def burst_start(phases: Sequence[Mapping[str, Any]]) -> float | None:
    start = 0.0
    for phase in phases:
        if phase["name"] == "burst":
            return start
        start += float(phase["seconds"])
    return None


def held_gpu_hours(samples: Sequence[Mapping[str, Any]], gpus_per_group: int, end_seconds: float) -> float:
    """GPU-hours of the groups held (starting, ready or draining) from the first sample to `end_seconds`,
    each sample's count holding until the next."""
    total = 0.0
    for sample, following in itertools.pairwise([*samples, {"offset_seconds": end_seconds}]):
        start, end = float(sample["offset_seconds"]), min(float(following["offset_seconds"]), end_seconds)
        if end > start:
            total += int(sample["held_groups"]) * (end - start)
    return total * gpus_per_group / 3600.0


def offered_seconds(phases: Sequence[Mapping[str, Any]]) -> float:
    return sum(float(phase["seconds"]) for phase in phases)


def ab_row(policy: str, report: Mapping[str, Any]) -> AbRow:
    """The figures of one `goodput demo` report (its demo.json); GPU-hours over the offered window, as
    the simulator counts them."""
    summary, samples, phases = report["summary"], report["samples"], report["scenario"]["phases"]
    ups, downs = replica_changes(samples, offered_seconds(phases))
    start = burst_start(phases)
    return AbRow(
        policy=policy,
        offered=int(summary["offered"]),
        slo_met=int(summary["attained"]),
        gpu_hours=held_gpu_hours(samples, int(summary["gpus_per_group"]), offered_seconds(phases)),
        attainment_offered=summary["attainment_offered"],
        scale_outs=ups,
        scale_ins=downs,
        burst_to_capacity_seconds=None if start is None else burst_to_capacity(samples, start),
        lost_in_scale_in=int(summary["lost_on_drained_groups"]),
        failed=int(summary["failed"]),
    )


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    """What the fleet simulator needs to replay one A/B window: the demo's manifests, the workload the
    live run offered, each baseline's threshold as its ScaledObject states it, and goodput's envelope
    with its factor (`thresholds["goodput"]`, 1 when absent)."""

    model_group_path: Path
    policy_path: Path
    workload: Workload
    offered_seconds: float
    burst_start_seconds: float | None
    thresholds: Mapping[str, float]
    seed: int = 0
    polling_interval_seconds: float = 15.0
    goodput_envelope: CapacityEnvelope | None = None
    """Measured on the training window; None: goodput runs on the ModelGroup's profile as written."""

    def goodput_scaled_envelope(self) -> CapacityEnvelope | None:
        """The envelope goodput runs on: the measured one times its factor (None: none measured)."""
        if self.goodput_envelope is None:
            return None
        return self.goodput_envelope.scaled(self.thresholds.get("goodput", 1.0))

    def goodput_capacity(self) -> float | None:
        """C (work-seconds per second of one group) goodput runs on, as the ModelGroup states it."""
        envelope = self.goodput_scaled_envelope()
        return None if envelope is None else envelope.work_seconds_per_second


def simulated_autoscaler(
    policy: str, run: SimulatedRun, setup: SimulationSetup, workload: Workload
) -> FleetPolicy:
    if policy == "keda":
        return KedaWaitingRequests(
            target_waiting_per_group=run.thresholds["keda"],
            polling_interval_seconds=run.polling_interval_seconds,
        )
    if policy == "hpa":
        return HpaGpuUtilization(target_utilization=run.thresholds["hpa"] / 100.0)
    return GoodputPolicy.for_setup(setup, workload, run.goodput_scaled_envelope())


def simulation_inputs(run: SimulatedRun) -> tuple[SimulationSetup, Workload, FleetConfig]:
    """The window as the simulator takes it: the manifests' setup, the workload with its classes, the
    fleet of the ModelGroup."""
    setup = build_setup(run.model_group_path, run.policy_path)
    names = tuple(c.name for c in setup.classes)
    workload = prepare(run.workload, ClassRule(names, class_weights_from(names, None), 2), run.seed)
    return setup, workload, replace(setup.fleet(), prefix_block_tokens=workload.prefix_block_tokens)


def measure_training_envelope(training: SimulatedRun) -> CapacityEnvelope:
    """goodput's envelope on the training window, as the fair benchmark measures it: the highest rate
    per group at which a fleet behind the router meets the SLO on the window's feasible requests."""
    setup, workload, fleet = simulation_inputs(training)
    return measure_feasible_envelope(
        setup, fleet, workload, assess(workload, setup.engine, setup.classes),
        pricing=WorkPricing.from_step_model(setup.engine.cost), search=EnvelopeSearch(), seed=training.seed,
    )  # fmt: skip


def simulated_rows(run: SimulatedRun, policies: Sequence[str]) -> list[AbRow]:
    """Each policy in the simulator on the live run's workload, fleet and targets, counted alike."""
    setup, workload, fleet = simulation_inputs(run)
    rows = []
    for policy in policies:
        config = SimulationConfig(
            fleet=fleet, seed=run.seed, initial_groups=setup.min_groups, horizon_seconds=run.offered_seconds,
            control_start_seconds=0.0,
        )  # fmt: skip
        result = simulate(workload, config, simulated_autoscaler(policy, run, setup, workload))
        rows.append(simulated_row(policy, result, judge(result, setup.classes), run))
    return rows


def simulated_row(
    policy: str, result: SimulationResult, verdicts: RequestVerdicts, run: SimulatedRun
) -> AbRow:
    samples = [
        {"offset_seconds": c.time, "desired_groups": c.desired, "ready_groups": c.ready}
        for c in result.timeline
    ]
    ups, downs = replica_changes(samples, run.offered_seconds)
    offered = len(result.workload)
    slo_met = int(verdicts.met.sum())
    start = run.burst_start_seconds
    burst = None if start is None else burst_to_capacity(samples, start)
    # No group fails in these runs, so every request lost in flight was lost by a drain that ran out.
    lost = int((result.requests["outcome"] == RequestExit.FAILED).sum())
    return AbRow(
        policy=policy, offered=offered, slo_met=slo_met, gpu_hours=result.gpu_seconds / 3600.0,
        attainment_offered=slo_met / offered if offered else None, scale_outs=ups, scale_ins=downs,
        burst_to_capacity_seconds=burst, lost_in_scale_in=lost, failed=int(offered - verdicts.finished.sum()),
    )  # fmt: skip


BASELINES = ("keda", "hpa")
"""The policies a ScaledObject from manifests/baselines drives."""

TUNING_SWEEPS: dict[str, tuple[float, ...]] = {
    "goodput": SWEEPS["goodput"],
    "keda": SWEEPS["keda"],
    "hpa": tuple(round(100 * value) for value in SWEEPS["hpa"]),
}
"""The fair benchmark's sweep of each policy's knob, in the unit its manifest states it: goodput's factor
on its measured envelope, waiting requests per group, GPU utilisation in percent."""


@dataclass(frozen=True, slots=True)
class Tuning:
    """One baseline's threshold, chosen on the training window by the fair benchmark's rule."""

    policy: str
    sweep: tuple[AbRow, ...]
    settings: tuple[float, ...]
    chosen: float
    met_target: bool


def tune_policies(training: SimulatedRun, target_attainment: float) -> dict[str, Tuning]:
    """Each policy's knob: the cheapest setting that met the attainment target on the training window
    in the simulator, else the best attainment (`cheapest_meeting_target`), over the fair benchmark's
    sweep (`swept`: past the grid's safe end while none met it, then bisected at the edge where
    settings stop meeting it; the HPA's percent a whole number).
    goodput is tuned only on a measured envelope (`training.goodput_envelope`); without one it runs
    on its profile as written."""
    tunings = {}
    for policy, grid in TUNING_SWEEPS.items():
        if policy == "goodput" and training.goodput_envelope is None:
            continue
        rows: dict[float, AbRow] = {}

        def on_training(
            setting: float, policy: str = policy, rows: dict[float, AbRow] = rows
        ) -> FairnessRunFigures:
            rows[setting] = _simulated_with(training, policy, setting)
            return _fair_outcome(setting, rows[setting], target_attainment)

        outcomes = swept(grid, on_training, knob=round if policy == "hpa" else float)
        chosen, met = cheapest_meeting_target(outcomes)
        settings = tuple(outcome.setting for outcome in outcomes)
        tunings[policy] = Tuning(policy, tuple(rows[s] for s in settings), settings, chosen.setting, met)
    return tunings


def _simulated_with(run: SimulatedRun, policy: str, setting: float) -> AbRow:
    (row,) = simulated_rows(replace(run, thresholds={**run.thresholds, policy: setting}), [policy])
    return row


def _fair_outcome(setting: float, row: AbRow, target_attainment: float) -> FairnessRunFigures:
    met_target = row.offered > 0 and row.slo_met / row.offered >= target_attainment
    return FairnessRunFigures(setting, row.gpu_hours, row.offered, row.offered, row.slo_met, met_target)


def render_tuning(tunings: Mapping[str, Tuning], envelope: CapacityEnvelope | str | None = None) -> str:
    """Each policy's sweep and choice; `envelope`: goodput's measured one, or why none was measured."""
    lines = ["settings chosen on the training window (simulated; the cheapest meeting the target):"]
    if isinstance(envelope, CapacityEnvelope):
        lines.append(
            f"  goodput's envelope there: {envelope.work_seconds_per_second:.4g} work-s/s per group "
            f"({envelope.requests_per_second:.3g} req/s; {envelope.groups} groups, {envelope.repeats} "
            "repeats); its setting is the factor on it"
        )
    elif envelope is not None:
        lines.append(f"  goodput: no envelope measured ({envelope}); it runs on the ModelGroup's profile")
    for tuning in tunings.values():
        tried = ", ".join(
            f"{setting:g}: {_share(row.attainment_offered)} on {row.gpu_hours:.3f} GPU-h"
            for setting, row in zip(tuning.settings, tuning.sweep, strict=True)
        )
        verdict = "met the target" if tuning.met_target else "none met the target: best attainment"
        lines.append(f"  {tuning.policy}: {tuning.chosen:g} ({verdict}); tried {tried}")
    return "\n".join(lines)


def capacity_manifests(source: Path, destination: Path, capacity_work_seconds_per_second: float) -> Path:
    """The demo's manifests with goodput's tuned capacity in the ModelGroup's
    `profile.capacityWorkSecondsPerSecond` (four significant digits, as `goodput envelope` prints it):
    every policy's run applies this one ModelGroup."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.yaml")):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for doc in documents:
            if doc.get("kind") == "ModelGroup":
                profile = doc.setdefault("spec", {}).setdefault("profile", {})
                profile["capacityWorkSecondsPerSecond"] = float(f"{capacity_work_seconds_per_second:.4g}")
        header = f"# {source / path.name} as goodput ab applies it (goodput's capacity tuned on training)\n"
        (destination / path.name).write_text(header + yaml.safe_dump_all(documents, sort_keys=False))
    return destination


def render_table(rows: Sequence[AbRow]) -> str:
    header = (
        "| policy | SLO-met req / GPU-h | attainment (offered) | SLO-met / offered | GPU-hours | "
        "scale-outs / -ins | burst to capacity | lost in scale-in | failed |"
    )
    lines = [header, "|" + "---|" * 9]
    for row in rows:
        per_hour, attainment = _rate(row.slo_met_per_gpu_hour), _share(row.attainment_offered)
        # None: no group was added after the burst began (a fleet grown before it says so, not "never").
        seconds = row.burst_to_capacity_seconds
        burst = "none added" if seconds is None else f"{seconds:.0f} s"
        lines.append(
            f"| {row.policy} | {per_hour} | {attainment} | {row.slo_met} / {row.offered} | "
            f"{row.gpu_hours:.3f} | {row.scale_outs} / {row.scale_ins} | {burst} | "
            f"{row.lost_in_scale_in} | {row.failed} |"
        )
    return "\n".join(lines)


def plot(reports: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Groups (wanted, ready) and TTFT p99 per interval over time, one row per policy, on one page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(reports), 1, figsize=(10, 3 * len(reports)), sharex=True, squeeze=False)
    for row_axes, (policy, report) in zip(axes[:, 0], reports.items(), strict=True):
        samples = report["samples"]
        offsets = [s["offset_seconds"] for s in samples]
        row_axes.step(offsets, [s["desired_groups"] for s in samples], where="post", label="wanted groups")
        row_axes.step(offsets, [s["ready_groups"] for s in samples], where="post", label="ready groups")
        row_axes.set_ylabel(f"{policy}\ngroups")
        ttft = row_axes.twinx()
        rows = [r for r in report["timeline"] if r["ttft_p99_seconds"] is not None]
        ttft.plot(
            [r["start_seconds"] for r in rows], [r["ttft_p99_seconds"] for r in rows], "r.-", label="TTFT p99"
        )
        ttft.axhline(report["scenario"]["targets"]["ttft_seconds"], color="r", linestyle=":", linewidth=0.8)
        ttft.set_ylabel("TTFT p99 (s)")
        row_axes.legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("seconds since the load started")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    demo.add_arguments(parser)
    # Counted over the offered window, so the settling after it only lets the last drains end.
    parser.set_defaults(out=Path("out/ab"), name="ab", namespace="ab", settle_seconds=30.0)
    parser.add_argument(
        "--training-start-seconds",
        type=float,
        default=600.0,
        help="where in the trace the training window starts (default 600: the window just before the "
        "demo's default test window at 840, shaped alike); the baselines' thresholds are chosen there",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, run in this order (default {','.join(POLICIES)})",
    )


def run(args: argparse.Namespace) -> int:
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown or not policies:
        print(f"goodput ab: --policies must name some of {', '.join(POLICIES)}; got {args.policies!r}")
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as cleanup:
        test_window, tunings, tuning_text = tuned_test_window(args, cleanup)
        capacity = test_window.goodput_capacity()
        manifests = args.manifests
        if capacity is not None:
            manifests = capacity_manifests(args.manifests, out / "manifests", capacity)
        cluster = _cluster(args, cleanup)
        live = LiveRuns()
        for policy in policies:
            print(f"\n=== {policy} ===", flush=True)
            run_args = argparse.Namespace(**vars(args))
            run_args.scaler, run_args.no_gateway, run_args.manifests = policy, True, manifests
            run_args.scaler_threshold = None if policy == "goodput" else test_window.thresholds.get(policy)
            run_args.namespace, run_args.out = f"{args.namespace}-{policy}", out / policy
            run_args.cluster_state_dir = cluster.state_dir
            if not live.record(policy, RUN_POLICY(run_args), out / policy):
                print("goodput ab: interrupted; the runs not yet made are left out")
                return INTERRUPTED
        simulated = simulated_rows(test_window, list(live.reports))
        write_results(out, live, simulated, tunings, tuning_text, capacity_work_seconds_per_second=capacity)
        return 0 if not live.failures else 1


def tuned_test_window(
    args: argparse.Namespace, cleanup: contextlib.ExitStack
) -> tuple[SimulatedRun, dict[str, Tuning], str]:
    """The test window with every policy's setting chosen on the training window, the sweeps, and
    their account as printed."""
    test_window = simulated_run(args, cleanup)
    training_args = argparse.Namespace(**vars(args))
    training_args.trace_start_seconds = args.training_start_seconds
    training = simulated_run(training_args, cleanup)
    envelope: CapacityEnvelope | str
    try:
        envelope = measure_training_envelope(training)
        training = replace(training, goodput_envelope=envelope)
    except (EnvelopeNotFoundError, NoFeasibleRequestsError) as error:
        envelope = str(error)
    tunings = tune_policies(training, target_attainment(test_window))
    text = render_tuning(tunings, envelope)
    print(text, flush=True)
    chosen = {name: tuning.chosen for name, tuning in tunings.items()}
    return replace(test_window, thresholds=chosen, goodput_envelope=training.goodput_envelope), tunings, text


RUN_POLICY = demo.run_reporting
"""One policy's run: (exit code, why it failed)."""


@dataclass
class LiveRuns:
    """Each policy's report, or why its run gave none."""

    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def record(self, policy: str, outcome: tuple[int, str | None], out: Path) -> bool:
        """Keep one run's outcome; False when it was interrupted (the A/B run stops there)."""
        code, reason = outcome
        if code == INTERRUPTED:
            return False
        if code == 0:
            self.reports[policy] = json.loads((out / "demo.json").read_text())
        else:
            self.failures[policy] = reason or f"exit code {code}"
            print(f"goodput ab: the {policy} run failed ({self.failures[policy]}); its files: {out}")
        return True


def write_results(
    out: Path,
    live: LiveRuns,
    simulated: Sequence[AbRow],
    tunings: Mapping[str, Tuning],
    tuning_text: str,
    *,
    capacity_work_seconds_per_second: float | None = None,
) -> None:
    """The table, the comparison, the failures and the page; `ab.json` also holds goodput's capacity
    as the ModelGroup stated it (None: the profile as written)."""
    rows = [ab_row(policy, report) for policy, report in live.reports.items()]
    sections = [tuning_text, render_table(rows), render_comparison(rows, simulated)]
    if live.failures:
        sections.append(render_failures(live.failures))
    table = "\n\n".join(sections)
    page = plot(live.reports, out / "ab.png") if live.reports else None
    document = {
        "live": [asdict(row) for row in rows],
        "simulated": [asdict(row) for row in simulated],
        "tuning": [asdict(tuning) for tuning in tunings.values()],
        "goodput_capacity_work_seconds_per_second": capacity_work_seconds_per_second,
        "failed": live.failures,
    }
    (out / "ab.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "ab.md").write_text(table + "\n")
    print(f"\n{table}\n\nwritten: {out / 'ab.md'}, {out / 'ab.json'}" + (f", {page}" if page else ""))


def render_failures(failures: Mapping[str, str]) -> str:
    lines = ["not in the table (each run's log says more):"]
    lines += [f"  {policy}: {reason}" for policy, reason in failures.items()]
    return "\n".join(lines)


def simulated_run(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> SimulatedRun:
    """The window every live run replayed, as the simulator takes it."""
    phases = demo.burst_phases(
        args.before_seconds, args.burst_seconds, args.after_seconds, args.rate_multiplier,
        args.burst_rate_multiplier,
    )  # fmt: skip
    planner = demo.Demo(args, cleanup, demo.Progress())
    workload, _ = planner.plan(phases)
    documents = {path.name: path for path in planner.objects.files}
    start = burst_start([{"name": p.name, "seconds": p.seconds} for p in phases])
    return SimulatedRun(
        model_group_path=next(path for name, path in documents.items() if name.startswith("modelgroup")),
        policy_path=next(path for name, path in documents.items() if name.startswith("slopolicy")),
        workload=workload,
        offered_seconds=sum(p.seconds for p in phases),
        burst_start_seconds=start,
        thresholds={scaler: baseline_threshold(scaler) for scaler in BASELINES},
        seed=args.seed,
    )


def target_attainment(run: SimulatedRun) -> float:
    """The SLOPolicy's attainment target of its first class (the demo's one class)."""
    return build_setup(run.model_group_path, run.policy_path).classes[0].attainment


def baseline_threshold(scaler: str) -> float:
    rendered = keda.render_baseline(
        scaler, namespace="x", model_group="x", served_name="x", prometheus_url="", min_groups=1, max_groups=1
    )
    return float(rendered["spec"]["triggers"][0]["metadata"]["threshold"])


def render_comparison(live: Sequence[AbRow], simulated: Sequence[AbRow]) -> str:
    """Live and simulated figures side by side, and the simulator's error on each policy's headline."""
    by_policy = {row.policy: row for row in simulated}
    lines = [
        "| policy | SLO-met / GPU-h live | simulated | error | attainment live | simulated | "
        "GPU-hours live | simulated |",
        "|" + "---|" * 8,
    ]
    for row in live:
        sim = by_policy.get(row.policy)
        if sim is None:
            continue
        live_rate, sim_rate = row.slo_met_per_gpu_hour, sim.slo_met_per_gpu_hour
        error = "-" if not live_rate or sim_rate is None else f"{(sim_rate - live_rate) / live_rate:+.0%}"
        lines.append(
            f"| {row.policy} | {_rate(live_rate)} | {_rate(sim_rate)} | {error} | "
            f"{_share(row.attainment_offered)} | {_share(sim.attainment_offered)} | "
            f"{row.gpu_hours:.3f} | {sim.gpu_hours:.3f} |"
        )
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _cluster(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> controlplane.LocalCluster:
    """The cluster every run shares, with KEDA: the one in --cluster-state-dir, else a fresh one that is
    stopped at the end unless --keep."""
    if args.cluster_state_dir is not None:
        cluster = controlplane.load(args.cluster_state_dir)
    else:
        state_dir = controlplane.default_state_dir(args.name)
        spec = controlplane.ClusterSpec(name=args.name, state_dir=state_dir)
        cluster = controlplane.up(spec, bin_dir=ensure_binaries())
        if not args.keep:
            cleanup.callback(controlplane.down, state_dir)
    if not keda.serving(cluster):
        keda.start(cluster)
        cleanup.callback(keda.stop, cluster)
    # One release namespace for every run: a run then only uninstalls its release, and the next one
    # never meets the namespace still terminating.
    release_namespace = args.release_namespace
    if cluster.api.get(f"/api/v1/namespaces/{release_namespace}") is None:
        cluster.kubectl("create", "namespace", release_namespace)
        delete = ("delete", "namespace", release_namespace, "--wait=false")
        cleanup.callback(cluster.kubectl, *delete, check=False)
    return cluster


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="goodput ab", description=__doc__)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
