"""reserve: a job that waited too long while smaller jobs passed it holds nodes until they drain for it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from scheduler.core.framework import Action, OrderKey, Session
from scheduler.core.model import Job, JobPhase, Node


class Reserve(Action):
    name = "reserve"

    def execute(self, ssn: Session) -> None:
        """Jobs that waited past the threshold while smaller jobs passed them (longest first) hold the
        nodes that should drain soonest. A job nobody passes needs no hold: it gets the next capacity.

        Holds are recomputed every cycle: held nodes get no new work, so they only get emptier and
        normally stay chosen; a node stuck behind a long job is swapped for one that drains sooner."""
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
            return
        capacity = sched.placer.capacity
        held = self._gpu_size(sched.reserved_nodes())
        age = self._occupant_age(now)
        for _, name in sorted(starving):
            job = jobs[name]
            # The hold doubles with every further threshold period waited, up to max_hold_doublings and
            # within the budget: the longer a job has waited, the more nodes drain for it (the first to
            # empty take it).
            periods = int((now - job.submit_time) // cfg.reservation_after_s) - 1
            nodes = self._pick(job, age, min(periods, cfg.max_hold_doublings), previous.get(name, ()))
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

    def _pick(self, job: Job, age: dict[str, float], extra: int = 0,
              held: tuple[str, ...] = ()) -> tuple[str, ...] | None:
        """Nodes that should drain soonest for the gang, keeping the ones already held (they only get
        emptier). Run times are heavy-tailed, so a node whose oldest job is young drains first; after
        ``extra`` doublings the hold is that many times larger, hedging against nodes that do not drain."""
        tasks = job.task_by_name
        taken = set(self.sched.reserved_nodes(except_job=job.name))
        need = sorted((tasks[r.task].request for r in job.pending()), key=lambda q: -q.gpu_total)
        if not need:
            return None
        biggest = need[0]
        want = len(need) * (2 ** max(extra, 0) if biggest.gpus > 1 else 1)

        def usable(n: Node) -> bool:
            return (n.schedulable and n.name not in taken and len(n.devices) >= biggest.gpus
                    and n.cpu_milli >= biggest.cpu_milli and n.mem_mib >= biggest.mem_mib
                    and (not biggest.models or n.model in biggest.models))

        nodes = self.sched.cluster.nodes
        chosen = [n for n in held if n in nodes and usable(nodes[n])][:want]
        if len(chosen) < want:
            picked = set(chosen)
            domain = nodes[chosen[0]].domain if chosen else None
            options = sorted((n for n in nodes.values() if usable(n) and n.name not in picked),
                             key=lambda n: (age.get(n.name, 0.0), n.domain != domain, -n.free_gpu_milli, n.name))
            chosen += [n.name for n in options[: want - len(chosen)]]
        return tuple(chosen) if len(chosen) >= len(need) else None
