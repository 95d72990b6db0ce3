"""allocate: pending jobs start where they fit — queues in fair order, jobs in order within a queue,
gangs all-or-nothing, and (with ``backfill``) smaller jobs passing one that does not fit yet. A job that
fits nowhere else may start on loan on nodes held for a waiting job, where a plugin lends them
(``hold_lends``); ``reserve`` recalls it when the holder could start."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from typing import TypeVar

from scheduler.core.framework import Action, Session, ShapeKey
from scheduler.core.model import (
    GPU_MILLI,
    HOSTNAME_KEY,
    Job,
    JobPhase,
    Node,
    PodTerm,
    Request,
    Spread,
    Tier,
    describe_affinity,
)
from scheduler.core.placement import Placement

T = TypeVar("T", bound=PodTerm)

WAITING_FOR_CAPACITY = "waiting for capacity"  # how a reason begins when capacity is what the job lacks


class Allocate(Action):
    name = "allocate"

    def execute(self, ssn: Session) -> None:
        for tier in (Tier.GUARANTEED, Tier.ELASTIC):
            self._tier(int(tier), ssn)

    def _tier(self, tier: int, ssn: Session) -> None:
        sched, fw = self.sched, self.sched.framework
        queues = sched.cluster.queues
        pending = sched.pending[tier]
        if not pending:
            return
        blocked_all = frozenset(sched.reserved_nodes())
        holders = [sched.cluster.jobs[j] for j in sched.reserved] if fw.hold_yields or fw.hold_lends else []
        if holders and fw.hold_yields:
            ssn.refresh_claims()  # what hold_yields compares against: the preemptors' and victims' capacity
        # with these nodes excluded, and these of them lent, nothing of the shape fits (and what that means
        # for a job like it)
        unfit: dict[tuple[frozenset[str], frozenset[str]], dict[ShapeKey, str]] = defaultdict(dict)
        skip: dict[str, set[ShapeKey]] = defaultdict(set)  # shapes a queue passes over
        passed = ssn.result.passed_over
        tried: set[str] = set()
        unfit_jobs: list[Job] = []  # failed this cycle: a smaller job starting after them bypasses them
        holding: dict[str, list[str]] = defaultdict(list)  # each queue's jobs that hold nodes
        for name in sched.reserved:
            holding[sched.cluster.jobs[name].queue].append(name)
        heap = [(fw.queue_key(queues[q], tier), q) for q in pending]
        heapq.heapify(heap)
        while heap:
            key, qname = heapq.heappop(heap)
            queue = queues[qname]
            if key != fw.queue_key(queue, tier):
                heapq.heappush(heap, (fw.queue_key(queue, tier), qname))
                continue
            head = sched.head(tier, qname, skip[qname], tried, holding.get(qname, ()))
            if head is None:
                continue
            _, name, shape = head
            job = sched.cluster.jobs[name]
            gate = fw.gated(job, ssn)
            if gate is not None:  # this job only: the queue's next one is looked at
                tried.add(name)
                job.reason = ssn.result.pending_reasons[name] = gate
                heapq.heappush(heap, (fw.queue_key(queue, tier), qname))
                continue
            own = name in sched.reserved
            privileged = job.phase is JobPhase.PRIVILEGED
            # A preemptor competes for its victims' capacity with other preemptors, as its victim
            # search assumed; everyone else keeps off every hold that does not yield to it.
            excluded = (sched.reserved_nodes(except_job=name, starving_only=privileged) if own
                        else self._held_from(job, holders, blocked_all, ssn))
            lent = frozenset() if own or not fw.hold_lends else self._lent_to(job, holders, excluded, ssn)
            if not own and shape in unfit[(excluded, lent)]:
                skip[qname].add(shape)  # told what the one like it was told: ordering alone changes no reason
                job.reason = ssn.result.pending_reasons[name] = unfit[(excluded, lent)][shape]
                passed[(tier, qname, shape)] = _like(job.reason, qname)
                heapq.heappush(heap, (fw.queue_key(queue, tier), qname))
                continue
            ssn.result.attempts += 1
            why = fw.blocked(queue, job)
            placed: list[Placement] | None = None
            if why is None:
                placed = self._place(job, excluded)
                if placed is None and lent:
                    placed = self._place(job, excluded - lent)
                    if placed is not None:
                        self._on_loan(job, placed, lent)
                if placed is None:
                    why = self._why_unfit(job, bool(excluded), ssn)
                    if own:
                        tried.add(name)
                    else:
                        unfit[(excluded, lent)][shape] = why
                        passed[(tier, qname, shape)] = _like(why, qname)
                        skip[qname].add(shape)
                    if privileged and not sched.victims.get(name):
                        # its victims are gone and it still does not fit: search again next cycle
                        job.phase = JobPhase.PENDING
                        sched.unhold(job)
                    elif privileged:
                        victims = list(sched.victims[name])
                        why = (f"preempting: waiting for {len(victims)} job(s) to leave at the end of their "
                               f"grace period ({', '.join(victims[:3])}{', ...' if len(victims) > 3 else ''})")
            else:
                skip[qname].add(shape)
                if own:  # head offers holders of a passed-over shape: once a cycle
                    tried.add(name)
                passed[(tier, qname, shape)] = why.partition(" (")[0]  # the queue's limit, not its live counts
            if placed is not None:
                note = (f"on loan on node(s) held for {', '.join(job.on_loan_from)}: it will be asked to leave, "
                        "with its grace period to checkpoint, once that job could start") if job.on_loan_from else ""
                sched.started(job, placed, ssn.now, ssn.result, note)
                demand = job.min_gpu()
                for f in unfit_jobs:
                    if f.min_gpu() > demand:
                        f.bypassed = True
            else:
                if len(unfit_jobs) < 64 and why is not None and not why.startswith("queue"):
                    unfit_jobs.append(job)
                job.reason = why or ""
                ssn.result.pending_reasons[name] = job.reason
                if not sched.config.backfill:  # strict FIFO: nothing may pass the first job that does not fit
                    passed[(tier, "", ())] = f"waiting for {name} to start first (first in, first out)"
                    return
            heapq.heappush(heap, (fw.queue_key(queue, tier), qname))

    def _held_from(self, job: Job, holders: list[Job], blocked_all: frozenset[str], ssn: Session) -> frozenset[str]:
        """The held nodes ``job`` must keep off: those of every holder whose hold does not yield to it."""
        fw, reserved = self.sched.framework, self.sched.reserved
        yielded = {h.name for h in holders if fw.yields_hold(job, h, ssn)}
        if not yielded:
            return blocked_all
        return frozenset(n for holder, nodes in reserved.items() if holder not in yielded for n in nodes)

    def _lent_to(self, job: Job, holders: list[Job], excluded: frozenset[str], ssn: Session) -> frozenset[str]:
        """The excluded nodes ``job`` may use on loan: those of every holder that lends to it."""
        fw, reserved = self.sched.framework, self.sched.reserved
        return frozenset(n for h in holders if fw.lends_hold(job, h, ssn)
                         for n in reserved.get(h.name, ()) if n in excluded)

    def _on_loan(self, job: Job, placed: list[Placement], lent: frozenset[str]) -> None:
        """Record whose held nodes the job started on: it is theirs to recall."""
        used = {p.node for p in placed}.intersection(lent)
        job.on_loan_from = tuple(h for h, nodes in self.sched.reserved.items() if used.intersection(nodes))
        if job.on_loan_from:
            self.sched.on_loan[job.name] = None

    def _place(self, job: Job, excluded: frozenset[str]) -> list[Placement] | None:
        """The gang's minimum all-or-nothing, then any replicas beyond it one by one, as room allows."""
        placer = self.sched.placer
        pending = job.pending()
        core = self.sched.gang_part(job)
        placed: list[Placement] = []
        if core:
            got = placer.place_gang(job, core, excluded)
            if got is None:
                return None
            placed += got
        for replica in pending[len(core):]:
            extra = placer.place_gang(job, [replica], excluded)
            if extra:
                placed += extra
        return placed or None

    def _never_fits(self, req: Request) -> str | None:
        """Why no schedulable node could host ``req`` even if it were empty ("cannot be scheduled: ..."; or
        "waiting for a node: ..." when nodes that could are cordoned or not ready), or None."""
        every = self.sched.cluster.nodes.values()
        why = _unhostable(req, [n for n in every if n.schedulable])
        if why is None:
            return None
        could = sum(1 for n in every if not n.schedulable and _unhostable(req, [n]) is None)
        if could:
            nodes = "1 node that could is" if could == 1 else f"{could} nodes that could are"
            return f"waiting for a node: {why} ({nodes} cordoned or not ready)"
        return f"cannot be scheduled: {why}"

    def _why_unfit(self, job: Job, reservations: bool, ssn: Session) -> str:
        tasks = job.task_by_name
        need = [tasks[r.task].request for r in job.pending()]
        for req in set(need):
            if req not in ssn.never:  # node capacities do not change within a cycle
                ssn.never[req] = self._never_fits(req)
            never = ssn.never[req]
            if never is not None:
                return never
        if crowded := (_too_few_domains(job, self.sched.cluster.nodes.values())
                       or _no_domain_holds(job, self.sched.cluster.nodes.values())):
            return f"cannot be scheduled: {crowded}"
        gpus = sum(r.gpu_total for r in need) / 1000
        biggest = max(need, key=lambda r: r.gpus, default=None)
        if biggest is None:
            largest, where = self.sched.placer.max_free_whole(), ""
        else:  # a replica that selects nodes is told of those nodes' room, not of nodes it may not use
            largest = self.sched.placer.max_free_whole_for(biggest)
            where = " on the nodes it may use" if biggest.selects or biggest.models else ""
        msg = (f"{WAITING_FOR_CAPACITY}: gang of {len(need)} replica(s) needs {gpus:g} GPUs all at once "
               f"(largest replica {biggest.gpus if biggest else 0} GPU(s) on one node; "
               f"largest free block now {largest}{where})")
        if biggest is not None and (barred := self.sched.placer.confined(job, biggest, frozenset())):
            msg += (f"; its pod affinity and anti-affinity rule out {len(barred)} of {len(self.sched.cluster.nodes)} "
                    "node(s) (pods it keeps away from, or that keep away from it, run there; or none it keeps "
                    "beside does)")
        if reservations:
            msg += "; some nodes are held for a longer-waiting job"
        return msg


