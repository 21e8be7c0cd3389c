"""Session budgets on agentic traffic: completed sessions within their SLO per GPU-hour, on a fixed
fleet at twice its capacity, with the class's session budget and without it.

Run: .venv/bin/python bench/bench_agentic_sessions.py [--seconds 600] [--groups 4] [--load 2] [--seed 1]
     [--mean-steps 4]

The fleet and the request path are `goodput simulate`'s (`simulator.simulation` with a
`RequestPathPolicy` compiled from the sample ModelGroup `modelgroup-llama-8b-tp1.yaml`, Llama-3.1-8B
on one H100 per group, and the sample SLOPolicy `slopolicy-agents.yaml`, whose `agent` class has TTFT
5 s, ITL 100 ms, E2E 300 s and a session budget of 200,000 tokens, 64 branches and 120 s) on a fixed
number of ready groups. The workload is `simulator.agentic`'s sessions, every one of class `agent`,
their rate set so that the offered work is `--load` times what the fleet serves at the SLO (its
groups times the request path's capacity C, over the mean work of a session's requests). Children
are sent when their parent is answered (after their tool wait), and not at all when it was not.

Arms: the policy as it is (a root opens a session, every child is admitted against what it has left,
`simulator.session_desk`) and the same policy with the class's `sessionBudget` removed (children
admitted one by one as independent requests). A session completes within its SLO when every one of
its requests was answered within the class's targets and its last answer came within the budget's
wall-clock seconds of its root's arrival (`agentic.sessions_within_slo`), in both arms. The fluid
bound is the most sessions any schedule could complete: the cheapest sessions first, in the work the
fleet serves saturated (measured on a run at four times the nominal rate) over the window plus one
wall-clock budget (a session completed within its SLO ended by then). Nothing is asserted; the
figures are printed.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.requests.sessions import SessionRefusal
from goodput.simulator.agentic import AgenticSpec, agentic_sessions, sessions_within_slo
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.gateway import GatewayTreatment
from goodput.simulator.gateway_bench import run_fixed_fleet
from goodput.simulator.records import RequestExit
from goodput.simulator.report import judge
from goodput.simulator.runner import request_path_for
from goodput.simulator.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"
CLASS = "agent"


def without_budgets(policy: RequestPathPolicy) -> RequestPathPolicy:
    """The same request path with no class keeping sessions: every child admitted on its own."""
    classes = {name: replace(c, session_limits=None) for name, c in policy.admission.classes.items()}
    return replace(policy, admission=replace(policy.admission, classes=classes))


def work_by_session(policy: RequestPathPolicy, workload: Workload) -> np.ndarray:
    """Each session's work: the request path's price of all its requests."""
    assert workload.session_index is not None
    pricing = policy.admission.pricing
    work = [
        pricing.prefill_work_seconds(p) + pricing.decode_work_seconds(p, o)
        for p, o in zip(workload.input_tokens.tolist(), workload.output_tokens.tolist(), strict=True)
    ]
    return np.bincount(workload.session_index, weights=np.asarray(work))


def fluid_bound_sessions(session_work: np.ndarray, work_seconds: float) -> int:
    """The most sessions any schedule completes with `work_seconds` of service: the cheapest first."""
    return int(np.searchsorted(np.cumsum(np.sort(session_work)), work_seconds, side="right"))


def in_policy_classes(workload: Workload, setup: SimulationSetup) -> Workload:
    """The trace's requests labelled with the SLOPolicy's class list, in its order."""
    names = tuple(c.name for c in setup.classes)
    return replace(
        workload, class_index=np.full(len(workload), names.index(CLASS), np.int64), class_names=names
    )


def run_arm(
    name: str, setup: SimulationSetup, policy: RequestPathPolicy, workload: Workload, args: argparse.Namespace
) -> float:
    started = time.perf_counter()
    result = run_fixed_fleet(
        setup, workload, args.groups, policy, horizon_seconds=args.seconds, seed=args.seed
    )
    met = judge(result, setup.classes).met
    limits = request_path_for(setup).admission.classes[CLASS].session_limits
    wall = limits.wall_clock_seconds if limits is not None else None
    completed = sessions_within_slo(workload, met, result.requests["finished_at"], wall)
    gpu_hours = result.gpu_seconds / 3600.0
    outcome, admission = result.requests["outcome"], result.requests["admission"]
    per_gpu_hour = completed.sum() / gpu_hours
    roots = workload.parent_index < 0 if workload.parent_index is not None else np.zeros(0, bool)
    assert workload.session_index is not None
    root_answered = np.zeros(completed.size, bool)
    root_answered[workload.session_index[roots]] = outcome[roots] == RequestExit.FINISHED
    broken = int((root_answered & ~completed).sum())
    reason = result.requests["admission_reason"]
    capped = int((admission == GatewayTreatment.DEGRADED).sum())
    by_session = {code.value: int((reason == code.value).sum()) for code in SessionRefusal}
    session_refused = ", ".join(f"{code} {count}" for code, count in by_session.items() if count) or "none"
    print(
        f"  {name:18s} sessions within SLO {int(completed.sum()):5d} of {completed.size} "
        f"({completed.mean():6.1%})  {per_gpu_hour:7.1f} per GPU-hour  requests: met {int(met.sum())}, "
        f"refused {int((outcome == RequestExit.REJECTED_ADMISSION).sum())}, "
        f"of them by the session: {session_refused}; capped {capped}, "
        f"not sent {int((outcome == RequestExit.NOT_SENT).sum())}; sessions whose root was answered but "
        f"that failed: {broken}  ({time.perf_counter() - started:.0f}s wall)"
    )
    return float(per_gpu_hour)


def served_work_per_second(
    setup: SimulationSetup, policy: RequestPathPolicy, workload: Workload, args: argparse.Namespace
) -> float:
    """The fleet's measured capacity on this workload: the work (the request path's price) of the
    requests it answered inside the offered window, per second, on a run that keeps it saturated."""
    result = run_fixed_fleet(
        setup, workload, args.groups, policy, horizon_seconds=args.seconds, seed=args.seed
    )
    done = (result.requests["outcome"] == RequestExit.FINISHED) & (
        result.requests["finished_at"] <= args.seconds
    )
    pricing = policy.admission.pricing
    served = result.requests.get("served_output_tokens", workload.output_tokens)
    work = sum(
        pricing.prefill_work_seconds(int(p)) + pricing.decode_work_seconds(int(p), int(o))
        for p, o in zip(workload.input_tokens[done].tolist(), served[done].tolist(), strict=True)
    )
    return float(work) / float(args.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--load", type=float, default=2.0, help="offered work over the fleet's capacity")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mean-steps", type=float, default=4.0, help="agent steps a session (mean)")
    parser.add_argument("--step-noise", type=float, default=0.04, help="σ of the engine step noise")
    args = parser.parse_args()
    setup = build_setup(
        SAMPLES / "modelgroup-llama-8b-tp1.yaml",
        SAMPLES / "slopolicy-agents.yaml",
        step_noise_sigma=args.step_noise,
    )
    policy = request_path_for(setup)
    probe = agentic_sessions(
        AgenticSpec(duration_seconds=args.seconds, sessions_per_second=1.0, mean_steps=args.mean_steps),
        args.seed,
    )
    work = float(work_by_session(policy, probe.workload).mean())
    nominal = args.groups * policy.capacity_work_seconds_per_second / work
    saturating = agentic_sessions(
        AgenticSpec(
            duration_seconds=args.seconds, sessions_per_second=4 * nominal, mean_steps=args.mean_steps
        ),
        args.seed + 1,
    )
    served = served_work_per_second(
        setup, without_budgets(policy), in_policy_classes(saturating.workload, setup), args
    )
    capacity = served / work
    spec = AgenticSpec(
        duration_seconds=args.seconds, sessions_per_second=args.load * capacity, mean_steps=args.mean_steps
    )
    workload = in_policy_classes(agentic_sessions(spec, args.seed).workload, setup)
    nominal_work = args.groups * policy.capacity_work_seconds_per_second
    print(
        f"{args.groups} groups ({args.groups} GPUs); a session's mean work {work:.2f} work-s; the fleet "
        f"served {served:.2f} work-s/s saturated (C x groups: {nominal_work:.2f}): capacity "
        f"{capacity:.3f} sessions/s"
    )
    print(f"  offered x{args.load:g}: {workload.notes[0]}")
    gpu_hours = args.groups * args.seconds / 3600.0
    limits = policy.admission.classes[CLASS].session_limits
    wall = limits.wall_clock_seconds if limits is not None and limits.wall_clock_seconds else 0.0
    bound = fluid_bound_sessions(work_by_session(policy, workload), served * (args.seconds + wall))
    print(
        f"  fluid bound: {bound} sessions ({bound / gpu_hours:.1f} per GPU-hour): the cheapest sessions "
        f"first, in the work the fleet serves saturated over {args.seconds + wall:g} s (the window and "
        "one wall-clock budget)"
    )
    with_budgets = run_arm("with budgets", setup, policy, workload, args)
    independent = run_arm("without budgets", setup, without_budgets(policy), workload, args)
    ratio = with_budgets / max(independent, 1e-9)
    print(f"  sessions within SLO per GPU-hour, with budgets / without: {ratio:.2f}x (goal >= 1.5x)")
    headroom = bound / gpu_hours / max(independent, 1e-9)
    print(f"  the fluid bound / without budgets: {headroom:.2f}x (what any admission could reach at most)")


if __name__ == "__main__":
    main()
