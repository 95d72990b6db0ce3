"""Persistent volumes for pods on the virtual node: the vnode provisions the tenant StorageClass named by
its ``--storage-class`` (provisioner ``kubeferry.io/vnode``).

A tenant claim of that class gets a claim of the same size and access modes in the tenant's compute
namespace, where the pods run, and a PersistentVolume in the tenant cluster that stands for it: bound to
the claim in advance and pinned to this node, so that the tenant's own scheduler places the claim's pods
here and ``kubectl get pvc`` says Bound. A compute pod mounts the compute claim. The data lives as long
as the tenant claim: a pod's new run (after an eviction, say) finds its checkpoints there; deleting the
claim releases the volume, and the vnode then deletes the compute claim and the volume.

Level-triggered (a work queue keyed by the tenant claim): a restarted vnode makes what is missing and
removes what was released while it was away.
"""

from __future__ import annotations

from typing import Any

import structlog

from ferry.kube.rest import Rest, message_of, path, status_of
from ferry.kube.workqueue import WorkQueue
from vnode import naming
from vnode.caches import Caches
from vnode.events import Recorder
from vnode.translate import Bridge

Obj = dict[str, Any]
PROVISIONER = "kubeferry.io/vnode"
CSI_DRIVER = "vnode.kubeferry.io"  # names what backs a volume (a driver name is a DNS subdomain)
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
log = structlog.get_logger("ferry.vnode.volumes")


class UnservableClaim(Exception):
    """A pod mounts a claim the compute cluster cannot reach (another storage class): it can never start."""


class ClaimNotReady(Exception):
    """A pod mounts a claim of the vnode's class that is not bound yet: it waits, as on a kubelet."""


def volume_name(claim: Obj) -> str:
    """The tenant PersistentVolume standing for a claim (external provisioners' ``pvc-<uid>``)."""
    return f"pvc-{claim['metadata']['uid']}"


def claims_of(pod: Obj) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in pod.get("spec", {}).get("volumes") or []
            if v.get("persistentVolumeClaim")]