def _too_few_domains(job: Job, nodes: Iterable[Node]) -> str | None:
    """Why the job's replicas that must keep apart (a required pod anti-affinity among them) could never
    all start: fewer domains could host them than its minimum needs. None for a job that states none."""
    tasks = job.task_by_name
    terms, minimum, schedulable = _own_terms(job, nodes, {a for t in job.tasks for a in t.request.apart})
    for a in terms:
        # replicas with the term that it selects each need a domain of their own; those it only selects
        # can share one, and so can those with it that it does not select, but not with each other
        sides = [(a in req.apart, a.term in req.marks, req) for r in job.replicas
                 for req in [tasks[r.task].request] if a in req.apart or a.term in req.marks]
        both = sum(1 for has, marked, _ in sides if has and marked)
        need = min(both + any(not has for has, _, _ in sides) + any(not marked for _, marked, _ in sides), minimum)
        requests = {req for _, _, req in sides}
        domains = {a.domain(n) for n in schedulable if any(_unhostable(req, [n]) is None for req in requests)}
        if need > 1 and None not in domains and len(domains) < need:
            where = "nodes" if a.key == HOSTNAME_KEY else f"values of node label {a.key}"
            return (f"its replicas keep apart by {a.key} (required pod anti-affinity), so they need {need} "
                    f"{where} and only {len(domains)} schedulable could host them")
    return None


