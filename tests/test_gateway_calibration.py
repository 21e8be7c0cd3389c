"""The deadline gate learns how far its TTFT prediction runs short (goodput.gateway with
controllers.requests.calibration): engines slower to their first token than the gateway's figures
say, under an overload, on a virtual clock (tests/virtual_time.py) over real HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import aiohttp
from test_gateway import MODEL, completion, request_path_policy, rig, sample
from virtual_time import run_virtual

from goodput.controllers.requests.calibration import TtftCalibration, TtftCalibrationSettings
from goodput.gateway.groups import StaticGroupSource
from goodput.gateway.server import Gateway, TenantCorrection

TTFT_TARGET_SECONDS = 1.0  # the sample policy's chat class
ATTAINMENT = 0.9
# Each request (3 prompt tokens, 4 out) at the policy's figures: a quarter of a second of one group's
# time, so its two slots serve four a second.
CLAIMED_REQUESTS_PER_SECOND = 4.0
# The engine truly takes 0.7 s to its first token and 0.8 s in all: 2.5 requests a second.
FIRST_TOKEN_DELAY_SECONDS, TOKEN_DELAY_SECONDS = 0.7, 0.025
OFFERED_PER_SECOND, OFFERED_SECONDS = 6.0, 40.0
# Long enough for the first misses to come back as first tokens (each a second or more after its
# request) and the correction worked out from them to have cleared the queue they joined.
MEASURING_SECONDS = 12.0


@dataclass
class Seen:
    sent_at: float  # seconds after the first request
    status: int
    reason: str
    message: str
    ttft_seconds: float | None


@dataclass
class Run:
    seen: list[Seen]
    correction: float

    @property
    def admitted(self) -> list[Seen]:
        return [one for one in self.seen if one.status == 200]

    def attainment(self, sent_after: float = 0.0) -> float:
        """Of the admitted requests sent after `sent_after`, the fraction whose TTFT met the target."""
        admitted = [one for one in self.admitted if one.sent_at >= sent_after]
        met = [
            one
            for one in admitted
            if one.ttft_seconds is not None and one.ttft_seconds <= TTFT_TARGET_SECONDS
        ]
        return len(met) / len(admitted)


async def streamed(session: aiohttp.ClientSession, url: str, start: float, after: float) -> Seen:
    """One streamed request sent `after` seconds after `start`, timed to its first token."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + after - loop.time()))
    sent = loop.time()
    async with session.post(url + "/v1/completions", json=completion(stream=True)) as answer:
        if answer.status != 200:
            error = (await answer.json())["error"]
            reason = answer.headers.get("X-Goodput-Reason", "")
            return Seen(after, answer.status, reason, error["message"], None)
        first: float | None = None
        async for chunk in answer.content.iter_any():
            if first is None and b"data: " in chunk:
                first = loop.time() - sent
        return Seen(after, 200, answer.headers["X-Goodput-Reason"], "", first)


def overload(settings: TtftCalibrationSettings) -> Run:
    """Offer three times what the engine truly serves, streamed, to a gateway whose correction is
    measured under `settings`."""
    base = request_path_policy(max_num_seqs=2)
    pricing = base.admission.pricing
    work = pricing.prefill_work_seconds(3) + pricing.decode_work_seconds(3, 4)
    policy = dataclasses.replace(base, capacity_work_seconds_per_second=work * CLAIMED_REQUESTS_PER_SECOND)

    async def main() -> Run:
        loop = asyncio.get_running_loop()
        async with rig(
            policy,
            clock=loop.time,
            tokens=4,
            token_delay_seconds=TOKEN_DELAY_SECONDS,
            first_token_delay_seconds=FIRST_TOKEN_DELAY_SECONDS,
        ) as r:
            r.gateway.calibration_settings = settings
            start = loop.time() + 0.1
            count = int(OFFERED_PER_SECOND * OFFERED_SECONDS)
            seen = await asyncio.gather(
                *(streamed(r.session, r.url, start, index / OFFERED_PER_SECOND) for index in range(count))
            )
            r.gateway.publish_gauges()
            correction = sample(
                r.gateway, "goodput_gateway_ttft_prediction_correction", model_group=MODEL, tenant="default"
            )
            return Run(list(seen), correction)

    return run_virtual(main)


def test_engines_slower_than_the_figures_the_calibrated_gate_admits_fewer_and_they_meet_the_target() -> None:
    uncorrected = overload(TtftCalibrationSettings(max_ttft_correction=1.0))
    calibrated = overload(TtftCalibrationSettings())
    print(
        f"uncorrected: {len(uncorrected.admitted)} admitted, attainment {uncorrected.attainment():.3f} "
        f"({uncorrected.attainment(MEASURING_SECONDS):.3f} after {MEASURING_SECONDS:g}s); "
        f"calibrated: {len(calibrated.admitted)} admitted, attainment {calibrated.attainment():.3f} "
        f"({calibrated.attainment(MEASURING_SECONDS):.3f}), correction {calibrated.correction:.2f}"
    )
    # As the gate's figures stand, it admits requests that then miss, however long it runs.
    assert uncorrected.correction == 1.0
    assert uncorrected.attainment() < ATTAINMENT
    assert uncorrected.attainment(MEASURING_SECONDS) < ATTAINMENT
    # Corrected by the error it measured, it admits fewer, and once it has measured, those it admits
    # meet the target (while it measures, it admits as the figures say).
    assert calibrated.correction > 1.0
    assert len(calibrated.admitted) < len(uncorrected.admitted)
    assert calibrated.attainment(MEASURING_SECONDS) >= ATTAINMENT
    assert calibrated.attainment() > uncorrected.attainment()
    refused = [one for one in calibrated.seen if one.status == 429]
    assert refused and all(one.reason == "Deadline" for one in refused)
    assert any("corrected x" in one.message for one in refused)


def test_a_new_capacity_figure_starts_the_measurement_again_and_other_changes_keep_it() -> None:
    """The error measured was of predictions from the old figures: a new capacity starts afresh."""
    policy = request_path_policy()
    gateway = Gateway(policy, StaticGroupSource([]), clock=lambda: 100.0)
    measured = TtftCalibration()
    for index in range(20):  # every one admitted near the edge, and late
        measured = measured.observed(0.9, 1.0, 1.5, 90.0 + index * 0.1)
    gateway.corrections["a"] = TenantCorrection(measured)
    assert gateway.ttft_correction("a", 100.0) == 4.0
    assert gateway.ttft_correction("b", 100.0) == 1.0  # each tenant its own
    gateway.update_policy(dataclasses.replace(policy, max_in_flight_per_group=8))
    assert gateway.ttft_correction("a", 100.0) == 4.0
    faster = policy.capacity_work_seconds_per_second * 2
    gateway.update_policy(dataclasses.replace(policy, capacity_work_seconds_per_second=faster))
    assert gateway.corrections == {}
    assert gateway.ttft_correction("a", 100.0) == 1.0
