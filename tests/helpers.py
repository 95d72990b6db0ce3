"""Test helpers: waiting on conditions with deadlines, API clients, kubectl."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import inspect
import os
import shlex
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from dnslib import RCODE, DNSRecord
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry import certs
from ferry.cluster.ports import PortAllocator
from ferry.cluster.process import Component
from ferry.keys import DOMAIN_LABEL
from ferry.kube import rest
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NS_LABEL

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T | None] | T | None], timeout: float = 30.0, interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll ``check`` until it returns a truthy value; fail with the last value after ``timeout`` s."""
    end = time.monotonic() + timeout
    last: object = None
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        last = result
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {timeout} s (last: {last!r})")
        await asyncio.sleep(interval)


async def accepted_once_cached(create: Callable[[], Awaitable[object]], status: int, says: str, what: str,
                               timeout: float = 30.0) -> None:
    """Make ``create``'s request again while a webhook refuses it for what its cache has not seen yet (``status``,
    with ``says`` in the body): operators' webhooks look objects up in informer caches that lag the API."""
    async def accepted() -> bool:
        try:
            await create()
        except ApiException as exc:
            if exc.status == status and says in str(exc.body):
                return False
            raise
        return True

    await eventually(accepted, timeout=timeout, what=what)


def wait_sync(check: Callable[[], T | None], timeout: float = 30.0, what: str = "condition") -> T:
    end = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {timeout} s (last: {result!r})")
        time.sleep(0.1)


@asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    api = await rest.api_client(kubeconfig)
    try:
        yield api
    finally:
        await api.close()