def _no_domain_holds(job: Job, nodes: Iterable[Node]) -> str | None:
    """Why the job's replicas that keep together (a required pod affinity among them) or spread (a topology
    spread constraint) could never all start: no schedulable node that could host them has the term's
    label, or (together) no domain of it holds, empty, the GPUs of as many of them as the job's minimum.
    None for a job that states none."""
    tasks = job.task_by_name
    terms, minimum, schedulable = _own_terms(
        job, nodes, {t for task in job.tasks for t in (*task.request.together, *task.request.spread)})
    for t in terms:
        spread = isinstance(t, Spread)
        what = "spread by" if spread else "keep together by"
        rule = "topology spread constraint" if spread else "required pod affinity"
        group = [req for r in job.replicas for req in [tasks[r.task].request]
                 if t in req.together or t in req.spread or t.term in req.marks]
        room: dict[str, int] = defaultdict(int)
        for n in schedulable:
            if (d := t.domain(n)) is not None and any(_unhostable(req, [n]) is None for req in set(group)):
                room[d] += len(n.devices) * GPU_MILLI
        if not room:
            return f"its replicas {what} {t.key} ({rule}), and no schedulable node that could host them has that label"
        need = sum(sorted(req.gpu_total for req in group)[:max(minimum, 1)])
        where = "one node" if t.key == HOSTNAME_KEY else f"one value of node label {t.key}"
        if not spread and need > (largest := max(room.values())):
            return (f"its replicas keep together by {t.key} (required pod affinity), so they need {need / 1000:g} "
                    f"GPUs on {where} and the largest schedulable has {largest / 1000:g}")
    return None


