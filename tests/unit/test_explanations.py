"""When the scheduler writes why a job waits: a new situation at once, changed numbers seldom."""

from __future__ import annotations

from scheduler.service.service import REEVENT_AFTER_S, REEXPLAIN_AFTER_S, Said, explanation_due

CAPACITY = "waiting for capacity: gang of 8 replica(s) needs 8 GPUs all at once (largest free block now 7)"


def said(reason: str, message: str, written: float = 0.0, evented: float = 0.0) -> Said:
    return Said("uid", reason, message, written, evented)


def test_a_new_situation_is_written_at_once_with_an_event() -> None:
    assert explanation_due(None, "Unschedulable", CAPACITY, 0.0) is True
    before = said("Unschedulable", CAPACITY)
    assert explanation_due(before, "Unschedulable", CAPACITY, 1.0) is None  # nothing new
    cordoned = "waiting for a node: no node has 8 GPUs (1 node that could is cordoned or not ready)"
    assert explanation_due(before, "Unschedulable", cordoned, 1.0) is True
    assert explanation_due(before, "InvalidSpec", "kubeferry.io/gpu-milli must be 1-1000", 1.0) is True


def test_changed_numbers_rewrite_the_condition_seldom_and_the_event_more_seldom() -> None:
    before = said("Unschedulable", CAPACITY)
    six = CAPACITY.replace("now 7", "now 6")
    assert explanation_due(before, "Unschedulable", six, REEXPLAIN_AFTER_S - 1) is None
    assert explanation_due(before, "Unschedulable", six, REEXPLAIN_AFTER_S) is False  # condition only
    rewritten = said("Unschedulable", six, written=REEXPLAIN_AFTER_S, evented=0.0)
    five = CAPACITY.replace("now 7", "now 5")
    assert explanation_due(rewritten, "Unschedulable", five, REEVENT_AFTER_S) is True  # the Event counts up


def test_a_gang_assembling_says_so_once() -> None:
    before = said("Waiting", "gang of 8 members: 3 present")
    assert explanation_due(before, "Waiting", "gang of 8 members: 5 present", REEVENT_AFTER_S) is False
    assert explanation_due(before, "Waiting", "gang of 8 members: 5 present; its PodGroup is missing",
                           1.0) is False
    assert explanation_due(before, "Unschedulable", CAPACITY, 1.0) is True
