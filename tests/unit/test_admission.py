"""The Queue webhook's verdicts: refuse what a change breaks in the tree, never what was broken before."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from scheduler.service.admission import queue_verdict, review_response
from scheduler.service.webhook import make_serving_cert, missing_hosts


def q(name: str, parent: str | None = None, guaranteed: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if parent:
        spec["parent"] = parent
    if guaranteed is not None:
        spec["guaranteed"] = {"gpu": str(guaranteed)}
    return {"apiVersion": "scheduling.kubeferry.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": spec}


def tree(*queues: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["metadata"]["name"]: x for x in queues}


def write(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"uid": "u-1", "operation": operation, "name": obj["metadata"]["name"], "object": obj}


DEPT = tree(q("dept", guaranteed=16), q("team-a", "dept", 8))


@pytest.mark.parametrize(("stored", "change", "refused_with"), [
    (DEPT, write(q("team-b", "dept", 8)), None),
    (DEPT, write(q("team-b", "nowhere", 8)), "parent queue 'nowhere' does not exist"),
    (DEPT, write(q("team-b", "dept", 9)), "guaranteed 17 GPUs, more than its 16"),
    (DEPT, write(q("dept", "team-a", 16), "UPDATE"), "leads back"),
    (DEPT, write(q("dept", guaranteed=4), "UPDATE"), "would break queue 'team-a'"),
    (DEPT, write(q("team-a", "default", 0), "UPDATE"), None),  # the default queue always exists
    # already broken (written while the webhook was down): repairing it step by step is admitted
    (tree(q("dept", guaranteed=8), q("team-a", "dept", 8), q("team-b", "dept", 8)),
     write(q("team-b", "dept", 4), "UPDATE"), None),
    (tree(q("dept", guaranteed=8), q("team-a", "dept", 8), q("team-b", "dept", 8)),
     write(q("team-c", "dept", 0)), "more than its 8"),
])
def test_a_queue_change_is_refused_only_for_what_it_breaks(
        stored: dict[str, Any], change: dict[str, Any], refused_with: str | None) -> None:
    why = queue_verdict(change, stored)
    if refused_with is None:
        assert why is None
    else:
        assert why is not None and refused_with in why


def test_a_parent_with_children_is_not_deleted_a_leaf_is() -> None:
    delete = {"uid": "u-2", "operation": "DELETE", "name": "dept", "oldObject": DEPT["dept"]}
    assert queue_verdict(delete, DEPT) == "queue 'dept' is the parent of team-a: move or delete those first"
    assert queue_verdict({**delete, "name": "team-a", "oldObject": DEPT["team-a"]}, DEPT) is None


def test_the_answer_is_an_admission_review_for_the_same_uid() -> None:
    answer = review_response({"request": write(q("team-b", "nowhere"))}, DEPT)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is False
    assert "nowhere" in answer["response"]["status"]["message"]
    assert review_response({"request": write(q("team-b", "dept", 1))}, DEPT)["response"] == {
        "uid": "u-1", "allowed": True}


def test_the_serving_certificate_names_every_host_it_is_reached_by() -> None:
    hosts = ("kube-ferry-webhook.kube-ferry-system.svc", "127.0.0.1")
    made = make_serving_cert(hosts)
    assert missing_hosts(made.cert, hosts) == []
    assert missing_hosts(made.cert, ("other.svc",)) == ["other.svc"]


@pytest.mark.parametrize("flag", ["--webhook-hosts=", "--webhook-secret=no-namespace"])
def test_a_webhook_without_a_name_or_a_secret_is_one_clear_line(flag: str) -> None:
    res = subprocess.run([sys.executable, "-m", "ferry", "scheduler", "--webhook-port=9443", flag],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 1
    assert res.stderr.strip() == ("ferry: error: --webhook-port needs --webhook-hosts (at least one name) and "
                                  "--webhook-secret as NAMESPACE/NAME")
