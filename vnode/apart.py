"""Pods the tenant's scheduler keeps off a virtual node only by a rule per node or per topology domain.

A virtual node stands for many compute nodes, but the tenant's kube-scheduler sees one Node with one
hostname: of a Deployment whose replicas keep apart per node (a required pod anti-affinity over
``kubernetes.io/hostname``) one replica goes there and the rest stay Pending; of one that spreads over nodes
(a topology spread constraint over the hostname that may not be broken) only ``maxSkew`` go there while the
tenant has other nodes. The same holds for the racks or zones the virtual node stands for many of, which it
carries with its own name for value (vnode/node.py ``domains``): of JobSet's exclusive placement (one Job per
rack) one Job's pods go there and the others' wait. The copies carry the same rules into the compute
cluster, whose scheduler applies them over compute nodes and their domains (their meaning), so the vnode
binds such a pod itself. It does so only where the tenant's scheduler can have had no other reason: the pod
tolerates the Node's taints, its node selection admits the Node, its pod affinity (if any) is over those
keys only, and every rule that may keep it off is over them (one over a label the virtual node shares with
all its compute nodes, a zone of one value, holds there too)."""

from __future__ import annotations

from typing import Any

from ferry.kube.labels import label_selector_selects, with_label_keys
from vnode.selection import refusal, selected_keys
from vnode.translate import HOSTNAME, admits, domain_value

Obj = dict[str, Any]


def required_terms(pod: Obj, kind: str) -> list[Obj]:
    """A pod's required ``podAffinity`` or ``podAntiAffinity`` terms."""
    affinity = pod.get("spec", {}).get("affinity") or {}
    return list((affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _selects(term: Obj, term_namespace: str, other: Obj) -> bool | None:
    """Whether a term of a pod of ``term_namespace`` selects pod ``other`` (None: it cannot be told here, the
    term picks namespaces by their labels, which the vnode does not read)."""
    by_label = term.get("namespaceSelector")
    other_ns = other["metadata"].get("namespace", "")
    listed = term.get("namespaces") or []
    if by_label is None:
        in_scope: bool | None = other_ns in (listed or [term_namespace])
    elif by_label == {}:
        in_scope = True
    else:
        in_scope = True if other_ns in listed else None
    if in_scope is False or not label_selector_selects(term.get("labelSelector"), other["metadata"].get("labels")
                                                       or {}):
        return False
    return in_scope


def conflicts(pod: Obj, bound: list[Obj]) -> list[tuple[str, bool]]:
    """The required anti-affinity terms between ``pod`` and pods ``bound`` to one node that may keep it off that
    node, either side's: (topology key, whether the term surely selects)."""
    ns = pod["metadata"].get("namespace", "")
    found = []
    for other in bound:
        for term in required_terms(pod, "podAntiAffinity"):
            if (hit := _selects(term, ns, other)) is not False:
                found.append((str(term.get("topologyKey", "")), bool(hit)))
        for term in required_terms(other, "podAntiAffinity"):
            if (hit := _selects(term, other["metadata"].get("namespace", ""), pod)) is not False:
                found.append((str(term.get("topologyKey", "")), bool(hit)))
    return found


def skews(pod: Obj, bound: list[Obj], labels: dict[str, str]) -> list[str]:
    """The label keys of the pod's topology spread constraints that may not be broken and that may keep it off a
    node with ``labels`` holding pods ``bound``: the node lacks the key (never a domain), or the pods there its
    selector picks (with this one, if it picks it) number more than ``maxSkew``, which some other node of the
    tenant cluster without them would make a skew (the vnode does not see the others)."""
    ns, mine = pod["metadata"].get("namespace", ""), pod["metadata"].get("labels") or {}
    out = []
    for c in pod.get("spec", {}).get("topologySpreadConstraints") or []:
        if c.get("whenUnsatisfiable") != "DoNotSchedule" or not c.get("topologyKey"):
            continue
        selector = with_label_keys(c, mine)
        count = sum(1 for o in bound if o["metadata"].get("namespace") == ns
                    and label_selector_selects(selector, o["metadata"].get("labels") or {}))
        count += label_selector_selects(selector, mine)
        if c["topologyKey"] not in labels or count > int(c.get("maxSkew") or 1):
            out.append(str(c["topologyKey"]))
    return out


def own_domains(node: Obj) -> set[str]:
    """The keys of a virtual node's labels that name it: its hostname, and the topology domains it stands for
    many of (vnode/node.py ``domains``, valued ``domain_value`` of its name). A rule over one of them is a rule
    per compute node or per compute domain once its pod's copy is in the compute cluster."""
    meta = node.get("metadata", {})
    mine = domain_value(str(meta.get("name")))
    return {HOSTNAME} | {k for k, v in (meta.get("labels") or {}).items() if v == mine}


def fits_but_for_own_domains(pod: Obj, node: Obj, bound: list[Obj]) -> bool:
    """Whether the tenant's scheduler keeps ``pod`` off ``node`` (a virtual node's Node) only by required pod
    anti-affinity or a topology spread constraint over the node's hostname or another of its
    :func:`own_domains`, with pods ``bound`` there."""
    labels, own = node.get("metadata", {}).get("labels") or {}, own_domains(node)
    if refusal(pod, node) is not None or not _near_met_by_copies(pod, bound, own):
        return False
    if not admits(pod, labels, selected_keys(pod)) or _names_nodes(pod):
        return False
    # an anti-affinity over a key the node lacks keeps nothing off it; a spread over one does
    found = [(key, sure) for key, sure in conflicts(pod, bound) if key in labels]
    found += [(key, True) for key in skews(pod, bound, labels)]
    return any(key in own and sure for key, sure in found) and all(key in own for key, _ in found)


def _near_met_by_copies(pod: Obj, bound: list[Obj], own: set[str]) -> bool:
    """Whether each required pod affinity term of ``pod`` is over one of the node's ``own`` domains and selects
    the pod itself (the first of a group, as a JobSet leader) or a pod bound there: then the compute scheduler
    meets it near their copies. A term with pods elsewhere is the tenant scheduler's to weigh."""
    ns = pod["metadata"].get("namespace", "")
    return all(t.get("topologyKey") in own and any(_selects(t, ns, p) for p in (pod, *bound))
               for t in required_terms(pod, "podAffinity"))


def _names_nodes(pod: Obj) -> bool:
    """Whether a pod's required node affinity names nodes by field (their names): pinned, not ours to place."""
    required = (((pod.get("spec", {}).get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return any(t.get("matchFields") for t in required.get("nodeSelectorTerms") or [])
