"""The API reference in Markdown, rendered from the same schema as the CRDs.

A reference written by hand drifts from the schema the API server enforces; this one is a view of
it: every field with its type, default and description, and every validation rule with the message
a user will see. `goodput crds` writes it beside the CRDs and `--check` fails when it is stale.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from goodput.api.crd import CUSTOM_RESOURCES, GENERATED_HEADER, render_crd

REFERENCE_FILE = "api-reference.md"


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = str(schema.get("type", "object"))
    if kind == "array":
        return f"[]{_type_of(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(str(value) for value in schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        return "int or string"
    return kind


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every field below `schema`, depth first, in declaration order."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    if schema.get("type") == "array":
        properties = schema.get("items", {}).get("properties", {})
    for name, child in properties.items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child
        items = child.get("items", {}) if child.get("type") == "array" else child
        yield from _fields(items, f"{child_path}[]" if child.get("type") == "array" else child_path)


def _rules(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path or "(object)", rule
    for field_path, child in _fields(schema, path):
        for rule in child.get("x-kubernetes-validations", ()):
            yield field_path, rule


def render_reference() -> str:
    lines = [GENERATED_HEADER.replace("#", "<!--", 1).rstrip() + " -->", "", "# API reference", ""]
    for resource in CUSTOM_RESOURCES:
        version = render_crd(resource)["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        names = ", ".join(resource.short_names)
        lines += [f"## {resource.kind} (`{resource.crd_name}`, short names: {names})", ""]
        for part in ("spec", "status"):
            lines += [f"### {part}", "", "| field | type | default | description |", "|---|---|---|---|"]
            for path, child in _fields(schema["properties"][part], ""):
                default = f"`{json.dumps(child['default'])}`" if "default" in child else ""
                description = _one_line(str(child.get("description", "")))
                lines.append(f"| `{path}` | {_type_of(child)} | {default} | {description} |")
            lines.append("")
        rules = list(_rules(schema["properties"]["spec"], "spec"))
        if rules:
            lines += ["### validation", "", "| where | rule | message |", "|---|---|---|"]
            for where, rule in rules:
                message = _one_line(str(rule.get("message") or rule.get("messageExpression", "")))
                lines.append(f"| `{where}` | `{_one_line(str(rule['rule']))}` | {message} |")
            lines.append("")
    return "\n".join(lines)
