"""The informer store never trades a watched version for an older answer to our own write."""

from __future__ import annotations

from typing import Any

from ferry.kube.informer import Informer


async def _never(**_: Any) -> Any:
    raise AssertionError("not listed in this test")


def _pod(rv: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": rv}, "status": {"phase": phase}}


def test_an_answer_to_our_write_fills_a_gap_but_never_replaces_a_newer_watched_version() -> None:
    inf = Informer("pods", _never)
    inf.remember(_pod("1", "Pending"))  # nothing cached yet: the create's answer is kept
    assert inf.store["ns/p"]["metadata"]["resourceVersion"] == "1"

    watched = _pod("3", "Running")  # the watch delivered bound + Running before the create returned
    inf.store["ns/p"] = watched
    inf.remember(_pod("1", "Pending"))
    assert inf.store["ns/p"] is watched

    inf.remember(_pod("4", "Running"), replaces=_pod("3", "Running"))  # based on a copy, not what is cached
    assert inf.store["ns/p"] is watched
    inf.remember(_pod("4", "Succeeded"), replaces=watched)  # based on exactly what is cached: newer
    assert inf.store["ns/p"]["status"]["phase"] == "Succeeded"
