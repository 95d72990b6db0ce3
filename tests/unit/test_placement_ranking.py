"""The Placer ranks node states, not nodes: its choice must be what scoring every node would give.

Random clusters are filled with random binds (whole GPUs, shares, CPU), then for random requests the
node :meth:`Placer.find` returns is checked against a brute-force score of every node that fits, for
the tightest fit and for the fragmentation order; and the index must follow nodes that change.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from scheduler.core.model import GPU_MILLI, Cluster, Device, Job, Node, Queue, ReplicaPhase, Request, Task
from scheduler.core.nodeclasses import NodeState
from scheduler.core.placement import Option, Placer
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.core.statement import Statement

REQUESTS = [
    Request(cpu_milli=1000, gpus=1),
    Request(cpu_milli=4000, gpus=2),
    Request(cpu_milli=2000, gpus=4),
    Request(cpu_milli=500, gpus=1, gpu_milli=250),
    Request(cpu_milli=500, gpus=1, gpu_milli=600),
    Request(cpu_milli=8000),
    Request(cpu_milli=1000, gpus=1, models=frozenset({"A100"})),
]


def _cluster(rng: random.Random, n: int) -> Cluster:
    nodes = {}
    for i in range(n):
        gpus = rng.choice([4, 8])
        nodes[f"n{i:03d}"] = Node(f"n{i:03d}", 32000, 1 << 20, [Device(d, group=d // 4) for d in range(gpus)],
                                  model=rng.choice(["A100", "V100"]), domain=f"rack-{i // 4}")
    return Cluster(nodes, {"q": Queue("q")})


def _options(placer: Placer, node: Node, req: Request) -> list[Option]:
    options = placer._options(NodeState.of(node), req)
    if len(options) > 1:
        keys = placer.order.device_keys(req, options)
        best = min(range(len(options)), key=lambda i: (tuple(-k for k in keys[i]), options[i].device_free))
        options = [options[best]]
    return options


def _keys(placer: Placer, node: Node, req: Request) -> list[tuple[float, ...]]:
    """The node's keys for ``req`` scored on their own (a multi-GPU replica in one NVLink group first)."""
    keys = []
    for option in _options(placer, node, req):
        key = placer.order.node_keys(req, [option])[0]
        if req.gpus > 1 and not req.is_share:
            key = (1.0 if option.before.one_group_fits(req.gpus) else 0.0, *key)
        keys.append(key)
    return keys


def _best_key(placer: Placer, req: Request) -> tuple[float, ...] | None:
    """The best key over every node that fits, scored one by one."""
    keys = [k for node in placer.cluster.nodes.values()
            if node.schedulable and node.free_mem >= req.mem_mib and node.pods < node.max_pods
            for k in _keys(placer, node, req)]
    return max(keys) if keys else None


def _fill(sched: Scheduler, rng: random.Random, jobs: int) -> None:
    for j in range(jobs):
        req = rng.choice(REQUESTS)
        job = Job(f"j{j}", "q", [Task("t", 1, req)])
        sched.submit(job)
        found = sched.placer.find(req)
        if found is not None:
            sched.placer.bind(job, job.replicas[0], *found)


@pytest.mark.parametrize("plugins", [("binpack",), ("fragmentation",), ()])
@pytest.mark.parametrize("seed", range(6))
def test_the_node_found_has_the_best_key_of_all_nodes_that_fit(plugins: tuple[str, ...], seed: int) -> None:
    rng = random.Random(seed)
    sched = Scheduler(_cluster(rng, 24), SchedulerConfig(plugins=plugins))
    sched.expect(Counter(REQUESTS))
    _fill(sched, rng, rng.randrange(10, 60))
    for req in REQUESTS:
        found = sched.placer.find(req)
        best = _best_key(sched.placer, req)
        if best is None:
            assert found is None, req
            continue
        assert found is not None, req
        node = sched.cluster.nodes[found[0]]
        keys = _keys(sched.placer, node, req)
        assert keys and max(keys) == best, (req, found, keys, best)
        if req.is_share:
            assert node.devices[found[1][0]].free >= req.gpu_milli
        else:
            assert len(found[1]) == req.gpus and all(node.devices[d].free == GPU_MILLI for d in found[1])