def _own_terms(job: Job, nodes: Iterable[Node], terms: set[T]) -> tuple[list[T], int, list[Node]]:
    """The job's pod (anti-)affinity ``terms`` in a stable order, its minimum and the schedulable nodes;
    nothing to walk for a job that states none."""
    if not terms:
        return [], 0, []
    minimum = job.min_member if job.min_member is not None else sum(t.minimum for t in job.tasks)
    return sorted(terms, key=lambda t: (t.key, t.term)), minimum, [n for n in nodes if n.schedulable]


def _unhostable(req: Request, nodes: list[Node]) -> str | None:
    """Why none of ``nodes``, empty, could host ``req``, or None."""
    if not nodes:
        return "no schedulable node"
    if not any(len(n.devices) >= req.gpus for n in nodes):
        return f"no node has {req.gpus} GPUs (the largest has {max(len(n.devices) for n in nodes)})"
    if not any(n.cpu_milli >= req.cpu_milli and n.mem_mib >= req.mem_mib for n in nodes):
        return f"no node has {req.cpu_milli}m CPU and {req.mem_mib} MiB memory"
    if req.models and not any(n.model in req.models for n in nodes):
        return f"no node has a GPU of model {' or '.join(sorted(req.models))}"
    if req.selector and not any(all(n.labels.get(k) == v for k, v in req.selector) for n in nodes):
        wanted = ",".join(f"{k}={v}" for k, v in sorted(req.selector))
        return f"no node matches the node selector {wanted}"
    if req.affinity and not any(req.admits(n) for n in nodes):
        return f"no node matches the node affinity {describe_affinity(req.affinity)}"
    return None


def _like(why: str, queue: str) -> str:
    """What the jobs behind one that did not fit, of its queue and with its request, are told: the same
    when no schedulable node could hold it; else words that stay the same while they wait (the counts in
    the first one's reason change every cycle, and each change would be written again for every job
    behind it)."""
    if why.startswith(("cannot be scheduled", "waiting for a node")):
        return why
    return f"{WAITING_FOR_CAPACITY}: an earlier job of queue {queue} with the same request does not fit yet"
