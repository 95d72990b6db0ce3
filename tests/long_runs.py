"""What the long checks outside ``make test`` (``make soak``, ``make overload``) share: their command
line's common flags, two-tenant control planes of their own, and timestamped progress lines."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ferry import binaries
from ferry.cluster.planes import ControlPlanes, Shape, clean_dir
from ferry.log import configure


def say(line: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {line}", flush=True)


def parser(prog: str, doc: str | None, gpu_nodes: int, workdir: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.splitlines()[0] if doc else "")
    p.add_argument("--gpu-nodes", type=int, default=gpu_nodes)
    p.add_argument("--workdir", type=Path, default=Path(workdir))
    p.add_argument("--results", default="results", help="folder for the JSON figures")
    return p


def two_tenants(args: argparse.Namespace, own_etcd: tuple[str, ...] = ()) -> ControlPlanes:
    """Fresh control planes (compute with ``--gpu-nodes`` kwok nodes × 8 GPUs, two tenants; ``own_etcd``:
    clusters not sharing the one etcd), prepared; the caller adds Kube-Ferry's components and starts them."""
    configure("warning")
    clean_dir(args.workdir)
    planes = ControlPlanes(args.workdir, Shape(tenants=2, gpu_nodes=args.gpu_nodes, gpus_per_node=8, own_etcd=own_etcd),
                           binaries.ensure())
    planes.prepare()
    return planes


def write_results(args: argparse.Namespace, kind: str, figures: dict[str, Any]) -> Path:
    """``<--results>/<kind>-<UTC time>/<kind>.json``; returns the file."""
    folder = Path(args.results) / f"{kind}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{kind}.json"
    target.write_text(json.dumps(figures, indent=2))
    return target


async def metrics_text(port: int) -> str | None:
    """A local component's Prometheus metrics (None while it does not answer)."""
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


def samples(text: str, *names: str) -> Iterator[Sample]:
    """The samples of the named series (``_sum``/``_count`` included) in Prometheus text."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                yield sample