def test_a_node_that_changes_or_leaves_is_found_in_its_new_state_only() -> None:
    rng = random.Random(3)
    sched = Scheduler(_cluster(rng, 8), SchedulerConfig(plugins=("binpack",)))
    whole8 = Request(gpus=8)
    eights = [n for n in sched.cluster.nodes.values() if len(n.devices) == 8]
    for n in eights[1:]:
        sched.placer.forget(n.name)  # gone: never chosen again
    found = sched.placer.find(whole8)
    assert found is not None and found[0] == eights[0].name
    job = Job("big", "q", [Task("t", 1, whole8)])
    sched.submit(job)
    sched.placer.bind(job, job.replicas[0], *found)
    assert sched.placer.find(whole8) is None  # the one 8-GPU node left is full now
    sched.placer.release(job, job.replicas[0], ReplicaPhase.PENDING)
    assert sched.placer.find(whole8) == found


def _four_empty_nodes(plugins: tuple[str, ...]) -> Scheduler:
    nodes = {f"n{i}": Node(f"n{i}", 32000, 1 << 20, [Device(d) for d in range(8)], domain=f"rack-{i % 2}")
             for i in range(4)}
    sched = Scheduler(Cluster(nodes, {"q": Queue("q")}), SchedulerConfig(plugins=plugins))
    sched.expect(Counter([Request(gpus=1)]))
    return sched


@pytest.mark.parametrize(("plugins", "chosen"), [(("binpack",), "n2"), (("fragmentation",), "n0")])
def test_ties_go_by_packing_order_or_by_name_as_the_node_order_asks(plugins: tuple[str, ...], chosen: str) -> None:
    """n0 is used and freed again: by packing order its domain (rack-0, which kept n2 empty all along)
    still comes first, but n0 itself settled last, so n2 goes first; by name (FGD's order) n0 does."""
    sched = _four_empty_nodes(plugins)
    job = Job("a", "q", [Task("t", 1, Request(gpus=1))])
    sched.submit(job)
    sched.placer.bind(job, job.replicas[0], "n0", (0,))
    sched.placer.release(job, job.replicas[0], ReplicaPhase.PENDING)
    found = sched.placer.find(Request(gpus=8))
    assert found is not None and found[0] == chosen


def _index_picture(placer: Placer) -> dict[NodeState, list[tuple[str, int, list[tuple[str, int]]]]]:
    """Every filed node's state, domain and place in its state's order: what later tie-breaks read."""
    live = [c for c in placer.classes.classes if c.count]
    if placer.classes.settled:  # domains are walked in the order they began to hold nodes of a state
        assert all([m.created for m in c.by_domain.values()] == sorted(m.created for m in c.by_domain.values())
                   for c in live)
    return {c.state: sorted((d, m.created, sorted(m.since.items())) for d, m in c.by_domain.items()) for c in live}


@pytest.mark.parametrize("seed", range(8))
def test_a_discarded_trial_leaves_no_trace_in_later_choices(seed: int) -> None:
    """Binds, evictions, gangs that do not fit and probes, all inside a statement that is discarded: the
    nodes they touched keep their places among equal nodes, so every later choice is the one before the
    trial. (A real bind and release does move a node back: see the test above.)"""
    rng = random.Random(seed)
    sched = Scheduler(_cluster(rng, 24), SchedulerConfig(plugins=rng.choice([("binpack",), ("fragmentation",), ()])))
    sched.expect(Counter(REQUESTS))
    _fill(sched, rng, rng.randrange(20, 60))
    placer = sched.placer
    before = _index_picture(placer)
    choices = [placer.find(req) for req in REQUESTS]
    running = [j for j in sched.cluster.jobs.values() if j.bound()]
    with Statement(placer) as st:
        for i in range(12):
            kind = rng.randrange(4)
            if kind == 0 and running:  # a victim leaves (and, sometimes, is put back)
                victim = rng.choice(running)
                st.lift(victim)
                if rng.random() < 0.5:
                    st.restore(victim)
            else:
                job = Job(f"trial{i}", "q", [Task("t", rng.randrange(1, 4), rng.choice(REQUESTS))])
                sched.submit(job)
                if kind == 1:
                    st.place_gang(job, job.pending(), frozenset())
                elif kind == 2:
                    st.fits(job, job.pending(), frozenset())
                else:  # a gang bigger than the room left: bound in part by the placer, then unwound
                    big = Job(f"big{i}", "q", [Task("t", 40, Request(cpu_milli=1000, gpus=4))])
                    sched.submit(big)
                    assert placer.place_gang(big, big.pending()) is None
    assert _index_picture(placer) == before
    assert [placer.find(req) for req in REQUESTS] == choices
