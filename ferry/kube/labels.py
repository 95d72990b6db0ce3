"""Kubernetes' label-selector rules, shared by the scheduler's snapshot and the vnode (both read pod terms)."""

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


def with_label_keys(constraint: dict[str, Any], labels: Mapping[str, str]) -> dict[str, Any] | None:
    """A topology spread constraint's selector with its ``matchLabelKeys`` (the pod's values of those labels)
    ANDed in: each pod counts the pods its own labels pick."""
    selector, keys = constraint.get("labelSelector"), constraint.get("matchLabelKeys") or []
    if selector is None or not keys:
        return selector
    extra = {k: labels[k] for k in keys if k in labels}
    return {**selector, "matchLabels": {**(selector.get("matchLabels") or {}), **extra}}
