"""Kubernetes timestamps as Kube-Ferry writes them (conditions, Events, status): RFC 3339, UTC, whole
seconds — one format, so that the scheduler, the vnode and the CLI compare what they wrote."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def rfc3339(t: float) -> str:
    """The timestamp of a Unix time."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> str:
    """The timestamp of now."""
    return rfc3339(time.time())


def unix(text: str) -> float:
    """The Unix time of a timestamp (RFC 3339, as the API server and :func:`rfc3339` write them)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
