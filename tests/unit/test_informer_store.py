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

    inf.remember(_pod("2", "Pending"), replaces=_pod("1", "Pending"))  # older than what is cached
    assert inf.store["ns/p"] is watched
    inf.remember(_pod("4", "Succeeded"), replaces=_pod("1", "Pending"))  # a later version than the cached one
    assert inf.store["ns/p"]["status"]["phase"] == "Succeeded"

    opaque = {"metadata": {"name": "q", "namespace": "ns", "resourceVersion": "a7"}}
    inf.store["ns/q"] = opaque  # versions that are not integers never compare: identity decides
    inf.remember({"metadata": {"name": "q", "namespace": "ns", "resourceVersion": "b9"}})
    assert inf.store["ns/q"] is opaque
    inf.remember({"metadata": {"name": "q", "namespace": "ns", "resourceVersion": "b9"}}, replaces=opaque)
    assert inf.store["ns/q"]["metadata"]["resourceVersion"] == "b9"
