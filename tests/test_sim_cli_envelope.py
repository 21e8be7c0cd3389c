"""`goodput envelope`: a profile block that pastes into the manifest, and clear errors for an
unreadable trace or a class no request can meet."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.operator.cli import main

TRACE = "synthetic:rate=6,duration=300,burst_start=120,burst_seconds=60,burst_multiplier=2"

MODEL_GROUP = """
apiVersion: goodput.dev/v1alpha1
kind: ModelGroup
metadata: {name: llama-8b}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  engine: {image: vllm/vllm-openai:v0.33.0}
  parallelism: {tensor: 1, pipeline: 1, gpusPerPod: 1}
  minReplicas: 1
  maxReplicas: 4
  policyRef: {name: chat}
  profile: {gpu: h100-80g, readyTimeSeconds: 45, capacityWorkSecondsPerSecond: 0.001}
"""

POLICY = """
apiVersion: goodput.dev/v1alpha1
kind: SLOPolicy
metadata: {name: chat}
spec:
  revision: chat-1
  classes:
  - {name: chat, ttftSeconds: TTFT, itlSeconds: 0.1, attainment: 0.95}
"""


def write(tmp_path: Path, ttft: str) -> list[str]:
    model_group, policy = tmp_path / "mg.yaml", tmp_path / "slo.yaml"
    model_group.write_text(MODEL_GROUP)
    policy.write_text(POLICY.replace("TTFT", ttft))
    return ["--modelgroup", str(model_group), "--policy", str(policy), "--out", str(tmp_path / "out")]


FAST = ["--groups", "2", "--repeats", "1", "--capacity-trial-seconds", "120", "--no-progress"]


def test_the_profile_block_replaces_the_old_figure_and_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["envelope", "--trace", TRACE, *write(tmp_path, "1.0"), *FAST])
    assert code == 0
    printed = capsys.readouterr().out
    block = yaml.safe_load(printed)
    capacity = block["profile"]["capacityWorkSecondsPerSecond"]
    assert capacity > 0.001  # measured, not the manifest's figure
    manifest = yaml.safe_load(MODEL_GROUP)
    manifest["spec"]["profile"] = block["profile"]
    assert ModelGroup.model_validate(manifest).spec.profile is not None
    assert "95 % lower bound" in printed


@pytest.mark.parametrize("arrivals", ["steady", "trace"])
def test_the_comments_say_how_the_trials_offered_their_requests(
    arrivals: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [] if arrivals == "steady" else ["--arrivals", arrivals]
    assert main(["envelope", "--trace", TRACE, *write(tmp_path, "1.0"), *FAST, *flags]) == 0
    assert f"repeats of 120 s per rate on {arrivals} arrivals" in capsys.readouterr().out


def test_a_class_no_request_can_meet_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["envelope", "--trace", TRACE, *write(tmp_path, "0.001"), *FAST])
    assert code == 1
    assert "SLO class 'chat': none of its" in capsys.readouterr().err


def test_an_unreadable_trace_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "broken.csv"
    trace.write_bytes(b"\xff\xfe\x00garbage")
    code = main(["envelope", "--trace", str(trace), *write(tmp_path, "1.0"), *FAST])
    assert code == 2
    assert "broken.csv" in capsys.readouterr().err


def test_a_window_with_no_requests_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    window = ["--start-seconds", "5000", "--duration-seconds", "60"]
    code = main(["envelope", "--trace", TRACE, *write(tmp_path, "1.0"), *FAST, *window])
    assert code == 2
    assert "no requests in the window --start-seconds 5000 --duration-seconds 60" in capsys.readouterr().err