def kubectl(binary: Path, kubeconfig: Path, *args: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([str(binary), f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True,
                         timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
    return res


def swapped(original: Component, name: str, overrides: list[str]) -> Component:
    """The same process under another name, with more flags (later flags win)."""
    log = original.spec.log.with_name(f"{name}.log")
    return Component(dataclasses.replace(original.spec, name=name, argv=[*original.spec.argv, *overrides], log=log))


@asynccontextmanager
async def queue_webhook_removed(api: client.ApiClient) -> AsyncIterator[None]:
    """The Queue webhook's configuration away for a while, as if it were not installed: for what the
    scheduler makes of a Queue tree written past it. Put back as it was (its caBundle included)."""
    url = rest.path("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", name="kube-ferry-queues")
    api_rest = rest.Rest(api)
    saved = await api_rest.get(url)
    await api_rest.delete(url)
    try:
        yield
    finally:
        meta = saved["metadata"]
        await api_rest.create(rest.path("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"), {
            **saved, "metadata": {"name": meta["name"], "labels": meta.get("labels") or {}}})


@contextmanager
def logged_process(cmd: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` running with its output in ``log_path`` for the block (an operator beside the tests), then
    stopped and waited for."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# Where a controller-runtime webhook server reads its certificate when nothing names another folder.
CONTROLLER_RUNTIME_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


def with_files_at(files: dict[Path, bytes], layers: Path, command: list[str]) -> list[str]:
    """``command`` run in a mount namespace of its own where each of ``files`` is at its path, as a kubelet
    mounts a Secret: for a program that reads a file at a fixed path no flag moves (Kueue's metrics
    certificate under /etc, controller-runtime's default webhook certificate under /tmp). Nothing is written
    at those paths on this machine: the nearest directory above each that exists is overlaid, in that
    namespace only, with a layer (under ``layers``) holding the files."""
    roots: dict[Path, Path] = {}  # a directory overlaid -> its layer
    script = []
    for path, data in files.items():
        root = next(p for p in path.parents if p.is_dir())
        there = roots.setdefault(root, layers / f"layer-{len(roots)}") / "upper" / path.relative_to(root)
        there.parent.mkdir(parents=True, exist_ok=True)
        there.write_bytes(data)
    # a folder above the layers is overlaid last: a layer seen through an overlay cannot be one
    around = [root for root in roots if layers.is_relative_to(root)]
    assert len(around) <= 1, f"the layers ({layers}) are inside more than one overlaid folder: {around}"
    for root, layer in sorted(roots.items(), key=lambda item: item[0] in around):
        (layer / "work").mkdir(exist_ok=True)
        options = f"lowerdir={root},upperdir={layer / 'upper'},workdir={layer / 'work'}"
        script.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(str(root))}")
    user = [] if os.geteuid() == 0 else ["--map-root-user"]  # an unprivileged user's own namespace
    return ["unshare", "--mount", "--propagation", "private", *user, "sh", "-ec",
            " && ".join([*script, 'exec "$@"']), "sh", *command]


def url_webhook(port: int, ca: bytes, name: str, url_path: str, rule: dict[str, Any],
                selector: dict[str, Any] | None = None) -> dict[str, Any]:
    """One webhook of a configuration, called by URL on this host, as ``controller_with_webhooks`` serves it."""
    out: dict[str, Any] = {
        "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
        "clientConfig": {"url": f"https://127.0.0.1:{port}{url_path}", "caBundle": base64.b64encode(ca).decode()},
        "rules": [rule]}
    if selector:
        out["objectSelector"] = selector
    return out


@contextmanager
def controller_with_webhooks(binary: Path, config_api: str, settings: dict[str, Any], kubeconfig: Path,
                             kubectl: list[str], work: Path, webhooks: Callable[[int, bytes], list[dict[str, Any]]],
                             args: tuple[str, ...] = (), *, cert_management: str = "internalCertManagement",
                             names_cert_dir: bool = True, fixed_cert_dirs: tuple[Path, ...] = (),
                             ) -> Iterator[subprocess.Popen[bytes]]:
    """A controller-runtime controller (JobSet's, LeaderWorkerSet's, Trainer's, Kueue's) against
    ``kubeconfig``, configured by a ``config_api`` Configuration file (``settings`` added to it;
    ``cert_management`` is its name for the certificates it would make itself, turned off), its admission
    webhooks served by the process and called by URL with a certificate issued here (local planes have no
    cluster network, as envtest does): ``webhooks(port, ca)`` gives the configurations, registered once the
    controller runs and removed after, as its pod webhooks would refuse its pods once nobody serves them.
    The certificate is in the folder the configuration names (unless ``names_cert_dir`` is False: it cannot)
    and in each of ``fixed_cert_dirs``, where the controller reads one at a path no setting moves (given to
    it in a mount namespace of its own: ``with_files_at``)."""
    ca = certs.new_ca(f"{binary.name}-webhook-ca")
    serving = certs.issue(ca, "127.0.0.1", ips=("127.0.0.1",), server=True)
    pem = {"tls.crt": certs.cert_pem(serving.cert), "tls.key": certs.key_pem(serving.key)}
    certificates = work / "certs"
    certificates.mkdir(parents=True, exist_ok=True)
    for name, data in pem.items():
        (certificates / name).write_bytes(data)
    port = free_port()
    config = work / "config.yaml"
    webhook: dict[str, Any] = {"port": port, "host": "127.0.0.1"}
    if names_cert_dir:
        webhook["certDir"] = str(certificates)
    config.write_text(yaml.safe_dump({
        "apiVersion": config_api, "kind": "Configuration",
        cert_management: {"enable": False}, "leaderElection": {"leaderElect": False}, "webhook": webhook,
        "metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"}, **settings}))
    log_path = work / "controller.log"
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    command = [str(binary), f"--config={config}", *args]
    if fixed_cert_dirs:
        command = with_files_at({d / name: data for d in fixed_cert_dirs for name, data in pem.items()},
                                work / "mounted", command)
    with logged_process(command, env, log_path) as proc:
        wait_sync(lambda: b"Starting workers" in log_path.read_bytes() or proc.poll() is not None, 90,
                  f"{binary.name} to start (log: {log_path})")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        manifests = webhooks(port, certs.cert_pem(ca.cert))
        subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(manifests).encode(), check=True,
                       capture_output=True)
        try:
            yield proc
        finally:
            for m in manifests:
                subprocess.run([*kubectl, "delete", m["kind"].lower(), m["metadata"]["name"], "--ignore-not-found"],
                               check=False, capture_output=True)


def vnode_metrics(vnode: Component) -> dict[str, float]:
    """A vnode's /metrics: each series, named as exposed (``name{label="value",...}``), to its value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{vnode.spec.ports[1]}/metrics", timeout=5).read().decode()
    return {series: float(value) for series, _, value in (line.rpartition(" ") for line in text.splitlines())
            if series and not series.startswith("#")}


async def compute_copies(compute_api: client.ApiClient, tenant_ns: str) -> list[Any]:
    """The compute pods the vnodes made for the pods of tenant namespace ``tenant_ns``."""
    return list((await client.CoreV1Api(compute_api).list_pod_for_all_namespaces(
        label_selector=f"{UPSTREAM_NS_LABEL}={tenant_ns}")).items)


async def racks_of_groups(compute_api: client.ApiClient, tenant_ns: str, group_label: str,
                          count: int) -> dict[str, set[str]] | None:
    """Group (the copies' ``group_label``) -> the compute racks its copies run in, once ``count`` copies of
    tenant namespace ``tenant_ns`` are Running."""
    pods = [p for p in await compute_copies(compute_api, tenant_ns) if p.status.phase == "Running"]
    if len(pods) < count:
        return None
    core, by_group = client.CoreV1Api(compute_api), dict[str, set[str]]()
    for p in pods:
        node = await core.read_node(p.spec.node_name)
        by_group.setdefault(p.metadata.labels[group_label], set()).add(node.metadata.labels[DOMAIN_LABEL])
    return by_group


async def live_copies(compute_api: client.ApiClient, tenant_ns: str) -> list[Any]:
    """``compute_copies`` not being deleted."""
    return [p for p in await compute_copies(compute_api, tenant_ns) if p.metadata.deletion_timestamp is None]


async def running_copies(compute_api: client.ApiClient, tenant_ns: str, count: int) -> list[Any] | None:
    """The ``live_copies`` of tenant namespace ``tenant_ns``, once there are ``count`` and each is Running with
    an address (for ``eventually``)."""
    pods = await live_copies(compute_api, tenant_ns)
    return pods if len(pods) == count and all(p.status.phase == "Running" and p.status.pod_ip for p in pods) else None


async def running_pods(core: client.CoreV1Api, ns: str, count: int) -> list[Any] | None:
    """The namespace's ``count`` pods, if that many are there (not being deleted) and all Running."""
    pods = [p for p in (await core.list_namespaced_pod(ns)).items if p.metadata.deletion_timestamp is None]
    return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None


async def replacements(core: client.CoreV1Api, ns: str, first: list[Any], count: int) -> list[Any] | None:
    """The namespace's ``count`` live pods (not being deleted, not ended), if that many are there and none
    of them is one of ``first``: what a controller made in place of the pods it lost."""
    pods = [p for p in (await core.list_namespaced_pod(ns)).items
            if p.metadata.deletion_timestamp is None and p.status.phase not in ("Failed", "Succeeded")]
    uids = {p.metadata.uid for p in first}
    return pods if len(pods) == count and not any(p.metadata.uid in uids for p in pods) else None


@asynccontextmanager
async def reserved_node(compute_api: client.ApiClient, label: str) -> AsyncIterator[str]:
    """A free kwok GPU node of the compute cluster labelled ``ferry-test=<label>`` for the block: only pods
    that select the label go there (binpacking fills the lowest names, so it is the highest). An earlier
    test's pods may still be leaving it: the block starts once they are gone."""
    core = client.CoreV1Api(compute_api)
    nodes = (await core.list_node(label_selector="type=kwok,!ferry-test")).items
    node = sorted(n.metadata.name for n in nodes if not n.spec.unschedulable)[-1]
    await core.patch_node(node, {"metadata": {"labels": {"ferry-test": label}}})

    async def free() -> bool:
        pods = (await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")).items
        return all(p.status.phase in ("Succeeded", "Failed") for p in pods)

    try:
        await eventually(free, timeout=60, what=f"{node} free of an earlier test's pods")
        yield node
    finally:
        await core.patch_node(node, {"metadata": {"labels": {"ferry-test": None}}})


MERGE_PATCH = "application/merge-patch+json"
VICTIM_GRACE_S = 4  # the grace guarantee_claiming's victims get (a tenant Queue's default is 30 s)


@asynccontextmanager
async def guarantee_claiming(compute_api: client.ApiClient, compute_ns: str, label: str,
                             victims: str = "tenant-1") -> AsyncIterator[str]:
    """Another queue, guaranteed 8 GPUs, whose 8-GPU pod ``urgent`` in ``compute_ns`` selects the node
    labelled ``label``: what borrows that node is taken back. The victims' Queue (their tenant's, named
    ``victims``) gives them ``VICTIM_GRACE_S`` of grace for the block, as its admin may set; the other queue
    is deleted after the block and the grace put back."""
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    api = ("scheduling.kubeferry.io", "v1alpha1", "queues")
    tenant_queue = await custom.get_cluster_custom_object(*api, victims)
    grace = tenant_queue["spec"].get("preemption", {}).get("victimGraceSeconds")
    await custom.patch_cluster_custom_object(*api, victims, {"spec": {"preemption": {
        "victimGraceSeconds": VICTIM_GRACE_S}}}, _content_type=MERGE_PATCH)
    queue = f"q-{compute_ns}"
    try:
        await custom.create_cluster_custom_object(*api, {
            "apiVersion": "scheduling.kubeferry.io/v1alpha1", "kind": "Queue", "metadata": {"name": queue},
            "spec": {"namespaces": [compute_ns], "guaranteed": {"gpu": "8"}}})
        try:  # compute_ns is a fresh_namespace: its ServiceAccount exists
            await core.create_namespaced_pod(compute_ns, {
                "metadata": {"name": "urgent"},
                "spec": {"schedulerName": "kube-ferry", "nodeSelector": {"ferry-test": label},
                         "containers": [{"name": "c", "image": "i",
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
            yield "urgent"
        finally:
            await custom.delete_cluster_custom_object(*api, queue)
    finally:
        await custom.patch_cluster_custom_object(*api, victims, {"spec": {"preemption": {
            "victimGraceSeconds": grace}}}, _content_type=MERGE_PATCH)


async def preempted_whole_then_freed(compute_api: client.ApiClient, compute_ns: str, core: client.CoreV1Api,
                                     ns: str, first: list[Any], victims: str) -> list[Any]:
    """``first``, a job's pods Running on the node reserved for ``ns``, preempted whole for another queue's
    guarantee (``guarantee_claiming``): once the job's controller made as many new pods, they wait as one
    gang (no compute copy bound) while the node is taken; the node is freed, and the new pods are returned
    once Running. ``victims``: the tenant whose Queue the job is in."""
    count = len(first)
    async with guarantee_claiming(compute_api, compute_ns, ns, victims) as urgent:
        await eventually(lambda: replacements(core, ns, first, count), timeout=120,
                         what=f"{count} new pods from the job's controller")
        copies = await live_copies(compute_api, ns)
        assert not any(p.spec.node_name for p in copies), \
            [(p.metadata.name, p.spec.node_name, p.status.phase) for p in copies]  # the gang waits whole
        await client.CoreV1Api(compute_api).delete_namespaced_pod(urgent, compute_ns, grace_period_seconds=0)
        again: list[Any] = await eventually(lambda: running_pods(core, ns, count), timeout=90,
                                            what="the new pods Running once the node is free")
    assert not {p.metadata.uid for p in again} & {p.metadata.uid for p in first}
    return again


async def namespace_with_service_account(core: client.CoreV1Api, timeout: float) -> str:
    """Create a namespace of a random name and return it once the controller-manager has made its default
    ServiceAccount (pods are refused until then)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name}})

    async def service_account() -> bool:
        try:
            await core.read_namespaced_service_account("default", name)
            return True
        except ApiException:
            return False

    await eventually(service_account, timeout=timeout, what=f"ServiceAccount default in {name}")
    return name


async def fresh_namespace(api: client.ApiClient) -> AsyncIterator[str]:
    """A new namespace of a random name, once its default ServiceAccount exists; deleted afterwards."""
    core = client.CoreV1Api(api)
    name = await namespace_with_service_account(core, timeout=30)
    try:
        yield name
    finally:
        await core.delete_namespace(name)


def install_crd(kubectl: list[str], path: Path, name: str) -> None:
    """Apply a CRD (server-side, as a release's manifests are) and wait until the kind is served: an
    operator started before exits, or starts no controller for it."""
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(path)], check=True, capture_output=True)
    wait_sync(lambda: subprocess.run(
        [*kubectl, "get", "crd", name, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}"],
        capture_output=True, text=True, check=False).stdout == "True", 60, f"CRD {name} established")


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now, for a process under test to listen on: outside the ephemeral
    range, where an outgoing connection could take it before the process binds it."""
    ports = PortAllocator()
    try:
        return ports.take("a process under test")
    finally:
        ports.release()


def closed_port() -> int:
    """A UDP port of 127.0.0.1 nothing listens on: an upstream DNS that never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ask(dns: PeerDNS, source_ip: str, name: str) -> list[str] | None:
    """The addresses ``dns`` gives a pod at ``source_ip`` for ``name``; None when it relays the name (to an
    upstream that never answers, as the ``peer_dns`` fixture's: SERVFAIL)."""
    reply = await dns.handle(DNSRecord.question(name).pack(), source_ip)
    assert reply is not None
    record = DNSRecord.parse(reply)
    return None if record.header.rcode == RCODE.SERVFAIL else sorted(str(r.rdata) for r in record.rr)


async def resolve(dns: PeerDNS, pod: Any, name: str) -> list[str] | None:
    """``name`` resolved as a C library in compute pod ``pod`` (a client object) resolves it with the
    nameserver and search path the pod was given: a name with fewer dots than ``ndots`` tries the search
    domains first, then itself; the first answer wins."""
    conf = pod.spec.dns_config
    ndots = int(next((o.value for o in conf.options or [] if o.name == "ndots"), 1))
    tries = [f"{name}.{s}." for s in conf.searches or []]
    tries = [*tries, f"{name}."] if name.count(".") < ndots else [f"{name}.", *tries]
    for candidate in tries:
        if (ips := await ask(dns, pod.status.pod_ip, candidate)) is not None:
            return ips
    return None
