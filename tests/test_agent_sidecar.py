"""The agent injected into every rank: a native sidecar with the only API token in the pod, told
who it is through the downward API; absent when the ModelGroup does not ask for its checks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.api import labels
from goodput.api.modelgroup import ModelGroup
from goodput.controllers import naming
from goodput.controllers.groups import agent_sidecar
from goodput.controllers.groups.pods import GroupTemplate, render_group
from goodput.controllers.groups.template import group_template

IMAGE = "ghcr.io/goodput/agent:0.1.0"
SINGLE = GroupTemplate(
    model_group="llama-8b",
    namespace="serving",
    uid="uid",
    model="meta-llama/Llama-3.1-8B-Instruct",
    model_revision="main",
    served_name=None,
    image="vllm/vllm-openai:v0.33.0",
    args=(),
    env=(),
    requests=(),
    limits=(),
    port=8000,
    startup_timeout_seconds=600,
    shutdown_timeout_seconds=30,
    tensor_parallel=2,
    pipeline_parallel=1,
    gpus_per_pod=2,
    topology_key="nvidia.com/gpu.clique",
    placement_mode="Required",
    agent=agent_sidecar.AgentSidecar(IMAGE),
)
MULTI = replace(SINGLE, tensor_parallel=8, pipeline_parallel=2, gpus_per_pod=8)


def agent_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [
        c for c in pod["spec"]["initContainers"] if c["name"] == agent_sidecar.AGENT_CONTAINER_NAME
    ]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


@pytest.mark.parametrize("template", [SINGLE, MULTI], ids=["one pod", "two pods"])
def test_every_rank_runs_the_agent_as_a_native_sidecar_with_the_only_token(template: GroupTemplate) -> None:
    for pod in render_group(template, "g0", "a").pods:
        spec = pod["spec"]
        agent = agent_of(pod)
        token_mounts = [
            (container["name"], mount["name"])
            for container in [*spec["initContainers"], *spec["containers"]]
            for mount in container.get("volumeMounts", ())
            if mount["mountPath"] == agent_sidecar.TOKEN_PATH
        ]

        assert agent["restartPolicy"] == "Always" and agent["image"] == IMAGE
        assert spec["automountServiceAccountToken"] is False
        assert spec["serviceAccountName"] == agent_sidecar.SERVICE_ACCOUNT
        assert token_mounts == [(agent_sidecar.AGENT_CONTAINER_NAME, agent_sidecar.TOKEN_VOLUME)]
        volume = next(v for v in spec["volumes"] if v["name"] == agent_sidecar.TOKEN_VOLUME)
        assert {"serviceAccountToken"} <= {key for source in volume["projected"]["sources"] for key in source}
        assert "nvidia.com/gpu" not in str(agent["resources"])  # the GPUs are the engine's


def test_the_agent_learns_its_identity_from_the_downward_api() -> None:
    leader, follower = (env_of(agent_of(pod)) for pod in render_group(MULTI, "g3", "a").pods)
    service = f"{naming.service_name('llama-8b', 'g3')}.serving.svc"

    assert leader["GOODPUT_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert leader["GOODPUT_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert leader["GOODPUT_RANK"] == {"fieldRef": {"fieldPath": f"metadata.labels['{labels.LABEL_RANK}']"}}
    assert leader["GOODPUT_LEADER_ADDRESS"] == follower["GOODPUT_LEADER_ADDRESS"] == service
    assert (leader["GOODPUT_GROUP_SIZE"], leader["GOODPUT_GPUS_PER_POD"]) == ("2", "8")
    assert leader["GOODPUT_ENGINE_URL"] == "http://127.0.0.1:8000"
    assert follower["GOODPUT_ENGINE_URL"] == f"http://{service}:8000"
    assert leader["GOODPUT_MODEL_REVISION"] == "main"
    single = env_of(agent_of(render_group(SINGLE, "g0", "a").pods[0]))
    assert single["GOODPUT_LEADER_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_the_engine_waits_for_the_first_nccl_check() -> None:
    agent = agent_of(render_group(SINGLE, "g0", "a").pods[0])
    probe = agent["startupProbe"]

    assert probe["exec"]["command"] == ["test", "-e", agent_sidecar.CHECKED_FILE]
    assert env_of(agent)["GOODPUT_AGENT_CHECKED_FILE"] == agent_sidecar.CHECKED_FILE
    assert probe["periodSeconds"] * probe["failureThreshold"] > agent_sidecar.NCCL_TIMEOUT_SECONDS


def test_without_the_agent_the_pod_is_as_before() -> None:
    bare = replace(SINGLE, agent=None)
    pod = render_group(bare, "g0", "a").pods[0]

    assert "initContainers" not in pod["spec"] and "serviceAccountName" not in pod["spec"]
    assert bare.revision != SINGLE.revision


SAMPLE = Path(__file__).resolve().parent.parent / "manifests" / "samples" / "modelgroup-llama-8b-tp1.yaml"


def model_group(nccl_check: str) -> ModelGroup:
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"].update(namespace="serving", uid="u")
    body["spec"].setdefault("readiness", {})["ncclCheck"] = nccl_check
    return ModelGroup.model_validate(body)


@pytest.mark.parametrize(
    ("nccl_check", "image", "injected"),
    [("Required", IMAGE, True), ("Skip", IMAGE, False), ("Required", "", False)],
    ids=["asked for, image set", "checks skipped", "no agent image"],
)
def test_the_agent_is_injected_when_the_model_group_asks_and_the_operator_has_an_image(
    nccl_check: str, image: str, injected: bool
) -> None:
    template = group_template(model_group(nccl_check), image)

    assert (template.agent is not None) is injected


@pytest.mark.parametrize("template", [SINGLE, MULTI], ids=["one pod", "two pods"])
def test_the_agent_runs_unprivileged_on_a_read_only_root_writing_only_to_its_volumes(
    template: GroupTemplate,
) -> None:
    for pod in render_group(template, "g0", "a").pods:
        agent = agent_of(pod)
        context = agent["securityContext"]
        mounted = {mount["mountPath"]: mount for mount in agent["volumeMounts"]}
        volumes = {volume["name"] for volume in pod["spec"]["volumes"]}
        env = env_of(agent)

        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        # Every place the agent writes is a mounted volume, not the read-only root.
        for written in (str(agent_sidecar.CHECKED_FILE).rsplit("/", 1)[0], env["HOME"]):
            assert written in mounted and not mounted[written].get("readOnly")
            assert mounted[written]["name"] in volumes
        assert env["USER"]  # getpass.getuser() needs it without a passwd entry for the run user
