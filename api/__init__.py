"""goodput.api: the goodput.dev/v1alpha1 resources as pydantic models, and the CRDs rendered from them.

Modules: `modelgroup` and `slopolicy` (the two kinds), `conditions` (metav1.Condition and
`set_condition`), `reasons` (the vocabulary of condition types, reasons, signals and Events),
`labels` (well-known labels), `base` (shared building blocks), `crd` (rendering to CRD YAML).
"""

from goodput.api.base import API_VERSION, GROUP, VERSION, CelRule, wire_dict
from goodput.api.conditions import Condition, find_condition, set_condition
from goodput.api.modelgroup import ModelGroup, ModelGroupSpec, ModelGroupStatus, ScalingDecision
from goodput.api.slopolicy import SloPolicy, SloPolicySpec, SloPolicyStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "CelRule",
    "Condition",
    "ModelGroup",
    "ModelGroupSpec",
    "ModelGroupStatus",
    "ScalingDecision",
    "SloPolicy",
    "SloPolicySpec",
    "SloPolicyStatus",
    "find_condition",
    "set_condition",
    "wire_dict",
]
