"""RFC 3339 times as the Kubernetes API writes and reads them: written once, for every layer.

metav1.Time keeps whole seconds, metav1.MicroTime six fractional digits; goodput's own annotations
(a drain's timings) keep milliseconds, because they are read back to the sub-second. Every form is
UTC with a `Z`, and the one parser reads them all.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339_seconds(moment: datetime) -> str:
    """metav1.Time: UTC, whole seconds (a condition's lastTransitionTime, a status timestamp)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_millis(moment: datetime) -> str:
    """UTC with milliseconds: for annotations whose timings are read back to the sub-second."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rfc3339_micros(moment: datetime) -> str:
    """metav1.MicroTime: UTC with six fractional digits (a Lease's acquire and renew times)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: object) -> datetime | None:
    """An RFC 3339 time from the API server or an annotation, or None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
