"""The soak's job stream: a job a fault interrupted is completed on a later try, never left half made."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from ferry.demo import objects
from tests.soak import Stream, _create_job

Obj = dict[str, Any]


class FlakyApi:
    """An API server that refuses the ``fail_at``-th create (counting from 1); with ``lost_answer`` it
    makes the object first, as when the server dies after the write but before its answer."""

    def __init__(self, fail_at: int, lost_answer: bool = False) -> None:
        self.fail_at, self.lost_answer = fail_at, lost_answer
        self.calls = 0
        self.made: set[tuple[str, str]] = set()

    async def create(self, url: str, obj: Obj) -> Obj:
        self.calls += 1
        key = (url, obj["metadata"]["name"])
        if self.calls == self.fail_at:
            if self.lost_answer:
                self.made.add(key)
            raise ApiException(status=500, reason="etcd is down")
        if key in self.made:
            raise ApiException(status=409, reason="AlreadyExists")
        self.made.add(key)
        return obj


def _gang(members: int) -> tuple[str, list[Obj], Obj]:
    name = "g00001"
    return name, objects.gang_members(name, members, 1, duration="60s"), objects.volcano_group(name, members)


async def test_a_gang_interrupted_by_a_fault_gets_every_member_on_the_next_try() -> None:
    api: Any = FlakyApi(fail_at=4)  # the group and two pods, then a refusal
    stream, job = Stream(), _gang(8)
    assert not await _create_job(api, "t", stream, job)
    assert len(stream.created["t"]) == 2 and stream.jobs["g"] == 0 and sum(stream.refused.values()) == 1
    assert await _create_job(api, "t", stream, job)
    assert stream.created["t"] == {p["metadata"]["name"] for p in job[1]}
    assert len([k for k in api.made if "/pods" in k[0]]) == 8 and stream.jobs["g"] == 1


async def test_a_create_whose_answer_was_lost_counts_as_made_on_the_next_try() -> None:
    api: Any = FlakyApi(fail_at=2, lost_answer=True)  # the first pod: made, then a 500
    stream, job = Stream(), _gang(2)
    assert not await _create_job(api, "t", stream, job)
    assert await _create_job(api, "t", stream, job)  # 409 for the group and the first pod: they exist
    assert stream.created["t"] == {p["metadata"]["name"] for p in job[1]} and stream.jobs["g"] == 1


async def test_a_batch_job_is_created_once_with_its_group_and_counts_no_pod() -> None:
    api: Any = FlakyApi(fail_at=2)  # the group, then the Job is refused
    name = "b00001"
    stream, job = Stream(), (name, [objects.batch_job(name, 2, 8, elastic=True)], objects.volcano_group(name, 2))
    assert not await _create_job(api, "t", stream, job)
    assert await _create_job(api, "t", stream, job)
    assert stream.batch["t"] == {name} and not stream.created["t"] and stream.jobs["b"] == 1
    made = [k for k in api.made if k[0].endswith("/jobs")]
    assert made == [("/apis/batch/v1/namespaces/demo/jobs", name)]
    spec = job[1][0]["spec"]
    assert spec["parallelism"] == spec["completions"] == 2 and spec["backoffLimit"] == 0
    assert spec["template"]["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == name
