"""The demo's other models: ModelGroups served by the same gateway beside the demo's own.

`manifests/demo/second-model/` holds them (one group each, bound to the demo's SLOPolicy). The
gateway serves every ModelGroup of the demo's namespace and routes each request by its `model`;
while the trace and its burst go to the demo's ModelGroup, `ModelProbe` sends each other model a
steady trickle of requests through the same gateway and counts what came back: every answer from
the model asked for, served by that ModelGroup's own groups, whatever the burst next door does.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from goodput.api.modelgroup import ModelGroup

OTHER_MODELS_DIR = "second-model"
PROBE_INTERVAL_SECONDS = 2.0
PROBE_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class OtherModel:
    """A ModelGroup the gateway serves beside the demo's own."""

    model_group: str
    served_name: str
    path: Path


def read_other_models(directory: Path) -> tuple[OtherModel, ...]:
    """The ModelGroups of `directory`/second-model (none when it is absent), validated by the API
    models, each with the file that holds it."""
    found = []
    for path in sorted((directory / OTHER_MODELS_DIR).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "ModelGroup":
                continue
            model_group = ModelGroup.model_validate(doc)
            spec = model_group.spec.model
            found.append(OtherModel(str(model_group.metadata.name), spec.served_name or spec.name, path))
    return tuple(found)


@dataclass
class ProbeCount:
    """What one model's requests got: answers by status, the groups that served them, and answers
    that named another model (which routing by model must never give)."""

    statuses: dict[int, int] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)
    wrong_model: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "statuses": {str(status): count for status, count in sorted(self.statuses.items())},
            "groups": sorted(self.groups),
            "wrong_model": self.wrong_model,
        }


@dataclass
class ModelProbe:
    """A request to each other model every `interval_seconds`, through the gateway, until stopped."""

    url: str
    models: tuple[OtherModel, ...]
    tenant: str
    interval_seconds: float = PROBE_INTERVAL_SECONDS
    counts: dict[str, ProbeCount] = field(default_factory=dict)
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.counts = {model.served_name: ProbeCount() for model in self.models}
        self.thread = threading.Thread(target=self._loop, name="demo-model-probe", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=PROBE_TIMEOUT_SECONDS + 5)

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_seconds):
            for model in self.models:
                self._send(model.served_name)

    def _send(self, served_name: str) -> None:
        body = json.dumps({"model": served_name, "prompt": "The capital of France is", "max_tokens": 16})
        headers = {"Content-Type": "application/json", "X-Goodput-Tenant": self.tenant}
        request = urllib.request.Request(self.url + "/v1/completions", body.encode(), headers, method="POST")
        count = self.counts[served_name]
        try:
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_SECONDS) as reply:
                status, group, answer = reply.status, reply.headers.get("X-Goodput-Group"), reply.read()
        except urllib.error.HTTPError as error:
            status, group, answer = error.code, None, b""
        except OSError:
            status, group, answer = 0, None, b""  # no answer: counted as status 0
        count.statuses[status] = count.statuses.get(status, 0) + 1
        if group:
            count.groups.add(group)
        if status == 200 and json.loads(answer).get("model") != served_name:
            count.wrong_model += 1

    def report(self) -> dict[str, dict[str, Any]]:
        return {model: count.as_dict() for model, count in self.counts.items()}


def render_other_models(models: tuple[OtherModel, ...], report: dict[str, dict[str, Any]]) -> str:
    lines = ["other models behind the same gateway (a request every few seconds each):"]
    for model in models:
        seen = report.get(model.served_name) or {}
        statuses = ", ".join(f"{status}: {count}" for status, count in (seen.get("statuses") or {}).items())
        lines.append(
            f"  {model.served_name} (ModelGroup {model.model_group}): answers by status {{{statuses}}}, "
            f"served by {', '.join(seen.get('groups') or ()) or 'no group'}; "
            f"answers from another model: {seen.get('wrong_model', 0)}"
        )
    return "\n".join(lines)
