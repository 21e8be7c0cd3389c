"""Building blocks shared by every goodput.dev resource model.

The pydantic models are the single source of the API: the operator parses objects with them and
`goodput.api.crd` renders the CRD schemas from them. So a field's docstring becomes its
`kubectl explain` text, its pydantic constraints become OpenAPI constraints, and each `CelRule` on a
model becomes an `x-kubernetes-validations` entry that the API server enforces. A rule that needs
only the object itself also carries a Python twin (`check`), so a spec that slipped past the API
server (an old CRD, a hand-made test object) fails the same way inside the operator.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainSerializer, WithJsonSchema, model_validator

from goodput.api.times import rfc3339_seconds

GROUP: Final = "goodput.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# A DNS-1123 subdomain: the names of Kubernetes objects a spec refers to.
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A DNS-1123 label: names that end up in object names or label values (groups, classes, tenants).
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A label or annotation key: optional DNS-subdomain prefix and a name (as in Kubernetes validation).
LABEL_KEY_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A Kubernetes resource quantity such as '4', '500m', '32Gi' or '1e3'.
QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
"""The media type of a strategic merge patch, which the operator and the health agent both send."""


def wire_name(python_name: str) -> str:
    """camelCase wire name of a snake_case attribute: `e2e_seconds` -> `e2eSeconds`, `kv_cache` -> `kvCache`.

    Unlike pydantic's `to_camel`, a digit does not start a new word, so `e2e_seconds` does not
    become `e2ESeconds`.
    """
    first, *rest = python_name.split("_")
    return first + "".join(word[:1].upper() + word[1:] for word in rest)


def wire_to_python(model: type[BaseModel], wire: str) -> str:
    """The attribute name of a model's field given its wire name."""
    return next(name for name, field in model.model_fields.items() if (field.alias or name) == wire)


@dataclass(frozen=True, slots=True)
class CelRule:
    """One `x-kubernetes-validations` rule of a model, and its Python twin when it has one.

    rule: the CEL expression, evaluated with `self` bound to the object of the model.
    message: the API server's error text, in API-convention style (names the field, says what to do).
    field_path: where the API server reports the error, relative to the object (`.gpusPerPod`).
    check: the same rule in Python on the parsed model; None for transition rules (they need
        `oldSelf`, which only the API server has).
    optional_old_self: evaluate the rule on create too, with `oldSelf` an optional (a transition
        rule that must also hold for new objects).
    """

    rule: str
    message: str
    field_path: str | None = None
    check: Callable[[Any], bool] | None = None
    optional_old_self: bool = False

    def to_openapi(self) -> dict[str, Any]:
        rendered: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            rendered["fieldPath"] = self.field_path
        if self.optional_old_self:
            rendered["optionalOldSelf"] = True
        return rendered


def _add_cel_rules(schema: dict[str, Any], model: type) -> None:
    """json_schema_extra hook: attach the model's CEL rules to its JSON schema."""
    rules: tuple[CelRule, ...] = getattr(model, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_openapi() for rule in rules]


class _RuleCheckedModel(BaseModel):
    # Inherited and merged by pydantic into every subclass's own model_config.
    model_config = ConfigDict(
        frozen=True,
        alias_generator=wire_name,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        json_schema_extra=_add_cel_rules,
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_twins(self) -> Self:
        failed = [
            rule.message for rule in type(self).cel_rules if rule.check is not None and not rule.check(self)
        ]
        failed += self._duplicate_list_map_keys()
        if failed:
            raise ValueError("; ".join(failed))
        return self

    def _duplicate_list_map_keys(self) -> list[str]:
        """The API server's uniqueness check of list-map keys (as for `classes` by `name`), in Python."""
        problems = []
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra
            marker = extra.get("x-kubernetes-list-map-keys") if isinstance(extra, dict) else None
            if not isinstance(marker, list):
                continue
            keys = [str(wire) for wire in marker]
            seen: set[tuple[Any, ...]] = set()
            for item in getattr(self, name):
                key = tuple(getattr(item, wire_to_python(type(item), wire)) for wire in keys)
                if key in seen:
                    names = " and ".join(f"`{wire}`" for wire in keys)
                    values = ", ".join(repr(value) for value in key)
                    problems.append(
                        f"`{field.alias}` must not hold two items with the same {names}: {values}"
                    )
                seen.add(key)
        return problems


class SpecModel(_RuleCheckedModel):
    """Base of everything a user writes: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid")


class StatusModel(_RuleCheckedModel):
    """Base of everything the operator writes.

    Unknown fields are ignored rather than rejected, so an operator can read a status written by a
    newer or older version of itself during an upgrade.
    """

    model_config = ConfigDict(extra="ignore")


def to_kubernetes_time(value: datetime) -> datetime:
    """UTC, whole seconds: what a metav1.Time keeps, so a value survives a round trip unchanged."""
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a time zone (use datetime.now(UTC))")
    return value.astimezone(UTC).replace(microsecond=0)


Timestamp = Annotated[
    datetime,
    AfterValidator(to_kubernetes_time),
    PlainSerializer(rfc3339_seconds, return_type=str, when_used="json"),
]
"""An RFC 3339 time in UTC with second precision, as metav1.Time."""


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (for example '4', '500m' or '32Gi')")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes resource quantity, written as a number or a string ('4', '500m', '32Gi')."""


def wire_dict(model: BaseModel) -> dict[str, Any]:
    """The JSON-ready form of a model as the API server stores it: camelCase keys, unset optionals omitted.

    A JSON merge patch built from this never clears a field; to clear one, send an explicit null.
    """
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def list_map(*keys: str) -> dict[str, Any]:
    """OpenAPI markers of a list of named objects merged by key (as `conditions` by `type`).

    The API server then rejects duplicate keys, server-side apply merges items by key, and
    transition rules can correlate items between old and new objects.
    """
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


class ObjectMeta(BaseModel):
    """The part of metav1.ObjectMeta goodput reads; the API server owns the rest, kept as it came."""

    model_config = ConfigDict(
        frozen=True,
        extra="allow",
        alias_generator=wire_name,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    generation: int | None = None
    uid: str | None = None
    resource_version: str | None = None
    creation_timestamp: Timestamp | None = None
