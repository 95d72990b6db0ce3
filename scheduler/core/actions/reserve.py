"""reserve: a job that waited too long while smaller jobs passed it holds nodes until they drain for it;
jobs that started there on loan (``hold_lends``) are recalled as soon as it could start without them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from scheduler.core.actions.victims import fewest, tell_to_leave, work_lost
from scheduler.core.framework import Action, OrderKey, Session
from scheduler.core.model import Job, JobPhase, Node, Together
from scheduler.core.statement import Statement

LOAN_RECALL = "loan-recall"  # the rule a recalled loan's notice names


class Reserve(Action):
    name = "reserve"

    def execute(self, ssn: Session) -> None:
        """Jobs that waited past the threshold while smaller jobs passed them (longest first) hold the
        nodes that should drain soonest. A job nobody passes needs no hold: it gets the next capacity.

        Holds are recomputed every cycle: held nodes get no new work, so they only get emptier and
        normally stay chosen; a node stuck behind a long job is swapped for one that drains sooner, but never
        for one another waiting job held: the emptiest nodes are those another hold drained, and a growing
        hedge that took them would make that job start draining again."""
        sched, cfg, now = self.sched, self.sched.config, ssn.now
        if cfg.reservation_after_s is None:
            return
        jobs = sched.cluster.jobs
        previous = {j: nodes for j, nodes in sched.reserved.items() if jobs[j].phase is not JobPhase.PRIVILEGED}
        for name in previous:
            sched.unhold(jobs[name])
        starving: list[tuple[OrderKey, str]] = []
        for tier in sched.pending.values():
            for groups in tier.values():
                for group in groups.values():
                    for key, name in group[:3]:
                        job = jobs[name]
                        if now - job.submit_time < cfg.reservation_after_s:
                            break
                        if job.phase is JobPhase.PENDING and job.bypassed and sched.framework.gated(job, ssn) is None:
                            starving.append((key, name))
        if not starving:
            self._recall_loans(ssn)
            return
        capacity = sched.placer.capacity
        held = self._gpu_size(sched.reserved_nodes())
        age = self._occupant_age(now)
        waiting = {name for _, name in starving}
        kept = frozenset(n for other, nodes in previous.items() if other in waiting for n in nodes)
        for _, name in sorted(starving):
            job = jobs[name]
            # The hold doubles with every further threshold period waited, up to max_hold_doublings and
            # within the budget: the longer a job has waited, the more nodes drain for it (the first to
            # empty take it).
            periods = int((now - job.submit_time) // cfg.reservation_after_s) - 1
            nodes = self._pick(job, age, min(periods, cfg.max_hold_doublings), previous.get(name, ()), kept)
            if nodes is None:
                continue
            size = self._gpu_size(nodes)
            budget = cfg.max_reserved_fraction * capacity - held
            if size > budget:  # trim the hedge to the budget, never below what the gang needs
                keep = len(job.pending())
                while keep < len(nodes) and self._gpu_size(nodes[: keep + 1]) <= budget:
                    keep += 1
                nodes = nodes[:keep]
                size = self._gpu_size(nodes)
                if held and size > budget:
                    break  # the longest-waiting job always gets its hold; later ones share what is left
            held += size
            sched.hold(job, nodes)
            job.reason = (f"waited {now - job.submit_time:.0f} s: holding node(s) {', '.join(nodes)} "
                          "until they drain; backfill continues elsewhere")
        self._recall_loans(ssn)

    def due(self, waiting: list[Job], now: float) -> Iterable[float]:
        """A job's next waiting period: it may get a hold, or a bigger one."""
        after = self.sched.config.reservation_after_s
        if after is None:
            return ()
        return (job.submit_time + ((now - job.submit_time) // after + 1) * after for job in waiting)

    def _recall_loans(self, ssn: Session) -> None:
        """A holder that could start on its nodes if the jobs on loan there left recalls them, fewest and
        cheapest: they get their notice and grace, and it waits for them as a preemptor for its victims.
        A job on loan from holders that no longer hold anything is on loan no more."""
        sched = self.sched
        if not sched.on_loan:
            return
        jobs, nodes = sched.cluster.jobs, sched.cluster.nodes
        on_node: dict[str, list[tuple[Job, int]]] = defaultdict(list)  # node -> (job on loan, GPU milli there)
        for name in list(sched.on_loan):
            job = jobs[name]
            if not any(h in sched.reserved for h in job.on_loan_from):
                job.on_loan_from = ()
                del sched.on_loan[name]
            elif job.phase is JobPhase.RUNNING:
                tasks = job.task_by_name
                for r in job.bound():
                    if r.node is not None:
                        on_node[r.node].append((job, tasks[r.task].request.gpu_total))
        for holder_name, held in sorted(sched.reserved.items(), key=lambda kv: jobs[kv[0]].submit_time):
            holder = jobs[holder_name]
            if holder.phase is not JobPhase.PENDING:
                continue
            loaners: dict[str, Job] = {}
            room: list[int] = []  # per held node: what it would have free without the jobs on loan from holder
            for n in held:
                mine = [(j, gpu) for j, gpu in on_node.get(n, ()) if holder_name in j.on_loan_from]
                loaners.update((j.name, j) for j, _ in mine)
                room.append((nodes[n].free_gpu_milli if n in nodes else 0) + sum(gpu for _, gpu in mine))
            if not loaners or not _could_hold(holder, room):
                continue  # its own occupants still run: nothing to try
            self._recall(holder, held, list(loaners.values()), ssn)

    def _recall(self, holder: Job, held: tuple[str, ...], loaners: list[Job], ssn: Session) -> None:
        """Recall the fewest, cheapest loans the holder needs gone, of those the plugins let it recall."""
        sched, now = self.sched, ssn.now
        ssn.refresh_claims()
        loaners = sched.framework.recallable(holder, sorted(loaners, key=lambda j: (work_lost(j, now), j.name)), ssn)
        if not loaners:
            return
        gang = sched.gang_part(holder)
        inside = set(held)
        outside = frozenset(n for n in sched.cluster.nodes if n not in inside)
        with Statement(sched.placer) as st:
            for job in loaners:
                st.lift(job)
            if st.fits(holder, gang, outside) is None:
                return  # its own occupants still run
            chosen = list(loaners)
            fewest(st, holder, gang, outside, chosen, lambda v: -work_lost(v, now))
            trial = st.fits(holder, gang, outside)
            assert trial is not None, "recall set stopped fitting"
            if not chosen:
                return  # it fits as things are: allocate starts it
            nodes = tuple(sorted({p.node for p in trial}))
        tell_to_leave(ssn, holder, nodes, chosen, lambda v: LOAN_RECALL,
                      lambda v: f"on loan on node(s) held for {holder.name}, which can start now",
                      f"recalling {len(chosen)} job(s) on loan on its held node(s): "
                      + ", ".join(v.name for v in chosen))

    def _gpu_size(self, names: Iterable[str]) -> int:
        """GPU milli of whole nodes."""
        nodes = self.sched.cluster.nodes
        return sum(len(nodes[n].devices) * 1000 for n in names)

    def _occupant_age(self, now: float) -> dict[str, float]:
        """Per node, how long its longest-running job has run. Job run times are heavy-tailed: the
        longer a job has run, the longer it is likely to go on, so young occupants drain first."""
        age: dict[str, float] = defaultdict(float)
        for job in self.sched.cluster.jobs.values():
            if job.phase.holds_resources and job.start_time is not None:
                for r in job.replicas:
                    if r.node is not None:
                        age[r.node] = max(age[r.node], now - job.start_time)
        return age

    def _pick(self, job: Job, age: dict[str, float], extra: int = 0, held: tuple[str, ...] = (),
              kept: frozenset[str] = frozenset()) -> tuple[str, ...] | None:
        """Nodes that should drain soonest for the gang, keeping the ones already held (they only get
        emptier). Run times are heavy-tailed, so a node whose oldest job is young drains first; after
        ``extra`` doublings the hold is that many times larger, hedging against nodes that do not drain.
        ``kept``: nodes held last cycle for waiting jobs, which only their own holder picks again."""
        tasks = job.task_by_name
        taken = set(self.sched.reserved_nodes(except_job=job.name)) | (kept - set(held))
        need = sorted((tasks[r.task].request for r in job.pending()), key=lambda q: -q.gpu_total)
        if not need:
            return None
        biggest = need[0]
        want = len(need) * (2 ** max(extra, 0) if biggest.gpus > 1 else 1)

        def usable(n: Node) -> bool:
            return (n.schedulable and n.name not in taken and len(n.devices) >= biggest.gpus
                    and n.cpu_milli >= biggest.cpu_milli and n.mem_mib >= biggest.mem_mib
                    and (not biggest.models or n.model in biggest.models)
                    and biggest.admits(n))

        nodes = self.sched.cluster.nodes
        terms = sorted({t for r in job.pending() for t in tasks[r.task].request.together}, key=lambda t: t.term)
        if terms:
            return self._pick_in_one_domain(job, terms, [n for n in nodes.values() if usable(n)], age, extra, held)
        chosen = [n for n in held if n in nodes and usable(nodes[n])][:want]
        if len(chosen) < want:
            picked = set(chosen)
            domain = nodes[chosen[0]].domain if chosen else None
            options = sorted((n for n in nodes.values() if usable(n) and n.name not in picked),
                             key=lambda n: (age.get(n.name, 0.0), n.domain != domain, -n.free_gpu_milli, n.name))
            chosen += [n.name for n in options[: want - len(chosen)]]
        return tuple(chosen) if len(chosen) >= len(need) else None


    def _pick_in_one_domain(self, job: Job, terms: list[Together], usable: list[Node], age: dict[str, float],
                            extra: int, held: tuple[str, ...]) -> tuple[str, ...] | None:
        """For a gang whose replicas keep together (required pod affinity): nodes of one domain only, which
        drained could take the whole gang -- nodes held across domains would drain for nothing. Of the domains
        that can, the one holding last cycle's nodes (they only get emptier), else the one whose slowest
        needed node should drain soonest; after ``extra`` doublings the hold takes that many times more of
        its nodes."""
        kept = set(held)
        by_domain: dict[tuple[str, ...], list[Node]] = defaultdict(list)
        for n in usable:
            domain = tuple(t.domain(n) for t in terms)
            if None not in domain:  # a node without the label is in no domain: the gang cannot start there
                by_domain[tuple(d or "" for d in domain)].append(n)
        best: tuple[tuple[bool, float, tuple[str, ...]], tuple[str, ...]] | None = None
        for domain, members in by_domain.items():
            members.sort(key=lambda n: (n.name not in kept, age.get(n.name, 0.0), -n.free_gpu_milli, n.name))
            need = next((k for k in range(1, len(members) + 1)
                         if _could_hold(job, [len(n.devices) * 1000 for n in members[:k]])), None)
            if need is None:
                continue  # the domain cannot take the whole gang
            rank = (not any(n.name in kept for n in members[:need]), max(age.get(n.name, 0.0) for n in members[:need]),
                    domain)
            chosen = tuple(n.name for n in members[: need * 2 ** max(extra, 0)])
            if best is None or rank < best[0]:
                best = (rank, chosen)
        return None if best is None else best[1]


def _could_hold(job: Job, room: list[int]) -> bool:
    """Whether nodes with this much room each (GPU milli) could take the job's pending replicas, largest
    first on the roomiest: a cheap test before a trial placement (CPU, memory and devices not counted)."""
    tasks = job.task_by_name
    need = sorted((tasks[r.task].request.gpu_total for r in job.pending()), reverse=True)
    free = sorted(room, reverse=True)
    for gpu in need:
        if not free or free[0] < gpu:
            return False
        free[0] -= gpu
        free.sort(reverse=True)
    return True
