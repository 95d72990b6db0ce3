"""The informer store never trades a watched version for an older answer to our own write."""

from __future__ import annotations

from typing import Any

import orjson

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


class _Answer:
    status = 200

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    async def read(self) -> bytes:
        return orjson.dumps(self._body)


async def test_a_stream_hands_every_listed_object_on_and_keeps_none() -> None:
    items = [{"metadata": {"name": f"e{i}", "namespace": "ns", "resourceVersion": str(i)}} for i in range(3)]

    async def lister(**_: Any) -> _Answer:
        return _Answer({"kind": "EventList", "metadata": {"resourceVersion": "9"}, "items": items})

    seen: list[tuple[str, str]] = []
    stream = Informer("events", lister, lambda kind, o: seen.append((kind, o["metadata"]["name"])), cache=False)
    await stream._list()
    await stream._list()  # a relist: nothing was kept, so nothing reads as deleted
    assert seen == [("SYNC", "e0"), ("SYNC", "e1"), ("SYNC", "e2")] * 2
    assert stream.store == {}

    cached = Informer("events", lister, cache=True)
    await cached._list()
    assert sorted(cached.store) == ["ns/e0", "ns/e1", "ns/e2"]


async def test_after_a_relist_only_what_the_watch_had_not_handed_on_counts_as_new() -> None:
    listed = [[{"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "3"}}],
              [{"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "3"}},
               {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "7"}}]]

    async def lister(**_: Any) -> _Answer:
        return _Answer({"metadata": {"resourceVersion": "9"}, "items": listed.pop(0)})

    stream = Informer("events", lister, cache=False)
    await stream._list()  # the first list: nothing was handed on before it
    assert not stream.seen_before({"metadata": {"resourceVersion": "3"}})
    stream._rv = "5"  # the watch went on to version 5, then broke
    await stream._list()
    assert stream.seen_before({"metadata": {"resourceVersion": "3"}})
    assert not stream.seen_before({"metadata": {"resourceVersion": "7"}})
    assert not stream.seen_before({"metadata": {"resourceVersion": "opaque"}})


async def test_a_relist_reads_pages_and_keeps_every_unchanged_object_it_had() -> None:
    def pod(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}

    pages = {None: {"metadata": {"resourceVersion": "20", "continue": "t1"}, "items": [pod("a", "1"), pod("b", "9")]},
             "t1": {"metadata": {"resourceVersion": "20"}, "items": [pod("d", "12")]}}
    asked: list[tuple[int, str | None]] = []

    async def lister(limit: int, _continue: str | None = None, **_: Any) -> _Answer:
        asked.append((limit, _continue))
        return _Answer(pages[_continue])

    seen: list[tuple[str, str]] = []
    inf = Informer("pods", lister, lambda kind, o: seen.append((kind, o["metadata"]["name"])), page_size=2)
    inf.store = {"ns/a": pod("a", "1"), "ns/b": pod("b", "5"), "ns/c": pod("c", "3")}
    kept = inf.store["ns/a"]
    await inf._list()
    assert asked == [(2, None), (2, "t1")]
    assert sorted(inf.store) == ["ns/a", "ns/b", "ns/d"]
    assert inf.store["ns/a"] is kept  # unchanged: the cached object stays, the listed copy is dropped
    assert inf.store["ns/b"]["metadata"]["resourceVersion"] == "9"
    assert ("DELETED", "c") in seen and {n for k, n in seen if k == "SYNC"} == {"a", "b", "d"}
    assert inf._rv == "20"
