"""Kubernetes' label-selector rule, shared by the scheduler's snapshot and the vnode (both read pod terms)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def label_selector_selects(selector: dict[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector chooses an object with ``labels``: a null selector selects nothing, an empty one
    everything; an operator the API server would not let through selects nothing."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, values = e.get("key"), e.get("values") or []
        met = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
               "Exists": key in labels, "DoesNotExist": key not in labels}.get(e.get("operator", ""), False)
        if not met:
            return False
    return True
