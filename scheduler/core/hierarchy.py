"""Queue trees: a queue may name a parent (department -> team). A parent's allocation is its own jobs'
plus its descendants'; its guarantee is the department's, which its children's guarantees are carved
from. Policies compare two queues where their lineages part: two teams of one department as teams,
queues of two departments as those departments — so idle capacity is lent inside a department first,
and a department takes back what it lent before its teams compete for the rest.

Links are checked where queues are read (:func:`problems`); the core only guards against a loop."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.core.model import Queue


def lineage(queues: Mapping[str, Queue], name: str) -> list[Queue]:
    """The queue and its ancestors, root first (a link to an unknown queue or back into the lineage ends it)."""
    out: list[Queue] = []
    seen: set[str] = set()
    q = queues.get(name)
    while q is not None and q.name not in seen:
        out.append(q)
        seen.add(q.name)
        q = queues.get(q.parent) if q.parent else None
    out.reverse()
    return out


def split(queues: Mapping[str, Queue], a: str, b: str) -> tuple[list[Queue], list[Queue]]:
    """Both lineages below their lowest common ancestor, top first: where ``a`` and ``b`` compete."""
    la, lb = lineage(queues, a), lineage(queues, b)
    i = 0
    while i < min(len(la), len(lb)) and la[i].name == lb[i].name:
        i += 1
    return la[i:], lb[i:]


def subtree_total(queues: Mapping[str, Queue], per_queue: Mapping[str, int], top: str) -> int:
    """The sum of ``per_queue`` over ``top`` and its descendants."""
    return sum(v for name, v in per_queue.items() if any(q.name == top for q in lineage(queues, name)))


def recount(queues: Mapping[str, Queue]) -> None:
    """Every queue's allocation from its own jobs' (after links changed)."""
    for q in queues.values():
        q.allocated_gpu = 0
    for q in queues.values():
        for a in lineage(queues, q.name):
            a.allocated_gpu += q.own_gpu


def problems(queues: Mapping[str, Queue]) -> dict[str, str]:
    """Why a queue's parent link cannot stand: an unknown parent, a loop, or children guaranteed more
    than their parent. A queue listed here should be treated as having no parent."""
    out: dict[str, str] = {}
    for q in queues.values():
        if not q.parent:
            continue
        if q.parent not in queues:
            out[q.name] = f"parent queue {q.parent!r} does not exist"
            continue
        seen, p = {q.name}, queues.get(q.parent)
        while p is not None and p.parent and p.name not in seen:
            seen.add(p.name)
            p = queues.get(p.parent)
        if p is not None and p.name in seen:
            out[q.name] = f"parent queue {q.parent!r} leads back to {q.name!r}: queues may not form a loop"
    children: dict[str, list[Queue]] = {}
    for q in queues.values():
        if q.parent and q.name not in out:
            children.setdefault(q.parent, []).append(q)
    for parent, kids in children.items():
        total = sum(k.guaranteed_gpu for k in kids)
        if total > queues[parent].guaranteed_gpu:
            for k in kids:
                out[k.name] = (f"the children of queue {parent!r} are guaranteed {total / 1000:g} GPUs, more than its "
                               f"{queues[parent].guaranteed_gpu / 1000:g}: a child's guarantee is carved from its "
                               "parent's")
    return out
