"""kubectl exec / attach / port-forward / cp against a tenant apiserver, through the virtual node's
kubelet API to the compute pod (kwok answers: exec runs in the planes' pod-root/, attach follows
attach.log, every port echoes). Both protocols are used: WebSocket (kubectl's default, passed through
because the virtual node declares ExtendWebSocketsToKubelet) and SPDY/3.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import subprocess
import uuid
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import api_client, eventually, vnode_metrics
from tests.integration.test_vnode import running_pair

pytestmark = pytest.mark.usefixtures("vnodes")
SPDY = {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false", "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}


def run(planes: ControlPlanes, *args: str, kubeconfig: Path | None = None, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    kc = kubeconfig or planes.kubeconfig("tenant-1")
    return subprocess.run([str(planes.bin.path("kubectl")), f"--kubeconfig={kc}", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **(env or {})})


def streams_relayed(vnode: Component, kind: str, protocol: str) -> float:
    """The vnode's count of relayed streams of a kind and protocol (its /metrics)."""
    return vnode_metrics(vnode).get(f'kube_ferry_vnode_streams_total{{kind="{kind}",protocol="{protocol}"}}', 0.0)


@pytest.mark.parametrize("env", [{}, SPDY], ids=["websocket", "spdy"])
async def test_kubectl_exec_returns_output_stdin_and_exit_status(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        vnodes: dict[str, Component], env: dict[str, str]) -> None:
    core = client.CoreV1Api(tenant_api)
    await running_pair(core, compute_api, tenant_ns, "shell")
    protocol = "spdy/3.1" if env else "websocket"
    before = streams_relayed(vnodes["tenant-1"], "exec", protocol)

    out = run(planes, "exec", "-n", tenant_ns, "shell", "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2",
              env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "to-stdout\n" and "to-stderr" in out.stderr

    piped = run(planes, "exec", "-i", "-n", tenant_ns, "shell", "--", "head", "-n", "1", stdin="from-stdin\n",
                env=env)
    assert (piped.returncode, piped.stdout) == (0, "from-stdin\n"), piped.stderr

    # kwok reports a non-zero exit as an internal error carrying the status (a kubelet reports the
    # code itself); either way the failure crosses the bridge as the compute side said it.
    failed = run(planes, "exec", "-n", tenant_ns, "shell", "--", "sh", "-c", "exit 3", env=env)
    assert failed.returncode != 0 and "exit status 3" in failed.stderr
    assert streams_relayed(vnodes["tenant-1"], "exec", protocol) == before + 3, \
        "the tenant apiserver reached the vnode with the protocol kubectl chose"


async def test_kubectl_cp_copies_a_file_out_of_the_pod(planes: ControlPlanes, tenant_api: client.ApiClient,
                                                        compute_api: client.ApiClient, tenant_ns: str,
                                                        tmp_path: Path) -> None:
    await running_pair(client.CoreV1Api(tenant_api), compute_api, tenant_ns, "holder")
    name = f"result-{uuid.uuid4().hex[:6]}.txt"
    payload = "".join(f"line {i} of a checkpoint\n" for i in range(2000))
    (planes.dir / "compute" / "pod-root" / name).write_text(payload)
    res = run(planes, "cp", f"{tenant_ns}/holder:{name}", str(tmp_path / name))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / name).read_text() == payload


@pytest.mark.parametrize("env", [{}, SPDY], ids=["websocket", "spdy"])
async def test_kubectl_port_forward_carries_bytes_both_ways(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        env: dict[str, str]) -> None:
    await running_pair(client.CoreV1Api(tenant_api), compute_api, tenant_ns, "server")
    proc = await asyncio.create_subprocess_exec(
        str(planes.bin.path("kubectl")), f"--kubeconfig={planes.kubeconfig('tenant-1')}", "port-forward",
        "-n", tenant_ns, "pod/server", ":8080", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env})
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        port = int(re.search(r"127\.0\.0\.1:(\d+) ->", line).group(1))  # type: ignore[union-attr]
        for attempt in range(2):  # two connections over one forward
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sent = f"ping {attempt} ".encode() * 5000
            writer.write(sent)
            await writer.drain()
            got = await asyncio.wait_for(reader.readexactly(len(sent)), 30)
            assert got == sent, "the pod's port (an echo) answered through the tenant cluster"
            writer.close()
    finally:
        proc.kill()
        await proc.wait()


