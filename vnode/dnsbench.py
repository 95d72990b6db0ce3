"""``make bench-dns``: how fast `ferry dns` answers, beside CoreDNS (the compute cluster's own DNS) in the same run.

Both serve the same 10,000 peer names (``w-<i>.ring.ml.svc.cluster.local``): `ferry dns` from its index of
bridged pods, CoreDNS (built from its Go module, ``hosts`` plugin) from a hosts file. One client process
sends the same random sequence of queries to each, keeping ``--window`` queries in flight, and prints the
rate and the latency of answers. Then names `ferry dns` does not know, which it relays to that CoreDNS: the
cost of putting it in front of the cluster's DNS for everything else. Both servers and the client share
this machine's cores; the ratio is the figure, not the absolute rates.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dnslib import DNSRecord

from ferry.binaries import BuildError
from ferry.binaries.peers import ensure_coredns
from vnode import naming
from vnode.dnsserver import PeerDNS, serve
from vnode.peernames import PeerIndex

ZONE = "cluster.local"
TENANT, NS = "t1", "ml"
CLIENT_IP = "127.0.0.1"  # the asking pod: the client's address


def ip_of(i: int) -> str:
    return f"10.{1 + i // 65536}.{i // 256 % 256}.{i % 256}"


def peer_index(peers: int) -> PeerIndex:
    """``peers`` bridged pods of one tenant, and the client's address as one more of its pods."""
    index = PeerIndex()
    sub = naming.compute_name(TENANT, NS, "ring")
    labels = {naming.TENANT_LABEL: TENANT, naming.UPSTREAM_NS_LABEL: NS}
    for i, (host, ip) in enumerate([*((f"w-{i}", ip_of(i)) for i in range(peers)), ("client", CLIENT_IP)]):
        index.update(f"{TENANT}/p{i}", {"metadata": {"name": f"p{i}", "namespace": TENANT, "labels": labels},
                                        "spec": {"hostname": host, "subdomain": sub},
                                        "status": {"podIP": ip, "phase": "Running"}})
    return index


def _serve_ferry(peers: int, port: int, upstream_port: int, ready: Any) -> None:
    async def main() -> None:
        index = peer_index(peers)
        async with asyncio.TaskGroup() as tg:
            await serve(PeerDNS(index, ZONE, ("127.0.0.1", upstream_port)), "127.0.0.1", port, tg)
            ready.set()
            await asyncio.Event().wait()

    asyncio.run(main())


async def load(port: int, names: list[str], window: int) -> tuple[float, list[float], int]:
    """Send every query of ``names`` (``window`` in flight), return queries/s, latencies (ms), failures."""
    loop = asyncio.get_running_loop()
    pending: dict[int, tuple[float, asyncio.Future[bytes]]] = {}

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            entry = pending.pop(int.from_bytes(data[:2], "big"), None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    latencies: list[float] = []
    failures = 0
    it = iter(enumerate(names))

    async def worker() -> None:
        nonlocal failures
        for i, name in it:
            qid = i % 65536
            query = DNSRecord.question(name)
            query.header.id = qid
            got: asyncio.Future[bytes] = loop.create_future()
            start = time.perf_counter()
            pending[qid] = (start, got)
            transport.sendto(query.pack())
            try:
                async with asyncio.timeout(2):
                    reply = DNSRecord.parse(await got)
                if reply.header.rcode != 0 or not reply.rr:
                    failures += 1
                latencies.append((time.perf_counter() - start) * 1000)
            except TimeoutError:
                pending.pop(qid, None)
                failures += 1

    started = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(window):
                tg.create_task(worker())
    finally:
        transport.close()
    return len(names) / (time.perf_counter() - started), latencies, failures


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(port: int, names: list[str], window: int, pids: list[int]) -> tuple[float, list[float], int, float]:
    """:func:`load`, and the CPU the servers ``pids`` spent per query (µs)."""
    before = sum(cpu_seconds(p) for p in pids)
    qps, lat, failures = asyncio.run(load(port, names, window))
    return qps, lat, failures, (sum(cpu_seconds(p) for p in pids) - before) / len(names) * 1e6


def _line(what: str, result: tuple[float, list[float], int, float]) -> str:
    qps, lat, failures, cpu = result
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [0.0] * 99
    return (f"{what:<44} {qps:>7,.0f} q/s  p50 {q[49]:5.2f} ms  p99 {q[98]:5.2f} ms  server CPU {cpu:5.0f} µs/query"
            f"  failed {failures}")


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vnode.dnsbench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=32, help="queries in flight")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        coredns = ensure_coredns()
    except BuildError as exc:
        print(f"bench-dns: CoreDNS could not be built: {exc}", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    peers = [f"w-{rng.randrange(args.peers)}.ring.{NS}.svc.{ZONE}." for _ in range(args.queries)]
    others = [f"x-{rng.randrange(args.peers)}.example.org." for _ in range(args.queries)]
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Path(tmp) / "hosts"
        hosts.write_text("".join(f"{ip_of(i)} w-{i}.ring.{NS}.svc.{ZONE} x-{i}.example.org\n"
                                 for i in range(args.peers)))
        core_port, ferry_port = _free_port(), _free_port()
        (Path(tmp) / "Corefile").write_text(f".:{core_port} {{\n  bind 127.0.0.1\n  hosts {hosts} {{\n"
                                            f"    no_reverse\n  }}\n}}\n")
        core = subprocess.Popen([str(coredns), "-conf", str(Path(tmp) / "Corefile")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        ready = multiprocessing.Event()
        ferry = multiprocessing.Process(target=_serve_ferry, args=(args.peers, ferry_port, core_port, ready),
                                        daemon=True)
        ferry.start()
        try:
            if not ready.wait(60):
                raise SystemExit("bench-dns: ferry dns did not start")
            _wait_answering(core_port, peers[0])
            print(f"{args.queries:,} queries of {args.peers:,} peer names, {args.window} in flight, "
                  f"CoreDNS {coredns.parent.name}")
            assert ferry.pid is not None
            both = [ferry.pid, core.pid]
            results = [("peer names: ferry dns (its index)", measured(ferry_port, peers, args.window, [ferry.pid])),
                       ("peer names: CoreDNS (hosts file)", measured(core_port, peers, args.window, [core.pid])),
                       ("other names: ferry dns relaying to CoreDNS", measured(ferry_port, others, args.window, both)),
                       ("other names: CoreDNS alone", measured(core_port, others, args.window, [core.pid]))]
            for what, result in results:
                print(_line(what, result))
            print(f"ferry dns / CoreDNS: q/s {results[0][1][0] / results[1][1][0]:.2f} (peer names), "
                  f"{results[2][1][0] / results[3][1][0]:.2f} (relayed); server CPU per query "
                  f"{results[0][1][3] / results[1][1][3]:.1f}x (peer names), "
                  f"{results[2][1][3] / results[3][1][3]:.1f}x (relayed, both servers). The client, one Python "
                  f"process, shares the two cores: the rates are the client's as much as the servers'.")
        finally:
            ferry.terminate()
            core.terminate()
            core.wait(10)
    return 0


def _wait_answering(port: int, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            DNSRecord.parse(DNSRecord.question(name).send("127.0.0.1", port, timeout=1))
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("bench-dns: CoreDNS did not answer")


if __name__ == "__main__":
    raise SystemExit(main())
