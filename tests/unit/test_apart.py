"""Which pods the tenant's scheduler keeps off a virtual node only by a rule per node or per domain of its
own: required pod anti-affinity or a topology spread constraint over the hostname, or over a rack key the
virtual node carries its own name for (vnode/apart.py; the real planes in tests/integration/test_vnode.py and
test_jobset.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vnode.apart import conflicts, fits_but_for_own_domains
from vnode.node import TAINTS
from vnode.selection import refusal, tolerates
from vnode.translate import domain_value

Obj = dict[str, Any]
HOST, ZONE, RACK = "kubernetes.io/hostname", "topology.kubernetes.io/zone", "kubeferry.io/topology-domain"
OWN = domain_value("ferry-t")  # what the virtual node carries for the racks it stands for many of
TOLERATE = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}


def node(**labels: str) -> Obj:
    return {"metadata": {"name": "ferry-t", "labels": {HOST: "ferry-t", **labels}}, "spec": {"taints": list(TAINTS)}}


def term(key: str = HOST, app: str = "web", **extra: Any) -> Obj:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key, **extra}


def pod(name: str, ns: str = "ns", app: str = "web", anti: list[Obj] | None = None, near: list[Obj] | None = None,
        pinned: bool = False, role: str = "", **spec: Any) -> Obj:
    affinity: Obj = {}
    if pinned:  # as a DaemonSet's pod: its node named by field
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ferry-t"]}]}]}}
    if anti is not None:
        affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": anti}
    if near is not None:
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": near}
    return {"metadata": {"name": name, "namespace": ns, "labels": {"app": app, **({"role": role} if role else {})}},
            "spec": {"tolerations": [TOLERATE], "containers": [{"name": "c"}], "affinity": affinity, **spec}}


def spread(key: str = HOST, max_skew: int = 1, keys: list[str] | None = None) -> Obj:
    return {"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}}, **({"matchLabelKeys": keys} if keys else {})}


def spreading(key: str = HOST, max_skew: int = 1, keys: list[str] | None = None) -> Obj:
    return pod("web-1", role="worker", topologySpreadConstraints=[spread(key, max_skew, keys)])


REPLICA = pod("web-1", anti=[term()])
BOUND = [pod("web-0", anti=[term()]), pod("other", app="db")]

CASES: list[tuple[str, Obj, list[Obj], Obj, bool]] = [
    ("a replica kept off by its own term over the hostname", REPLICA, BOUND, node(), True),
    ("nothing there it keeps apart from: it waits for another reason", REPLICA, [pod("other", app="db")], node(),
     False),
    ("a bound pod's term selects it (the other side of the rule)", pod("late"), BOUND, node(), True),
    ("a term over a zone the virtual node carries holds in every compute node of it",
     pod("web-1", anti=[term(), term(ZONE)]), BOUND, node(**{ZONE: "a"}), False),
    ("a term over a zone the virtual node does not carry kept nothing off",
     pod("web-1", anti=[term(), term(ZONE)]), BOUND, node(), True),
    ("a pod affinity with pods there: the compute scheduler's to meet, near their copies",
     pod("web-1", anti=[term()], near=[term(app="db")]), BOUND, node(), True),
    ("a pod affinity with pods elsewhere is the tenant scheduler's to weigh",
     pod("web-1", anti=[term()], near=[term(app="cache")]), BOUND, node(), False),
    ("a pod affinity over a zone the virtual node does not carry is the tenant scheduler's",
     pod("web-1", anti=[term()], near=[term(ZONE, app="db")]), BOUND, node(), False),
    ("a cordoned node", REPLICA, BOUND, {**node(), "spec": {"unschedulable": True, "taints": list(TAINTS)}}, False),
    ("an admin's taint it does not tolerate", REPLICA, BOUND,
     {**node(), "spec": {"taints": [*TAINTS, {"key": "maintenance", "effect": "NoSchedule"}]}}, False),
    ("a node selector the node does not meet", pod("web-1", anti=[term()], nodeSelector={"disk": "ssd"}), BOUND,
     node(), False),
    ("a node selector it meets", pod("web-1", anti=[term()], nodeSelector={"disk": "ssd"}), BOUND,
     node(disk="ssd"), True),
    ("pinned to a node by name", pod("web-1", anti=[term()], pinned=True), BOUND, node(), False),
    ("the term looks at its own namespace only", pod("web-1", ns="other", anti=[term()]), BOUND, node(), False),
    ("the term names the namespace", pod("web-1", ns="other", anti=[term(namespaces=["ns"])]), BOUND, node(), True),
    ("the term looks at every namespace", pod("web-1", ns="other", anti=[term(namespaceSelector={})]), BOUND,
     node(), True),
    ("a replica that spreads over nodes, one already there", spreading(), [pod("web-0")], node(), True),
    ("a spread whose skew one more pod there keeps", spreading(max_skew=2), [pod("web-0")], node(), False),
    ("a spread over a zone the virtual node lacks: it is never a domain", pod("web-1", anti=[term()],
     topologySpreadConstraints=[spread(ZONE)]), BOUND, node(), False),
    ("a spread over a zone the virtual node carries, skewed there", spreading(ZONE), [pod("web-0")],
     node(**{ZONE: "a"}), False),
    ("a spread that picks its role's pods only (matchLabelKeys)", spreading(keys=["role"]),
     [pod("web-0", role="other")], node(), False),
    ("a term over racks, of which the virtual node is one of its own (its name for value)",
     pod("web-1", anti=[term(RACK)]), [pod("web-0", anti=[term(RACK)])], node(**{RACK: OWN}), True),
    ("a term over racks the virtual node carries one compute rack of: it holds there too",
     pod("web-1", anti=[term(RACK)]), [pod("web-0", anti=[term(RACK)])], node(**{RACK: "rack-000"}), False),
    ("a pod affinity over a rack of its own is the compute scheduler's to meet (a JobSet leader)",
     pod("web-1", anti=[term(RACK)], near=[term(RACK, app="web")]), [pod("web-0", anti=[term(RACK)])],
     node(**{RACK: OWN}), True),
    ("a follower in its leader's rack, kept off by another Job's leader there",
     pod("web-1", app="other", nodeSelector={RACK: OWN}), [pod("web-0", anti=[term(RACK, app="other")])],
     node(**{RACK: OWN}), True),
    ("namespaces by labels the vnode does not read: not sure, so left to the tenant's scheduler",
     pod("web-1", ns="other", anti=[term(namespaceSelector={"matchLabels": {"team": "a"}})]), BOUND, node(), False),
]


@pytest.mark.parametrize(("pod_", "bound", "node_", "taken"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_pod_is_taken_only_when_a_rule_per_node_is_all_that_keeps_it_off(
        pod_: Obj, bound: list[Obj], node_: Obj, taken: bool) -> None:
    assert fits_but_for_own_domains(pod_, node_, bound) is taken


def test_conflicts_name_each_sides_terms() -> None:
    assert conflicts(REPLICA, BOUND) == [(HOST, True), (HOST, True)]  # its own term, and web-0's selecting it
    assert conflicts(pod("solo", app="batch"), BOUND) == []
    assert not fits_but_for_own_domains(pod("solo", app="batch"), node(), BOUND)
    assert not fits_but_for_own_domains(spreading(max_skew=2), node(), [pod("web-0")])


def test_tolerations_follow_kubernetes_rules() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates({"spec": {"tolerations": [{"operator": "Exists"}]}}, taint)
    assert tolerates({"spec": {"tolerations": [{"key": "k", "value": "v"}]}}, taint)
    assert tolerates({"spec": {"tolerations": [{"key": "k", "operator": "Equal", "value": "v",
                                                "effect": "NoSchedule"}]}}, taint)
    assert not tolerates({"spec": {"tolerations": [{"key": "k", "value": "w"}]}}, taint)
    assert not tolerates({"spec": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute"}]}},
                         taint)
    assert not tolerates({"spec": {}}, taint)


def test_a_virtual_node_refuses_a_pod_as_kube_schedulers_filters_would() -> None:
    assert refusal(REPLICA, node()) is None  # it tolerates the virtual node's own taints
    cordoned = {**node(), "spec": {"unschedulable": True, "taints": list(TAINTS)}}
    assert refusal(REPLICA, cordoned) == "it is cordoned (unschedulable)"
    tolerant = pod("ds", tolerations=[TOLERATE, {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert refusal(tolerant, cordoned) is None  # as a DaemonSet's pod
    tainted = {**node(), "spec": {"taints": [*TAINTS, {"key": "maintenance", "value": "gpu", "effect": "NoExecute"}]}}
    assert refusal(REPLICA, tainted) == "the pod does not tolerate its taint maintenance=gpu:NoExecute"
    preferred = {**node(), "spec": {"taints": [*TAINTS, {"key": "soon", "effect": "PreferNoSchedule"}]}}
    assert refusal(REPLICA, preferred) is None
    # the binder ignores the virtual node's own taints (they keep other schedulers off; its pods need not tolerate)
    operator_pod = {"metadata": {"name": "w", "namespace": "ns"}, "spec": {}}
    assert refusal(operator_pod, node()) is not None
    assert refusal(operator_pod, node(), frozenset(t["key"] for t in TAINTS)) is None
    assert refusal(operator_pod, cordoned, frozenset(t["key"] for t in TAINTS)) == "it is cordoned (unschedulable)"