class Volumes:
    def __init__(self, b: Bridge, storage_class: str, compute_storage_class: str | None, tenant: Rest,
                 compute: Rest, caches: Caches, recorder: Recorder) -> None:
        self.b = b
        self.events = recorder
        self.storage_class = storage_class
        self.compute_storage_class = compute_storage_class
        self.tenant = tenant
        self.compute = compute
        self.caches = caches
        self.queue = WorkQueue("volumes", max_delay=10.0)
        self.provisioned = 0

    # ------------------------------------------------------------------ watch
    def on_tenant_claim(self, _kind: str, claim: Obj) -> None:
        if claim.get("spec", {}).get("storageClassName") == self.storage_class:
            self.queue.add(_key(claim))

    def on_tenant_volume(self, _kind: str, volume: Obj) -> None:
        ref = volume.get("spec", {}).get("claimRef") or {}
        if ref.get("namespace") and ref.get("name"):
            self.queue.add(f"{ref['namespace']}/{ref['name']}")

    def enqueue_all(self) -> None:
        for claim in list(self.caches.tenant_claims.store.values()):
            self.on_tenant_claim("SYNC", claim)
        for volume in list(self.caches.tenant_volumes.store.values()):
            self.on_tenant_volume("SYNC", volume)

    # -------------------------------------------------------------- reconcile
    async def reconcile(self, key: str) -> None:
        if not self.caches.synced():
            self.queue.add_after(key, 0.5)
            return
        claim = self.caches.tenant_claims.store.get(key)
        for volume in [v for v in self.caches.tenant_volumes.store.values() if _claim_key(v) == key]:
            if claim is None or claim["metadata"]["uid"] != volume["spec"]["claimRef"].get("uid"):
                await self._release(key, volume)  # its claim is gone (or made again: a new claim, new data)
        if (claim is None or claim["metadata"].get("deletionTimestamp")
                or claim.get("spec", {}).get("storageClassName") != self.storage_class):
            return
        bound = claim.get("spec", {}).get("volumeName")
        if bound and bound != volume_name(claim):
            return  # bound by hand to another volume: not ours to serve
        try:
            await self._compute_claim(claim)
        except Exception as exc:
            if status_of(exc) in (403, 422):  # over the namespace's quota, say: the claim stays Pending, told why
                await self.events.emit(_described(claim), "Warning", "ProvisioningFailed",
                                       f"the compute cluster refused its claim: {message_of(exc)}")
            raise  # tried again later (the quota may free up)
        if not bound:
            await self._volume(claim)

    async def ensure(self, pod: Obj) -> None:
        """Before its pod is made in the compute cluster: every claim it mounts is of the vnode's class and
        bound, and its compute claim exists (made now if need be, as a kubelet attaches before it starts)."""
        ns = pod["metadata"]["namespace"]
        for name in claims_of(pod):
            claim = self.caches.tenant_claims.store.get(f"{ns}/{name}")
            if claim is None:
                raise ClaimNotReady(f'persistentvolumeclaim "{name}" not found')
            cls = claim.get("spec", {}).get("storageClassName")
            if cls != self.storage_class:
                raise UnservableClaim(f"volume claim {name!r} has storage class {cls!r}; only claims of storage "
                                      f"class {self.storage_class!r} reach the compute cluster")
            if claim.get("spec", {}).get("volumeName") != volume_name(claim):
                self.queue.add(f"{ns}/{name}")
                raise ClaimNotReady(f'persistentvolumeclaim "{name}" is not bound yet')
            await self._compute_claim(claim)

    async def _compute_claim(self, claim: Obj) -> None:
        meta, spec = claim["metadata"], claim.get("spec", {})
        cname = naming.compute_name(self.b.tenant, meta["namespace"], meta["name"])
        have = self.caches.compute_claims.store.get(f"{self.b.namespace}/{cname}")
        if have is not None and have["metadata"].get("labels", {}).get(naming.UPSTREAM_UID_LABEL) == meta["uid"]:
            return
        body: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": cname, "namespace": self.b.namespace,
                         "labels": {**naming.owner_labels(self.b.tenant, self.b.node, meta["namespace"], meta["uid"]),
                                    naming.KIND_LABEL: "persistentvolumeclaim"},
                         "annotations": {naming.UPSTREAM_NAME_ANNOTATION: meta["name"]}},
            "spec": {"accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                     "resources": {"requests": dict((spec.get("resources") or {}).get("requests") or {})},
                     "volumeMode": spec.get("volumeMode") or "Filesystem"},
        }
        if self.compute_storage_class:
            body["spec"]["storageClassName"] = self.compute_storage_class
        try:
            made = await self.compute.create(path("", "v1", "persistentvolumeclaims", self.b.namespace), body)
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            return  # made before a restart (the cache will have it)
        self.caches.compute_claims.remember(made)
        log.info("compute claim made", claim=_key(claim), compute=cname)

    async def _volume(self, claim: Obj) -> None:
        meta, spec = claim["metadata"], claim.get("spec", {})
        cname = naming.compute_name(self.b.tenant, meta["namespace"], meta["name"])
        body: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume_name(claim),
                         "labels": naming.owner_labels(self.b.tenant, self.b.node, meta["namespace"], meta["uid"]),
                         "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "volumeMode": spec.get("volumeMode") or "Filesystem",
                "storageClassName": self.storage_class,
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                             "name": meta["name"], "uid": meta["uid"]},
                # what the compute pods mount; no kubelet of the tenant cluster ever attaches it
                "csi": {"driver": CSI_DRIVER, "volumeHandle": f"{self.b.namespace}/{cname}"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": list(self.b.nodes)}]}]}},
            },
        }
        try:
            made = await self.tenant.create(path("", "v1", "persistentvolumes"), body)
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            return
        self.caches.tenant_volumes.remember(made)
        self.provisioned += 1
        log.info("volume provisioned", claim=_key(claim), volume=volume_name(claim))
        await self.events.emit(_described(claim), "Normal", "ProvisioningSucceeded",
                               f"volume {volume_name(claim)} stands for claim {cname} in compute namespace "
                               f"{self.b.namespace}")

    async def _release(self, key: str, volume: Obj) -> None:
        """The claim is gone: its compute claim, then the volume (which, while it exists, says to delete it)."""
        ns, name = key.split("/", 1)
        cname = naming.compute_name(self.b.tenant, ns, name)
        url = path("", "v1", "persistentvolumeclaims", self.b.namespace, cname)
        # read, not cached: a cache a moment behind (a compute apiserver just back) must not leave it orphaned
        have = await self.compute.get_or_none(url)
        if have is not None and have["metadata"].get("labels", {}).get(naming.UPSTREAM_UID_LABEL) == \
                volume["spec"]["claimRef"].get("uid"):  # not a claim made again under the same name
            await self._delete(self.compute, url, {"preconditions": {"uid": have["metadata"]["uid"]}})
            self.caches.compute_claims.store.pop(f"{self.b.namespace}/{cname}", None)
        await self._delete(self.tenant, path("", "v1", "persistentvolumes", name=volume["metadata"]["name"]))
        self.caches.tenant_volumes.store.pop(volume["metadata"]["name"], None)
        log.info("volume released", claim=key, volume=volume["metadata"]["name"])

    @staticmethod
    async def _delete(rest: Rest, url: str, options: Obj | None = None) -> None:
        try:
            await rest.delete(url, options)
        except Exception as exc:
            if status_of(exc) != 404:
                raise


def _described(claim: Obj) -> Obj:
    """A cached claim (list items carry no kind) as an Event's involved object."""
    return {**claim, "apiVersion": "v1", "kind": "PersistentVolumeClaim"}


def _key(obj: Obj) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _claim_key(volume: Obj) -> str | None:
    ref = volume.get("spec", {}).get("claimRef") or {}
    return f"{ref.get('namespace')}/{ref.get('name')}" if ref.get("name") else None