async def test_kubectl_attach_follows_the_container(planes: ControlPlanes, tenant_api: client.ApiClient,
                                                     compute_api: client.ApiClient, tenant_ns: str) -> None:
    await running_pair(client.CoreV1Api(tenant_api), compute_api, tenant_ns, "attached")
    marker = f"attached-{uuid.uuid4().hex[:6]}"
    proc = await asyncio.create_subprocess_exec(
        str(planes.bin.path("kubectl")), f"--kubeconfig={planes.kubeconfig('tenant-1')}", "attach",
        "-n", tenant_ns, "attached", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        lines: list[str] = []

        async def seen() -> bool:
            # attach shows what the container writes from now on: write until a line comes through.
            with (planes.dir / "compute" / "attach.log").open("a") as f:
                f.write(f"2026-01-01T00:00:00.000000000Z stdout F {marker}\n")
            with contextlib.suppress(TimeoutError):
                lines.append((await asyncio.wait_for(proc.stdout.readline(), 0.5)).decode())  # type: ignore[union-attr]
            return any(marker in ln for ln in lines)

        await eventually(seen, timeout=30, what="a line written by the container reaches kubectl attach")
    finally:
        proc.kill()
        await proc.wait()


async def test_streams_refuse_strangers(planes: ControlPlanes, tenant_api: client.ApiClient,
                                        compute_api: client.ApiClient, tenant_ns: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(tenant_api)
    await running_pair(core, compute_api, tenant_ns, "guarded")
    # A user of the tenant cluster without pods/exec: the tenant apiserver refuses.
    await core.create_namespaced_service_account(tenant_ns, {"metadata": {"name": "viewer"}})
    token = (await core.create_namespaced_service_account_token(
        "viewer", tenant_ns, {"spec": {"expirationSeconds": 600}})).status.token
    pki = planes.clusters["tenant-1"].pki
    kc = tmp_path / "viewer.kubeconfig"
    kc.write_text(f"apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: "
                  f"{planes.clusters['tenant-1'].server}\n    certificate-authority: {pki / 'ca.crt'}\n"
                  f"users:\n- name: viewer\n  user:\n    token: {token}\ncontexts:\n- name: t\n  context:\n"
                  f"    cluster: t\n    user: viewer\ncurrent-context: t\n")
    refused = run(planes, "exec", "-n", tenant_ns, "guarded", "--", "echo", "no", kubeconfig=kc)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()

    # Straight at the kubelet API: no credentials, another tenant's token, a token without
    # nodes/proxy — none gets a stream; the other tenant's own virtual node does not know the pod.
    node = await core.read_node("ferry-tenant-1")
    url = f"https://127.0.0.1:{node.status.daemon_endpoints.kubelet_endpoint.port}/exec/{tenant_ns}/guarded/main"
    upgrade = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": "v4.channel.k8s.io"}
    async with api_client(planes.kubeconfig("tenant-2")) as t2:
        t2core = client.CoreV1Api(t2)
        other = (await t2core.create_namespaced_service_account_token(
            "default", "default", {"spec": {"expirationSeconds": 600}})).status.token
        t2node = await t2core.read_node("ferry-tenant-2")
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    query = "command=echo&command=stolen&output=1"
    async with aiohttp.ClientSession() as http:
        for headers, want in (({}, 401), ({"Authorization": f"Bearer {other}"}, 401),
                              ({"Authorization": f"Bearer {token}"}, 403)):
            async with http.post(f"{url}?{query}", ssl=ctx, headers={**upgrade, **headers}) as resp:
                assert resp.status == want, (headers.keys(), await resp.text())
    ctx2 = ssl.create_default_context(cafile=str(planes.clusters["tenant-2"].pki / "ca.crt"))
    ctx2.load_cert_chain(str(planes.clusters["tenant-2"].pki / "apiserver-kubelet-client.crt"),
                         str(planes.clusters["tenant-2"].pki / "apiserver-kubelet-client.key"))
    url2 = (f"https://127.0.0.1:{t2node.status.daemon_endpoints.kubelet_endpoint.port}"
            f"/exec/{tenant_ns}/guarded/main?{query}")
    async with aiohttp.ClientSession() as http, http.post(url2, ssl=ctx2, headers=upgrade) as resp:
        assert resp.status == 404, "tenant-2's apiserver cannot reach a tenant-1 pod through its node"
