"""No unit test sleeps to wait for behaviour: it drives a clock it was given, or waits on a condition.

A fixed sleep is a guess at how long the code under test needs: too short on a busy machine (the
test fails at random), too long everywhere else (the suite crawls). So every `time.sleep` and
`asyncio.sleep` under tests/ must be one of the kinds listed in ALLOWED, by the function that holds
it, each with its reason. `asyncio.sleep(0)` is one turn of the event loop and waits on no clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent

ALLOWED: dict[tuple[str, str], str] = {
    # The bounded polls of a condition: they wait only as long as the behaviour takes, and fail
    # with what was awaited once their timeout passes.
    ("waiting.py", "wait_until"): "bounded poll of a condition",
    ("waiting.py", "until"): "bounded poll of a condition",
    ("waiting.py", "eventually"): "bounded poll of a condition",
    ("waiting.py", "connection_once_listening"): "bounded poll of a port until it listens",
    # The fake upstream engine's time per token: the slowness it simulates (0 unless a test asks).
    ("gateway_upstream.py", "Upstream.handle"): "the simulated engine's decode time",
    ("gateway_upstream.py", "Upstream._stream"): "the simulated engine's time between tokens",
    # A slow client, the thing simulated: the gaps between the pieces it sends.
    ("test_gateway_limits.py", "trickle"): "the simulated slow client's gaps",
    # On the virtual clock (virtual_time.run_virtual): the sleep advances the loop's clock at once.
    (
        "test_gateway_limits.py",
        "test_a_kept_alive_connection_may_idle_past_the_header_timeout_and_closes_at_the_keepalive_timeout.main",
    ): "virtual clock: the client idles past the header timeout",
    (
        "test_emulator_server.py",
        "test_metrics_carry_dcgm_gpu_utilisation_for_each_gpu_of_the_rank_busy_while_it_computes.main",
    ): "virtual clock: a DCGM sample period passes",
    ("test_emulator_engine.py", "replay.main"): "virtual clock: each arrival at its time",
    ("test_gateway_calibration.py", "streamed"): "virtual clock: each arrival at its time",
    (
        "test_emulator_engine.py",
        "test_a_hang_stops_tokens_and_the_model_resumes_where_it_froze.main",
    ): "virtual clock: the engine runs, then hangs for 30 s",
    (
        "test_emulator_engine.py",
        "test_abort_all_ends_every_request_with_the_reason_and_counts_it.main",
    ): "virtual clock: the requests run a while before the abort",
}


def _is_sleep(call: ast.Call, bare_sleep: bool) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "sleep":
        return isinstance(func.value, ast.Name) and func.value.id in {"time", "asyncio"}
    return bare_sleep and isinstance(func, ast.Name) and func.id == "sleep"


def _turn_of_the_loop(call: ast.Call) -> bool:
    """`asyncio.sleep(0)`: a yield to the other tasks, not a wait on any clock."""
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "sleep"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "asyncio"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == 0
    )


def _found(node: ast.AST, scope: tuple[str, ...], bare_sleep: bool) -> list[tuple[str, int]]:
    """Every sleep call under `node`, with the qualified name of the function that holds it."""
    found: list[tuple[str, int]] = []
    for child in ast.iter_child_nodes(node):
        inner = scope
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = (*scope, child.name)
        elif isinstance(child, ast.Call) and _is_sleep(child, bare_sleep) and not _turn_of_the_loop(child):
            found.append((".".join(scope), child.lineno))
        found += _found(child, inner, bare_sleep)
    return found


def sleeps(source: str) -> list[tuple[str, int]]:
    """(enclosing function, line) of each sleep in `source` that waits on a clock."""
    tree = ast.parse(source)
    bare_sleep = any(
        isinstance(node, ast.ImportFrom)
        and node.module in {"time", "asyncio"}
        and any(alias.name == "sleep" for alias in node.names)
        for node in ast.walk(tree)
    )
    return sorted(_found(tree, (), bare_sleep), key=lambda found: found[1])


def test_no_unit_test_sleeps_outside_the_allow_list() -> None:
    found = {
        (path.name, scope, line)
        for path in sorted(TESTS.glob("*.py"))
        for scope, line in sleeps(path.read_text())
    }
    unexplained = sorted(
        f"tests/{name}:{line} in {scope or '<module>'}"
        for name, scope, line in found
        if (name, scope) not in ALLOWED
    )
    assert not unexplained, (
        "a test sleeps to wait for behaviour; drive an injected clock (virtual_time.run_virtual, a "
        "fake clock), wait on an event, or poll a condition with waiting.until / wait_until:\n"
        + "\n".join(unexplained)
    )
    stale = sorted(set(ALLOWED) - {(name, scope) for name, scope, _ in found})
    assert not stale, f"allowed sleeps that are gone (drop them from ALLOWED): {stale}"


def test_the_check_sees_each_spelling_of_a_sleep_and_lets_a_turn_of_the_loop_pass() -> None:
    source = (
        "import asyncio, time\n"
        "from time import sleep\n"
        "def a():\n    time.sleep(0.1)\n"
        "async def b():\n    await asyncio.sleep(0.05)\n    await asyncio.sleep(0)\n"
        "class C:\n    def d(self):\n        def e():\n            sleep(1)\n"
        "SLOW = 'time.sleep(60)'\n"
    )
    assert sleeps(source) == [("a", 4), ("b", 6), ("C.d.e", 11)]
