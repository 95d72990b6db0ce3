"""A tenant's pods and gangs through the virtual node to the compute cluster and back, end to end."""

from __future__ import annotations

import os

import pytest

from e2e.kube import Cluster, Clusters, Obj, phase, pod

pytestmark = pytest.mark.integration
VOLCANO_PG = "podgroups.scheduling.volcano.sh"


def volcano_gang(name: str, members: int, gpus: int, seconds: int = 4) -> list[Obj]:
    """A Volcano PodGroup and its pods as Volcano's job controller writes them (the vnode binds them)."""
    group: Obj = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
                  "spec": {"minMember": members}}
    pods = [pod(f"{name}-{i}", gpus=gpus, seconds=seconds, tolerate=False, scheduler="volcano",
                annotations={"scheduling.k8s.io/group-name": name}) for i in range(members)]
    return [group, *pods]


def test_a_pod_runs_in_the_compute_cluster_and_completes(clusters: Clusters, tenant: Cluster, ns: str) -> None:
    tenant.create(ns, pod("hello", seconds=5))
    running = tenant.wait(lambda: (p := tenant.get("pod", "hello", "-n", ns)) and phase(p) == "Running" and p, 90,
                          "pod hello Running")
    assert running["spec"]["nodeName"] == f"ferry-{tenant.name}"
    (copy,) = clusters.compute_pods(tenant.name, running["metadata"]["uid"])
    assert copy["spec"]["nodeName"] and copy["metadata"]["labels"]["kubeferry.io/upstream-namespace"] == ns
    assert tenant.kubectl("logs", "hello", "-n", ns).returncode == 0  # served through the vnode's kubelet API
    tenant.wait(lambda: phase(tenant.get("pod", "hello", "-n", ns)) == "Succeeded", 90, "pod hello Succeeded")
    assert len(clusters.compute_pods(tenant.name, running["metadata"]["uid"])) <= 1  # never a duplicate


def test_a_gang_runs_whole_and_its_podgroup_completes(clusters: Clusters, tenant: Cluster, ns: str) -> None:
    tenant.create(ns, *volcano_gang("trio", 3, gpus=1))

    def all_or_none_bound() -> Obj | None:
        pods = [tenant.get("pod", f"trio-{i}", "-n", ns) for i in range(3)]
        bound = [bool(p["spec"].get("nodeName")) for p in pods]
        assert all(bound) or not any(p["metadata"].get("uid") and phase(p) == "Running" for p in pods)
        group: Obj = tenant.get(VOLCANO_PG, "trio", "-n", ns)
        return group if (group.get("status") or {}).get("phase") == "Completed" else None

    group = tenant.wait(all_or_none_bound, 120, "PodGroup trio Completed")
    assert group["status"].get("succeeded") == 3


def test_a_gang_that_cannot_fit_says_why(clusters: Clusters, tenant: Cluster, ns: str) -> None:
    too_big = clusters.gpus_per_node() + 1
    tenant.create(ns, *volcano_gang("toobig", 2, gpus=too_big))

    def reason() -> str | None:
        out = tenant.ferry("why-pending", "podgroup/toobig", "-n", ns).stdout
        return out if f"no node has {too_big} GPUs" in out else None

    text = tenant.wait(reason, 90, "why-pending naming the missing node size")
    assert "What would let it run" in text
    assert all(phase(tenant.get("pod", f"toobig-{i}", "-n", ns)) == "Pending" for i in range(2))


def test_an_unsafe_pod_is_refused_and_nothing_reaches_the_compute_cluster(clusters: Clusters, tenant: Cluster,
                                                                         ns: str) -> None:
    body = pod("hostpath", volumes=[{"name": "host", "hostPath": {"path": "/"}}])
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
    tenant.create(ns, body)
    refused = tenant.wait(lambda: (p := tenant.get("pod", "hostpath", "-n", ns)) and phase(p) == "Failed" and p, 60,
                          "pod hostpath Failed")
    assert refused["status"]["reason"] == "Refused" and "hostPath" in refused["status"]["message"]
    assert clusters.compute_pods(tenant.name, refused["metadata"]["uid"]) == []
    events = tenant.get("events", "-n", ns, "--field-selector", "involvedObject.name=hostpath")["items"]
    assert any(e["reason"] == "Refused" for e in events)


def test_deleting_a_tenant_pod_deletes_its_compute_pod(clusters: Clusters, tenant: Cluster, ns: str) -> None:
    tenant.create(ns, pod("longrun", seconds=3600))
    running = tenant.wait(lambda: (p := tenant.get("pod", "longrun", "-n", ns)) and phase(p) == "Running" and p, 90,
                          "pod longrun Running")
    uid = running["metadata"]["uid"]
    assert len(clusters.compute_pods(tenant.name, uid)) == 1
    tenant.kubectl("delete", "pod", "longrun", "-n", ns, "--wait=false")
    tenant.wait(lambda: tenant.get_or_none("pod", "longrun", "-n", ns) is None, 90, "tenant pod gone")
    clusters.compute.wait(lambda: clusters.compute_pods(tenant.name, uid) == [], 60, "compute pod gone")


def test_status_shows_the_tenant_queue_and_its_virtual_node(clusters: Clusters, tenant: Cluster) -> None:
    compute_view = clusters.compute.ferry("status")
    assert compute_view.returncode == 0, compute_view.stderr
    assert any(line.split()[0] == tenant.name for line in compute_view.stdout.splitlines()[1:] if line.strip())
    tenant_view = tenant.ferry("status")
    assert tenant_view.returncode == 0, tenant_view.stderr
    assert f"ferry-{tenant.name}" in tenant_view.stdout


@pytest.mark.skipif(not os.environ.get("FERRY_E2E_COMPUTE"),
                    reason="needs pods that run (kind or your clusters): simulated pods resolve nothing")
def test_peers_of_a_distributed_job_resolve_by_their_tenant_names(clusters: Clusters, tenant: Cluster,
                                                                  ns: str) -> None:
    """As MPI Operator's hostfile names them (<host>.<subdomain>.<namespace>.svc.cluster.local), and the
    Service behind them by its name, answered by `ferry dns` (the vnode given its address)."""
    tenant.create(ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ring"},
                       "spec": {"clusterIP": "None", "selector": {"e2e-job": "ring"}}})
    # The full name: busybox's nslookup does not walk the search path the way libc does; the short form
    # becomes this name through the search path the compute pod is given (tests/integration/test_peer_dns.py).
    lookup = (f"for i in $(seq 60); do nslookup w-1.ring.{ns}.svc.cluster.local && "
              f"nslookup ring.{ns}.svc.cluster.local && exit 0; sleep 2; done; exit 1")
    for host, command in (("w-1", "sleep 300"), ("w-0", lookup)):
        body = pod(host, seconds=300, hostname=host, subdomain="ring")
        body["metadata"]["labels"] = {"e2e-job": "ring"}
        body["spec"]["containers"][0]["command"] = ["sh", "-c", command]
        tenant.create(ns, body)
    done = tenant.wait(lambda: phase(tenant.get("pod", "w-0", "-n", ns)) in ("Succeeded", "Failed") or None, 180,
                       "w-0 resolving w-1")
    assert phase(tenant.get("pod", "w-0", "-n", ns)) == "Succeeded", (
        done, tenant.kubectl("logs", "w-0", "-n", ns, check=False).stdout[-2000:])
