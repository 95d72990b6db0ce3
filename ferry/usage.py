"""``kubectl ferry usage``: GPU-seconds per queue or per job over a time range, from the scheduler's
``UsageRecord`` objects (pods that ended) plus the pods running now (counted up to the present).
A run counts only for the part of it inside the range."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from ferry.keys import API_GROUP, API_VERSION
from ferry.kube.rest import Rest, path
from ferry.kube.timestamps import rfc3339
from scheduler.service.accounting import run_of

Obj = dict[str, Any]
GROUP, VERSION = API_GROUP, API_VERSION
COLUMNS = {"queue": ("QUEUE", "GPU-SECONDS", "GPU-HOURS", "JOBS", "PODS"),
           "job": ("NAMESPACE", "JOB", "QUEUE", "GPU-SECONDS", "GPU-HOURS", "PODS", "START", "END")}


def when(text: str | None, now: datetime) -> datetime | None:
    """An RFC 3339 time, or a duration back from now (``90m``, ``24h``, ``1d12h``)."""
    if not text:
        return None
    if re.fullmatch(r"(?:\d+(?:\.\d+)?[smhd])+", text):
        units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
        return now - sum((timedelta(**{units[u]: float(n)}) for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)),
                         timedelta())
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither an RFC 3339 time nor a duration like 24h") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def runs(records: Iterable[Obj], live: Iterable[Obj]) -> list[Obj]:
    """Every run: (namespace, job, queue, pod uid, start, end, gpu milli); a running pod once."""
    out, seen = [], set()
    for rec in records:
        spec = rec.get("spec") or {}
        for uid, p in (spec.get("pods") or {}).items():
            seen.add(uid)
            out.append({"namespace": spec.get("namespace", ""), "job": spec.get("job", ""),
                        "queue": spec.get("queue", ""), "uid": uid, "start": p["start"], "end": p["end"],
                        "gpuMilli": int(p.get("gpuMilli", 0))})
    out += [r for r in live if r["uid"] not in seen]
    return out


def summarise(all_runs: list[Obj], since: datetime | None, until: datetime, by: str) -> list[Obj]:
    rows: dict[tuple[str, ...], Obj] = {}
    jobs: dict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)
    for r in all_runs:
        run_start, run_end = _ts(r["start"]), _ts(r["end"])
        if run_start > until or (since is not None and run_end < since):
            continue  # outside the range
        start, end = max(run_start, since) if since is not None else run_start, min(run_end, until)
        seconds = max(0.0, (end - start).total_seconds()) * r["gpuMilli"] / 1000
        key: tuple[str, ...] = (r["queue"],) if by == "queue" else (r["namespace"], r["job"], r["queue"])
        row = rows.setdefault(key, {"QUEUE": r["queue"], "NAMESPACE": r["namespace"], "JOB": r["job"],
                                    "GPU-SECONDS": 0.0, "PODS": 0, "START": r["start"], "END": r["end"]})
        row["GPU-SECONDS"] += seconds
        row["PODS"] += 1
        row["START"], row["END"] = min(row["START"], r["start"]), max(row["END"], r["end"])
        jobs[key].add((r["namespace"], r["job"]))
    out = []
    for key, row in sorted(rows.items()):
        row["GPU-SECONDS"] = round(row["GPU-SECONDS"], 1)
        row["GPU-HOURS"] = round(row["GPU-SECONDS"] / 3600, 3)
        row["JOBS"] = len(jobs[key])
        out.append(row)
    return out


async def collect(rest: Rest, since: datetime | None, until: datetime | None, by: str) -> list[Obj]:
    now = datetime.now(UTC)
    records = (await rest.get(path(GROUP, VERSION, "usagerecords")))["items"]
    groups = {f"{g['metadata']['namespace']}/{g['metadata']['name']}": g
              for g in (await rest.get(path(GROUP, VERSION, "podgroups")))["items"]}
    queues = {q["metadata"]["name"]: q for q in (await rest.get(path(GROUP, VERSION, "queues")))["items"]}
    stamp = rfc3339(now.timestamp())
    live = []
    for pod in (await rest.get(path("", "v1", "pods"), fieldSelector="status.phase=Running"))["items"]:
        if (run := run_of(pod, groups, queues, stamp)) is not None:
            live.append({"namespace": run.namespace, "job": run.job, "queue": run.queue, "uid": run.uid,
                         "start": run.start, "end": stamp, "gpuMilli": run.gpu_milli})
    return summarise(runs(records, live), since, until or now, by)
