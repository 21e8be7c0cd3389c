"""The request path's whole policy for one ModelGroup: admission, fairness and routing, compiled once
from the ModelGroup (prices, capacity, KV, batch limits) and its SLOPolicy (classes, gates, tenants).

The gateway compiles it when either object changes; the simulator compiles the same thing, so the
request path evaluated offline is the one deployed.

Nothing here or in the decisions it configures (`admission.admit`, `fairness.FairQueue`,
`routing.choose_group`) knows about HTTP or an event loop (the layer contracts forbid aiohttp in
`controllers/`), so other shells can serve them. An endpoint picker of the Kubernetes Gateway API
Inference Extension would be one: for each request the proxy streams over Envoy ext_proc, read its
body and headers as the gateway does (`gateway.requests`), `admit` it against the InferencePool's
groups' loads, answer a refusal at once with the same status and Retry-After, hold an admitted one
in the fair queue until a group has a slot, and reply with the endpoint `choose_group` picks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.scaling import compile_policy
from goodput.controllers.hardware import ReadConfig
from goodput.controllers.requests.adapters import AdapterPolicy
from goodput.controllers.requests.admission import AdmissionPolicy, admission_policy
from goodput.controllers.requests.degrade import MODEL_FAMILY_LABEL
from goodput.controllers.requests.fairness import FairnessPolicy, fairness_policy
from goodput.controllers.requests.routing import RoutingPolicy
from goodput.controllers.requests.tool_waits import ToolWaitPolicy
from goodput.estimators.feasibility import FloorModel

# vLLM's context when `--max-model-len` is not set is the model's own; Llama 3.1 has 128k, but
# engines are usually run shorter. Without the flag the gateway assumes this, and says so.
DEFAULT_CONTEXT_TOKENS = 8192
_MAX_MODEL_LEN = re.compile(r"^--max[-_]model[-_]len(?:=|\s+)(\d+)$")


@dataclass(frozen=True, slots=True)
class RequestPathPolicy:
    """Everything the request path obeys for one ModelGroup.

    capacity_work_seconds_per_second: C of one group at the reference mix (its SLO envelope).
    max_in_flight_per_group: requests the gateway keeps running on one group (vLLM's max_num_seqs):
    the rest wait in the gateway's fair queue, where fairness and deadlines order them.
    """

    model_group: str
    served_model: str
    policy_revision: str
    admission: AdmissionPolicy
    fairness: FairnessPolicy
    routing: RoutingPolicy
    capacity_work_seconds_per_second: float
    kv_capacity_tokens: int
    max_in_flight_per_group: int
    default_tenant: str
    tenant_tokens_per_minute: dict[str, int]
    listed_tenants: frozenset[str]
    model_revision: str = ""  # the weights' revision, named in every answer's X-Goodput-Served-By
    model_family: str | None = None  # label goodput.dev/model-family: which fallbacks are approved
    optional_context_classes: frozenset[str] = frozenset()  # classes whose ladder may drop marked context
    adapters: AdapterPolicy = field(default_factory=AdapterPolicy)
    """The ModelGroup's LoRA adapters, served under their own names by the same groups."""
    tool_waits: ToolWaitPolicy = field(default_factory=ToolWaitPolicy)
    """What the KV of a session waiting on a tool is left to; offload only with the ModelGroup's
    `kvOffload`."""


def context_tokens(model_group: ModelGroup) -> int:
    """`--max-model-len` from the engine's arguments, else DEFAULT_CONTEXT_TOKENS."""
    args = model_group.spec.engine.args
    for index, arg in enumerate(args):
        match = _MAX_MODEL_LEN.match(arg)
        if match:
            return int(match.group(1))
        if (
            arg in ("--max-model-len", "--max_model_len")
            and index + 1 < len(args)
            and args[index + 1].isdigit()
        ):
            return int(args[index + 1])
    return DEFAULT_CONTEXT_TOKENS


def compile_request_path(
    model_group: ModelGroup, slo: SloPolicy, *, route_seconds: float = 0.001, referenced: ReadConfig = None
) -> RequestPathPolicy | str:
    """The request-path policy, or why the pair cannot be served (the same reasons the autoscaler
    refuses it: a gateway cannot price requests it cannot price). `referenced`: the config.json of
    `profile.modelConfigRef`, for a caller that read it."""
    spec = model_group.spec
    compiled = compile_policy(model_group, slo, referenced=referenced)
    if isinstance(compiled, str):
        return compiled
    profile = compiled.profile
    floor = FloorModel(profile.step_model, profile.max_num_batched_tokens, route_seconds=route_seconds)
    admission = admission_policy(slo.spec, floor, profile.pricing, context_tokens(model_group))
    capacity = profile.capacity_per_group(profile.reference_input_tokens, profile.reference_output_tokens)
    fairness = slo.spec.fairness
    return RequestPathPolicy(
        model_group=model_group.metadata.name or "",
        served_model=spec.model.served_name or spec.model.name,
        policy_revision=slo.spec.revision,
        admission=admission,
        fairness=fairness_policy(fairness),
        routing=RoutingPolicy(),
        capacity_work_seconds_per_second=capacity,
        kv_capacity_tokens=profile.kv_capacity_tokens,
        max_in_flight_per_group=profile.max_num_seqs,
        default_tenant=fairness.default_tenant,
        tenant_tokens_per_minute={
            tenant.name: tenant.tokens_per_minute
            for tenant in fairness.tenants
            if tenant.tokens_per_minute is not None
        },
        listed_tenants=frozenset(tenant.name for tenant in fairness.tenants),
        model_revision=spec.model.revision,
        model_family=(model_group.metadata.labels or {}).get(MODEL_FAMILY_LABEL),
        optional_context_classes=frozenset(
            cls.name for cls in slo.spec.classes if cls.degrade and "DropOptionalContext" in cls.degrade.rungs
        ),
        adapters=AdapterPolicy(
            sources={adapter.name: adapter.source for adapter in spec.adapters},
            max_loaded_per_group=spec.adapter_limits.max_loaded_per_group,
        ),
        tool_waits=ToolWaitPolicy(
            offload_cpu_bytes=None if spec.kv_offload is None else int(spec.kv_offload.cpu_size_gib * 2**30)
        ),
    )
