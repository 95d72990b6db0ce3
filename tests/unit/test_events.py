"""The Event body and name the vnode and the scheduler share (ferry/kube/events.py)."""

from __future__ import annotations

from ferry.kube.events import MESSAGE_LIMIT, event_body, event_name


def _pod(name: str = "trainer-0", uid: str = "u1") -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a", "uid": uid}}


def test_what_is_said_again_on_the_same_pod_has_one_name() -> None:
    pod, said = _pod(), "FailedScheduling/waiting for # GPUs"
    assert event_name(pod, said) == event_name(_pod(), said)
    # another thing said, or the same thing on a new pod of that name, is another Event
    assert event_name(pod, said) != event_name(pod, "FailedScheduling/cordoned")
    assert event_name(pod, "x") != event_name(_pod(uid="u2"), "x")


def test_a_long_pod_name_leaves_room_for_the_digest() -> None:
    name = event_name(_pod(name="p" * 253), "x")
    assert len(name) <= 253 and name.startswith("p" * 200 + ".")


def test_the_body_names_its_object_source_and_count() -> None:
    body = event_body(_pod(), "Warning", "FailedScheduling", "m" * 5000, component="kube-ferry-scheduler",
                      host="kube-ferry-scheduler", name="trainer-0.abc", count=3)
    assert body["metadata"] == {"name": "trainer-0.abc", "namespace": "team-a"}
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "namespace": "team-a",
                                      "uid": "u1"}
    assert len(body["message"]) == MESSAGE_LIMIT and body["count"] == 3
    assert body["source"] == {"component": "kube-ferry-scheduler", "host": "kube-ferry-scheduler"}
    assert body["firstTimestamp"] == body["lastTimestamp"] and body["lastTimestamp"].endswith("Z")


def test_an_event_no_repeat_must_find_gets_a_generated_name() -> None:
    body = event_body(_pod(), "Normal", "EvictionCancelled", "spared", component="c", host="h")
    assert body["metadata"] == {"generateName": "trainer-0.", "namespace": "team-a"}


def test_timestamps_read_back_to_the_second() -> None:
    from ferry.kube.timestamps import rfc3339
    from vnode.status import epoch

    assert rfc3339(0) == "1970-01-01T00:00:00Z"
    assert epoch(rfc3339(1_764_000_000.7)) == 1_764_000_000
