"""Tenant pod → compute pod: what is refused, what the pod needs, and the compute-side object.

Pure functions on plain dicts, so every rule here is unit-tested without a cluster. Nothing a tenant
writes can pick the compute scheduler's queue, priority or gang: those come from the bridge's own
configuration, and ``kubeferry.io/`` keys from upstream are dropped unless allow-listed.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from ferry.keys import POD_GROUP_LABEL, PREFIX, SCHEDULER_NAME, TASK_LABEL, UPSTREAM_CONTROLLER_LABEL
from ferry.kube.owners import controller_ref
from vnode import naming
from vnode.podsecurity import PodSecurity, violation

Obj = dict[str, Any]


PASS_THROUGH = {PREFIX + k for k in ("gpu-milli", "sim-duration", "sim-exit-code", "task", "movable")}
DROPPED_ANNOTATIONS = {"kubectl.kubernetes.io/last-applied-configuration"}
FOLLOWED_ANNOTATION = PREFIX + "followed-keys"  # on a compute pod: the tenant's keys it follows (followed)
SUPPORTED_VOLUMES = {"configMap", "secret", "emptyDir", "projected", "downwardAPI"}
NODE_SELECTOR_DROPPED = re.compile(r"^(kubernetes\.io/(hostname|role|os|arch)|type|node\.kubernetes\.io/.*"
                                   r"|node-role\.kubernetes\.io/.*)$")
FORWARDING_GATE = PREFIX + "forwarding"
HOSTNAME = "kubernetes.io/hostname"
KUEUE_GATES = {"kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"}
# Kueue's topology-aware scheduling: the Workload a pod belongs to (set on the pods of every workload it admits
# while the feature is on), the podset's level that must (or should) hold all its pods, and the podset's name.
KUEUE_WORKLOAD = "kueue.x-k8s.io/workload"
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_PODSET = "kueue.x-k8s.io/podset"
# A podset cut into slices of ``size`` pods by rank, each of which must keep to one domain of the slice's level;
# the offset Kueue subtracts from a pod's index; the label a copy carries its slice by (``_slice_in_one_domain``)
KUEUE_SLICE_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
KUEUE_INDEX_OFFSET = "kueue.x-k8s.io/pod-index-offset"
SLICE_LABEL = PREFIX + "kueue-slice"
# Podsets that share one domain (a LeaderWorkerSet's leader and workers): Kueue's annotation, and the label a
# copy carries it by, for a pod affinity term to select
KUEUE_PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"
PODSET_GROUP_LABEL = PREFIX + "kueue-podset-group"
# Exclusive placement (one group per topology domain), as JobSet (a group: a Job) and LeaderWorkerSet (a leader
# and its workers) do it: a group's leader gets a pod affinity with its group's pods and an anti-affinity with
# other groups' over the annotated key, each other pod (a follower) a nodeSelector of the leader's node's value
# of that key. (the annotation naming the key, the label naming the group)
EXCLUSIVE_PLACEMENT = (("alpha.jobset.sigs.k8s.io/exclusive-topology", "jobset.sigs.k8s.io/job-key"),
                       ("leaderworkerset.sigs.k8s.io/exclusive-topology", "leaderworkerset.sigs.k8s.io/group-key"))
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # 0: the group's leader
# (Kueue's podset last: a pod group's pods of one template, or a Workload's of one podset, are one role)
ROLE_KEYS = ("volcano.sh/task-spec", "training.kubeflow.org/replica-type", "training.kubeflow.org/job-role",
             "jobset.sigs.k8s.io/replicatedjob-name", PREFIX + "task", KUEUE_PODSET)


Selector = tuple[tuple[str, str], ...]  # node labels, sorted: a GPU pool


@dataclass(frozen=True)
class Bridge:
    """What translation needs to know about this vnode."""

    tenant: str
    node: str
    namespace: str  # the tenant's namespace in the compute cluster
    queue: str
    max_priority: int = 0
    pod_security: PodSecurity = "baseline"
    dns_server: str = ""  # `ferry dns` (vnode/dnsserver.py); empty: compute pods keep the compute cluster's DNS
    cluster_domain: str = "cluster.local"  # the tenant cluster's DNS zone
    tenant_api: tuple[str, int] | None = None  # the tenant apiserver as compute pods reach it; None: not given
    pools: tuple[tuple[str, Selector], ...] = ()  # the pools' virtual nodes and the compute node labels of each

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every virtual node this vnode serves: its own, then one per GPU pool."""
        return (self.node, *(n for n, _ in self.pools))

    def serves(self, pod: Obj) -> bool:
        """Whether the pod is bound to one of this vnode's virtual nodes."""
        return pod.get("spec", {}).get("nodeName") in self.nodes

    def pool_of(self, node: str) -> dict[str, str]:
        """The compute node labels a virtual node's pods run on ({}: any GPU node)."""
        return dict(next((sel for n, sel in self.pools if n == node), ()))


DOMAIN_SUFFIX = ".virtual"  # see domain_value
LABEL_VALUE_MAX = 63
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def node_labels(node: str, tenant: str) -> dict[str, str]:
    """The virtual node's labels. They describe the virtual node, not a compute node: a tenant's selector
    (or a Kueue ResourceFlavor's, injected into the pods it admits) picks the virtual node by them, so a
    copy's nodeSelector drops them."""
    return {"type": "virtual-kubelet", "kubernetes.io/role": "agent", HOSTNAME: node,
            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "kube-ferry", PREFIX + "tenant": tenant,
            PREFIX + "role": "virtual-node"}


def domain_value(node: str) -> str:
    """The value a virtual node carries for each topology domain it stands for many of (vnode/node.py
    ``domains``): its name and a suffix, never its hostname. Kueue's topology-aware scheduling names a host's
    domain by the hostname alone and a top level's by its value: a rack valued as the host would be taken for
    it and the level left empty ("no topology domains at level"). A name too long for a label value with the
    suffix (a node name may have 253 characters, a value 63) is cut and a digest of it added."""
    value = f"{node}{DOMAIN_SUFFIX}"
    if len(value) <= LABEL_VALUE_MAX:
        return value
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    head = node[:LABEL_VALUE_MAX - len(DOMAIN_SUFFIX) - len(digest) - 1].rstrip("-.")
    return f"{head}-{digest}{DOMAIN_SUFFIX}"


def compute_node_affinity(affinity: Obj | None, mine: dict[str, str]) -> Obj | None:
    """What of a tenant pod's node affinity its copy keeps (None: nothing). A requirement on the virtual
    node (its own label keys, a kubelet's well-known labels, a node's name by ``matchFields``) was the
    tenant scheduler's to check and was met by binding the pod here; the rest (a GPU model, a zone, labels
    the compute cluster's admins publish) picks compute nodes. A required term left with nothing was met
    by the virtual node alone: the terms are ORed, so the pod may then run on any compute node."""
    if not affinity:
        return None

    def compute_term(term: Obj) -> Obj:
        kept = [e for e in term.get("matchExpressions") or []
                if not NODE_SELECTOR_DROPPED.match(str(e.get("key", ""))) and e.get("key") not in mine]
        return {"matchExpressions": kept} if kept else {}

    out: Obj = {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [compute_term(t) for t in required.get("nodeSelectorTerms") or []]
    if terms and all(terms):
        out["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    preferred = [{**p, "preference": term}
                 for p in affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
                 if (term := compute_term(p.get("preference") or {}))]
    if preferred:
        out["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return out or None


def _meets(expr: Obj, labels: dict[str, str]) -> bool:
    """One node selector requirement against a node's labels, as the NodeAffinity filter reads it."""
    key, op, values = str(expr.get("key", "")), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and have.lstrip("-").isdigit() and values and values[0].lstrip(
            "-").isdigit():
        return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
    return False


def admits(pod: Obj, labels: dict[str, str], keys: set[str]) -> bool:
    """Whether a pod's nodeSelector and required node affinity, read only where they name one of ``keys``,
    admit a node with ``labels``."""
    spec = pod.get("spec", {})
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items() if k in keys):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(all(_meets(e, labels) for e in t.get("matchExpressions") or [] if e.get("key") in keys)
                            for t in terms)


def node_for(pod: Obj, b: Bridge) -> str:
    """The virtual node a pod the vnode binds goes to: the first GPU pool whose labels its node selection asks
    for (it admits the pool's labels and not their absence), else the vnode's own node."""
    for node, sel in b.pools:
        pool = dict(sel)
        if admits(pod, pool, set(pool)) and not admits(pod, {}, set(pool)):
            return node
    return b.node


def _with_its_leader(meta: Obj, spec: Obj, node: str) -> None:
    """A follower of an exclusive placement (``EXCLUSIVE_PLACEMENT``) on a virtual node selects its leader's
    domain by the virtual node's own value of the key (vnode/node.py ``domains``), which its copy drops; the
    copy gets what that value stood for: a required pod affinity with its group's pods over the key, which the
    compute scheduler meets in the domain where the leader's copy runs."""
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    found = next(((key, label, group) for by, label in EXCLUSIVE_PLACEMENT
                  if (key := annotations.get(by)) and (group := labels.get(label))), None)
    if found is None or (spec.get("nodeSelector") or {}).get(found[0]) != domain_value(node):
        return
    key, label, group = found
    _require_pod_affinity(spec, {"labelSelector": {"matchExpressions": [
        {"key": label, "operator": "In", "values": [group]}]}, "topologyKey": key})


def _kept_in_one_domain(meta: Obj, spec: Obj, labels: dict[str, str]) -> None:
    """A podset Kueue admitted into one domain (``kept_together``) as the compute scheduler reads it: a pod
    affinity among the gang's pods of the podset (of its podset group, if it names one: the group shares one
    domain) over the level's key, required or preferred as the podset asks, given the copy's ``labels`` (its
    gang's, and the podset group's label the term selects). The scheduler meets it by placing the gang in one
    domain, the tightest with room first; a preferred one, where no domain has room, wherever the gang fits."""
    level = kept_together({"metadata": meta})
    if level is None:
        return
    match = {POD_GROUP_LABEL: labels[POD_GROUP_LABEL]}
    if shared := str((meta.get("annotations") or {}).get(KUEUE_PODSET_GROUP) or ""):
        match[PODSET_GROUP_LABEL] = labels[PODSET_GROUP_LABEL] = (
            shared if LABEL_VALUE.match(shared)
            else hashlib.sha256(shared.encode()).hexdigest()[:LABEL_VALUE_MAX])
    elif podset := labels.get(KUEUE_PODSET):
        match[KUEUE_PODSET] = podset
    term = {"labelSelector": {"matchLabels": match}, "topologyKey": level.key}
    if level.required:
        _require_pod_affinity(spec, term)
    else:
        _add_pod_affinity(spec, "preferredDuringSchedulingIgnoredDuringExecution",
                          {"weight": 100, "podAffinityTerm": term})


def _slice_in_one_domain(meta: Obj, spec: Obj, labels: dict[str, str], index: int) -> None:
    """A pod of slice ``index`` of a sliced podset (``sliced``) as the compute scheduler reads it: the copy
    carries its slice (``SLICE_LABEL``) and a required pod affinity with its slice's copies over the slice's
    level, and its slice is a task of its own (a task's pods state the same rules). The scheduler places the
    gang slice after slice, each in one domain (the tightest with room first)."""
    cut = sliced({"metadata": meta})
    if cut is None:
        return
    labels[SLICE_LABEL] = str(index)
    match = {POD_GROUP_LABEL: labels[POD_GROUP_LABEL], SLICE_LABEL: str(index)}
    if podset := labels.get(KUEUE_PODSET):
        match[KUEUE_PODSET] = podset
    _require_pod_affinity(spec, {"labelSelector": {"matchLabels": match}, "topologyKey": cut.key})


def _require_pod_affinity(spec: Obj, term: Obj) -> None:
    """Add a required pod affinity term to a copy's spec, after any the tenant wrote."""
    _add_pod_affinity(spec, "requiredDuringSchedulingIgnoredDuringExecution", term)


def _add_pod_affinity(spec: Obj, kind: str, term: Obj) -> None:
    """Add a pod affinity term of ``kind`` (required or preferred) to a copy's spec, after any the tenant wrote."""
    affinity = spec["affinity"] = spec.get("affinity") or {}
    near = affinity["podAffinity"] = affinity.get("podAffinity") or {}
    near[kind] = [*(near.get(kind) or []), term]


def _in_compute_namespace(term: Obj, ns: str) -> None:
    """A pod (anti-)affinity term or topology spread constraint as it reads in the compute cluster, where every
    namespace of the tenant is the copies' one namespace: it looks there (never at other tenants' namespaces),
    at the copies of the pods of the tenant namespaces it named (its own by default; every one of the tenant's
    for a namespace selector)."""
    listed, by_label = term.pop("namespaces", None) or [], term.pop("namespaceSelector", None)
    selector = term.get("labelSelector")
    if selector is None or by_label is not None:
        return  # a null selector selects nothing; a namespace selector: every namespace of the tenant
    selector["matchExpressions"] = [*(selector.get("matchExpressions") or []), {
        "key": naming.UPSTREAM_NS_LABEL, "operator": "In", "values": sorted(set(listed) or {ns})}]


def _pod_affinity_terms(affinity: Obj) -> list[Obj]:
    """Every pod (anti-)affinity term, required and preferred."""
    out: list[Obj] = []
    for kind in ("podAffinity", "podAntiAffinity"):
        spec = affinity.get(kind) or {}
        out += spec.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        out += [p["podAffinityTerm"] for p in spec.get("preferredDuringSchedulingIgnoredDuringExecution") or []
                if p.get("podAffinityTerm")]
    return out


@dataclass(frozen=True)
class GangRef:
    """A tenant pod's gang as its operator marked it (or Kueue, for a Workload it admitted into one domain)."""

    kind: Literal["volcano", "scheduler-plugins", "kueue", "kueue-workload"]
    namespace: str
    name: str
    total: int | None = None  # Kueue carries the size on the pod (of a group; a Workload's is on the Workload)

    @property
    def bound_by_vnode(self) -> bool:
        """Whether the vnode binds the gang's pods (it plays their gang scheduler). A Kueue Workload's pods are
        the tenant scheduler's to bind, as Kueue's topology gates were lifted for it."""
        return self.kind != "kueue-workload"

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass
class Needs:
    """Tenant objects a pod references; copies must exist before the compute pod does."""

    configmaps: set[str] = field(default_factory=set)
    secrets: set[str] = field(default_factory=set)
    token: Obj | None = None  # the projected serviceAccountToken source, if any
    subdomain: str | None = None
    identity: bool = False  # a downward-API volume names the pod's identity or metadata (IDENTITY_KEYS)


# ----------------------------------------------------------------------------------------- gangs
def gang_of(pod: Obj) -> GangRef | None:
    meta = pod.get("metadata", {})
    ann, labels, ns = meta.get("annotations") or {}, meta.get("labels") or {}, meta.get("namespace", "")
    if name := ann.get("scheduling.k8s.io/group-name"):
        return GangRef("volcano", ns, name)
    if name := labels.get("scheduling.x-k8s.io/pod-group"):
        return GangRef("scheduler-plugins", ns, name)
    if name := ann.get("kueue.x-k8s.io/pod-group-name") or labels.get("kueue.x-k8s.io/pod-group-name"):
        total = ann.get("kueue.x-k8s.io/pod-group-total-count", "")
        return GangRef("kueue", ns, name, int(total) if total.isdigit() else None)
    if (name := ann.get(KUEUE_WORKLOAD)) and (kept_together(pod) or sliced(pod)):
        return GangRef("kueue-workload", ns, name)
    return None


class KueueLevel(NamedTuple):
    """The topology level Kueue keeps a podset in (a node label key), and whether it must or only should."""

    key: str
    required: bool

    def __str__(self) -> str:
        return self.key


def kept_together(pod: Obj) -> KueueLevel | None:
    """The topology level Kueue requires (``podset-required-topology``) or prefers (``-preferred-``) all of the
    pod's podset in, where it is one host or a domain of the compute cluster's that the virtual node stands for
    many of (vnode/node.py ``domains``); None for a level of the virtual node's own labels (its OS, its
    tenant), which describe it alone. Kueue admitted the podset into one such domain of the tenant's, the
    virtual node, which stands for many hosts and domains: the copies are made one gang kept (or, preferred,
    kept where it fits) in one compute host or domain (``_kept_in_one_domain``). A required podset too big for
    any one host waits, told so as any gang no node holds together is."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    for name, required in ((KUEUE_REQUIRED_TOPOLOGY, True), (KUEUE_PREFERRED_TOPOLOGY, False)):
        if key := carried_level(str(annotations.get(name) or "")):
            return KueueLevel(key, required)
    return None


class KueueSlice(NamedTuple):
    """The level each slice of a podset must keep to (a node label key), and how many pods make a slice."""

    key: str
    size: int

    def __str__(self) -> str:
        return self.key


def sliced(pod: Obj) -> KueueSlice | None:
    """The level and size of the slices Kueue cuts the pod's podset into (``podset-slice-required-topology``,
    ``podset-slice-size``: each ``size`` pods of consecutive ranks in one domain), where the level is one the
    compute cluster holds pods to (``carried_level``); None otherwise."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    key = carried_level(str(annotations.get(KUEUE_SLICE_TOPOLOGY) or ""))
    size = str(annotations.get(KUEUE_SLICE_SIZE) or "")
    return KueueSlice(key, int(size)) if key and size.isdigit() and int(size) >= 1 else None


def _index(value: Any) -> int | None:
    text = str(value) if value is not None else ""
    return int(text) if text.isdigit() else None


def pod_rank(pod: Obj, request: Obj, count: int) -> int | None:
    """The pod's rank in its podset of ``count`` pods as Kueue reads it to place pods by rank
    (``pkg/controller/tas/topology_ungater.go``), given the podset's ``topologyRequest``: the index its
    ``podIndexLabel`` gives, plus, for a podset of replicated Jobs, its Job's index (``subGroupIndexLabel``)
    times the pods of one Job, less the pod's ``pod-index-offset``. None where the pod carries no rank."""
    meta = pod.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    key = str(request.get("podIndexLabel") or "")
    index = _index(labels.get(key, annotations.get(key))) if key else None
    if index is None:
        return None
    rank = index - (_index(annotations.get(KUEUE_INDEX_OFFSET)) or 0)
    if sub := str(request.get("subGroupIndexLabel") or ""):
        jobs = int(request.get("subGroupCount") or 0)
        job = _index(labels.get(sub))
        if jobs < 1 or job is None or job >= jobs or index >= count // jobs:
            return None
        rank += job * (count // jobs)
    return rank if 0 <= rank < count else None


def carried_level(key: str) -> str | None:
    """``key`` if it is a Kueue topology level the compute cluster holds a podset to (``kept_together``)."""
    if key == HOSTNAME:
        return key
    if not key or NODE_SELECTOR_DROPPED.match(key) or key in node_labels("", ""):
        return None
    return key


def role_of(pod: Obj) -> str | None:
    """The pod's role in its gang, as its operator marks it: a task of the gang in the compute cluster, whose
    pods ask alike and state the same placement rules."""
    meta = pod.get("metadata", {})
    for key in ROLE_KEYS:
        value = (meta.get("annotations") or {}).get(key) or (meta.get("labels") or {}).get(key)
        if value:
            return re.sub(r"[^A-Za-z0-9_.-]", "-", str(value).lower())[:63].strip("-_.") or None
    # a LeaderWorkerSet's leader may have a template of its own, and has the group's exclusive placement terms
    if (index := (meta.get("labels") or {}).get(LWS_WORKER_INDEX)) is not None:
        return "leader" if index == "0" else "worker"
    return None


# -------------------------------------------------------------------------------------- refusals
def _containers(spec: Obj) -> list[Obj]:
    """Every container of a pod, its ephemeral ones (``kubectl debug``) too: each is refused or translated
    by the same rules."""
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def refusal(pod: Obj, level: PodSecurity = "baseline", claims: bool = False) -> str | None:
    """Why this pod may not run in the shared cluster, or None. Checked before anything is created.
    ``claims``: the vnode provisions a storage class (vnode/volumes.py), so claims may be mounted."""
    spec = pod.get("spec", {})
    for vol in spec.get("volumes", []):
        kinds = [k for k in vol if k != "name"]
        for kind in kinds:
            if kind == "hostPath":
                return f"volume {vol.get('name')!r} uses hostPath, which the shared compute cluster does not allow"
            if kind == "persistentVolumeClaim" and not claims:
                return (f"volume {vol.get('name')!r} has type persistentVolumeClaim, and this virtual node "
                        "provisions no storage class (its --storage-class)")
            if kind not in SUPPORTED_VOLUMES and kind != "persistentVolumeClaim":
                return (f"volume {vol.get('name')!r} has type {kind}, which Kube-Ferry cannot provide in the "
                        f"compute cluster (supported: {', '.join(sorted(SUPPORTED_VOLUMES))})")
    return violation(pod, level)


# ----------------------------------------------------------------------------------------- needs
def needs_of(pod: Obj) -> Needs:
    spec = pod.get("spec", {})
    out = Needs(subdomain=spec.get("subdomain") or None)
    for vol in spec.get("volumes", []):
        if cm := vol.get("configMap"):
            out.configmaps.add(cm["name"])
        if sec := vol.get("secret"):
            out.secrets.add(sec["secretName"])
        out.identity = out.identity or _names_identity(vol.get("downwardAPI"))
        for src in (vol.get("projected") or {}).get("sources") or []:
            if cm := src.get("configMap"):
                out.configmaps.add(cm["name"])
            if sec := src.get("secret"):
                out.secrets.add(sec["name"])
            if tok := src.get("serviceAccountToken"):
                out.token = out.token or tok
            out.identity = out.identity or _names_identity(src.get("downwardAPI"))
    for c in _containers(spec):
        for env in c.get("env") or []:
            ref = env.get("valueFrom") or {}
            if cm := ref.get("configMapKeyRef"):
                out.configmaps.add(cm["name"])
            if sec := ref.get("secretKeyRef"):
                out.secrets.add(sec["name"])
        for src in c.get("envFrom") or []:
            if cm := src.get("configMapRef"):
                out.configmaps.add(cm["name"])
            if sec := src.get("secretRef"):
                out.secrets.add(sec["name"])
    for ref in spec.get("imagePullSecrets") or []:
        out.secrets.add(ref["name"])
    return out


# what a downward-API file of the tenant pod's identity and metadata reads from the pod's Secret (its token's,
# Copies._token): the copy's own name is not the pod's, and its labels and annotations carry Kube-Ferry's keys
IDENTITY_KEYS = {"metadata.namespace": "namespace", "metadata.name": "name", "metadata.uid": "uid",
                 "metadata.labels": "labels", "metadata.annotations": "annotations"}


def pod_view(pod: Obj) -> dict[str, str]:
    """The files of ``IDENTITY_KEYS`` as the kubelet would write them for the tenant pod: its name, namespace
    and UID, and its own labels and annotations (``followed``: those the copy follows), one ``key="value"``
    line each, sorted by key."""
    meta = pod["metadata"]
    labels, annotations = followed(meta)
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
            "labels": _kubelet_map(labels), "annotations": _kubelet_map(annotations)}


def _kubelet_map(items: dict[str, str]) -> str:
    """A map as the kubelet writes it to a downward-API file (Go's ``%v=%q`` per key, sorted, newline-joined)."""
    return "\n".join(f"{k}={go_quote(v)}" for k, v in sorted(items.items()))


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
               "\\": "\\\\", '"': '\\"'}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: printable characters as they are (Python's ``isprintable`` is Go's ``IsPrint``),
    the C escapes, and any other character as ``\\x``, ``\\u`` or ``\\U`` with its code."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _names_identity(dapi: Obj | None) -> bool:
    return any((i.get("fieldRef") or {}).get("fieldPath") in IDENTITY_KEYS for i in (dapi or {}).get("items") or [])


def token_secret_name(b: Bridge, pod: Obj) -> str:
    """The compute Secret of a pod's ServiceAccount token and of its identity as downward-API files read it."""
    meta = pod["metadata"]
    return naming.compute_name(b.tenant, meta["namespace"], meta["name"]) + "-sa-token"


# ----------------------------------------------------------------------------------- compute pod
def _kept(items: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (items or {}).items()
            if (not k.startswith(PREFIX) or k in PASS_THROUGH) and k not in DROPPED_ANNOTATIONS}


def followed(meta: Obj) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations of a tenant pod that its compute copy follows while both live: the
    tenant's own (a Service that selects the pod once it is labelled, a leader's role, the downward API's
    files). Kube-Ferry's keys are read once, at creation, as a pod's resources are: a running pod does not
    change what it was scheduled as."""
    def own(items: dict[str, str] | None) -> dict[str, str]:
        return {k: v for k, v in _kept(items).items() if not k.startswith(PREFIX)}  # not even PASS_THROUGH's
    return own(meta.get("labels")), own(meta.get("annotations"))


def _followed_keys(labels: dict[str, str], annotations: dict[str, str]) -> str:
    return json.dumps({"labels": sorted(labels), "annotations": sorted(annotations)}, separators=(",", ":"))


def metadata_patch(pod: Obj, copied: Obj) -> Obj | None:
    """The merge patch that brings the copy's labels and annotations to the tenant pod's (None: they
    agree). A key is removed only if the copy followed it (``FOLLOWED_ANNOTATION``): what the compute
    cluster's own admission added (a mesh's labels, a policy's annotations) stays."""
    labels, annotations = followed(pod["metadata"])
    cmeta = copied["metadata"]
    try:
        before = json.loads((cmeta.get("annotations") or {}).get(FOLLOWED_ANNOTATION) or "{}")
    except ValueError:
        before = {}
    patch: Obj = {}
    for field_name, want in (("labels", labels), ("annotations", annotations)):
        have = cmeta.get(field_name) or {}
        change: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
        change |= {k: None for k in before.get(field_name) or [] if k not in want and k in have}
        if change:
            patch[field_name] = change
    keys = _followed_keys(labels, annotations)
    if keys != (cmeta.get("annotations") or {}).get(FOLLOWED_ANNOTATION):
        patch.setdefault("annotations", {})[FOLLOWED_ANNOTATION] = keys
    return {"metadata": patch} if patch else None


def compute_pod(pod: Obj, b: Bridge, slice_index: int | None = None) -> Obj:
    """The compute-cluster pod for a tenant pod bound to this vnode (``slice_index``: its slice of a sliced
    podset, told by its rank, which the Workload says how to read)."""
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    cname = naming.compute_name(b.tenant, ns, name)
    spec = copy.deepcopy(pod.get("spec", {}))
    node = spec.get("nodeName") or b.node
    labels = _kept(meta.get("labels"))
    labels.update(naming.owner_labels(b.tenant, b.node, ns, meta["uid"]))
    if (controller := controller_ref(pod)) is not None and controller.get("uid"):
        labels[UPSTREAM_CONTROLLER_LABEL] = str(controller["uid"])  # its next pod continues its job (scheduler runs.py)
    annotations = _kept(meta.get("annotations"))
    annotations[naming.UPSTREAM_NAME_ANNOTATION] = name
    annotations[FOLLOWED_ANNOTATION] = _followed_keys(*followed(meta))

    for key in ("nodeName", "priority", "priorityClassName", "preemptionPolicy", "serviceAccount",
                "serviceAccountName", "schedulingGates", "ephemeralContainers",
                "runtimeClassName", "overhead", "readinessGates"):
        spec.pop(key, None)
    spec["schedulerName"] = SCHEDULER_NAME
    # Held until the tenant pod records that its copy exists (see pods.py): the gate keeps it from
    # running, the finalizer keeps a deletion in that window visible to the vnode, even across a restart.
    spec["schedulingGates"] = [{"name": FORWARDING_GATE}]
    spec["automountServiceAccountToken"] = False
    spec["enableServiceLinks"] = False
    # What a kubelet would give it: its own name, as a DNS label (spec.hostname allows no dots).
    spec["hostname"] = spec.get("hostname") or name.split(".")[0][:63].rstrip("-") or "pod"
    mine = node_labels(node, b.tenant)
    _with_its_leader(meta, spec, node)
    if selector := spec.get("nodeSelector"):  # the virtual node's domain value means a domain of its own
        spec["nodeSelector"] = {k: v for k, v in selector.items()
                                if not NODE_SELECTOR_DROPPED.match(k) and mine.get(k) != v and v != domain_value(node)}
    if pool := b.pool_of(node):  # a GPU pool's virtual node: its pods run on the pool's compute nodes
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **pool}
    if (aff := spec.get("affinity")) is not None:
        if (kept := compute_node_affinity(aff.get("nodeAffinity"), mine)) is None:
            aff.pop("nodeAffinity", None)
        else:
            aff["nodeAffinity"] = kept
        for term in _pod_affinity_terms(aff):
            _in_compute_namespace(term, ns)
    for constraint in spec.get("topologySpreadConstraints") or []:  # it counts the pods of its own namespace
        _in_compute_namespace(constraint, ns)
    spec["tolerations"] = [t for t in spec.get("tolerations") or []
                           if not str(t.get("key", "")).startswith(("virtual-kubelet.io/", "node.kubernetes.io/"))]
    if b.dns_server and spec.get("dnsPolicy", "ClusterFirst") in ("ClusterFirst", "ClusterFirstWithHostNet"):
        spec["dnsPolicy"], spec["dnsConfig"] = "None", tenant_dns(spec.get("dnsConfig") or {}, ns, b)
    if sub := spec.get("subdomain"):
        svc = naming.compute_name(b.tenant, ns, sub)
        spec["subdomain"] = svc
        labels[naming.SUBDOMAIN_LABEL] = svc
    if gang := gang_of(pod):
        labels[POD_GROUP_LABEL] = naming.compute_name(b.tenant, ns, f"{gang.kind}.{gang.name}")
        _kept_in_one_domain(meta, spec, labels)  # whichever marker made the gang
        if slice_index is not None:
            _slice_in_one_domain(meta, spec, labels, slice_index)
    if role := role_of(pod):
        labels[TASK_LABEL] = role
    if (index := labels.get(SLICE_LABEL)) is not None:
        suffix = f"-slice-{index}"
        labels[TASK_LABEL] = (role or "worker")[:LABEL_VALUE_MAX - len(suffix)].rstrip("-_.") + suffix

    rename_cm, rename_sec = _renames(pod, b)
    token = token_secret_name(b, pod)
    for vol in spec.get("volumes", []):
        if cm := vol.get("configMap"):
            cm["name"] = rename_cm[cm["name"]]
        if sec := vol.get("secret"):
            sec["secretName"] = rename_sec[sec["secretName"]]
        if claim := vol.get("persistentVolumeClaim"):  # its compute claim (vnode/volumes.py)
            claim["claimName"] = naming.compute_name(b.tenant, ns, claim["claimName"])
        if proj := vol.get("projected"):
            proj["sources"] = [s for src in proj.get("sources") or []
                               for s in _projected(src, rename_cm, rename_sec, token)]
        if _names_identity(dapi := vol.get("downwardAPI")):  # the copy's own name is not the pod's: projected
            vol.pop("downwardAPI")
            vol["projected"] = {"sources": _downward(dapi, token),
                                **({"defaultMode": dapi["defaultMode"]} if "defaultMode" in dapi else {})}
    fields = _tenant_fields(pod, b)
    for c in _containers(spec):
        _translate_container(c, fields, rename_cm, rename_sec, b)
    if spec.get("imagePullSecrets"):
        spec["imagePullSecrets"] = [{"name": rename_sec[r["name"]]} for r in spec["imagePullSecrets"]]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": cname, "namespace": b.namespace, "labels": labels, "annotations": annotations,
                     "finalizers": [FORWARDING_GATE]},
        "spec": spec,
    }


def compute_ephemeral(pod: Obj, names: list[str], b: Bridge) -> list[Obj]:
    """The tenant pod's ephemeral containers ``names`` (``kubectl debug``) as its compute copy gets them: the
    same translation as its other containers (a pod's ephemeral containers can only be added, through the
    pod's ``ephemeralcontainers`` subresource)."""
    rename_cm, rename_sec = _renames(pod, b)
    fields = _tenant_fields(pod, b)
    out = [copy.deepcopy(c) for c in pod.get("spec", {}).get("ephemeralContainers") or [] if c.get("name") in names]
    for c in out:
        _translate_container(c, fields, rename_cm, rename_sec, b)
    return out


def _tenant_fields(pod: Obj, b: Bridge) -> dict[str, str]:
    """What the downward API gives a container of the tenant pod, where the compute copy would say
    otherwise: its own name, namespace and UID (a pod that looks itself up in its API, or names itself an
    owner, needs the tenant's), its node (the virtual node) and its ServiceAccount."""
    meta, spec = pod["metadata"], pod.get("spec", {})
    return {"metadata.namespace": meta["namespace"], "metadata.name": meta["name"], "metadata.uid": meta.get("uid", ""),
            "spec.nodeName": spec.get("nodeName") or b.node,
            "spec.serviceAccountName": spec.get("serviceAccountName") or "default"}


def _renames(pod: Obj, b: Bridge) -> tuple[dict[str, str], dict[str, str]]:
    """The compute names of the ConfigMaps and Secrets the pod references."""
    ns, needs = pod["metadata"]["namespace"], needs_of(pod)
    return ({n: naming.compute_name(b.tenant, ns, n) for n in needs.configmaps},
            {n: naming.compute_name(b.tenant, ns, n) for n in needs.secrets})


def _translate_container(c: Obj, fields: dict[str, str], cms: dict[str, str], secs: dict[str, str],
                         b: Bridge) -> None:
    _rewrite_env(c, fields, cms, secs)
    if b.tenant_api is not None:
        _tenant_api_env(c, b.tenant_api)


def tenant_dns(own: Obj, ns: str, b: Bridge) -> Obj:
    """What a kubelet of the tenant cluster would give a ClusterFirst pod -- its namespace's search path in
    the tenant's zone, ndots 5 -- with `ferry dns` as the nameserver, which finds peers by those names;
    the pod's own dnsConfig is merged in as a kubelet merges it."""
    zone = b.cluster_domain
    searches = [f"{ns}.svc.{zone}", f"svc.{zone}", zone]
    searches += [s for s in own.get("searches") or [] if s not in searches]
    options = {"ndots": {"name": "ndots", "value": "5"}}
    for opt in own.get("options") or []:
        options[opt.get("name", "")] = opt
    return {"nameservers": [b.dns_server, *[n for n in own.get("nameservers") or [] if n != b.dns_server]][:3],
            "searches": searches[:32], "options": list(options.values())}


def _projected(src: Obj, cms: dict[str, str], secs: dict[str, str], token: str) -> list[Obj]:
    """Rewrite one projected source; the token and the pod's namespace come from the token Secret."""
    if cm := src.get("configMap"):
        return [{"configMap": {**cm, "name": cms[cm["name"]]}}]
    if sec := src.get("secret"):
        return [{"secret": {**sec, "name": secs[sec["name"]]}}]
    if tok := src.get("serviceAccountToken"):
        return [{"secret": {"name": token, "items": [{"key": "token", "path": tok.get("path", "token")}]}}]
    if dapi := src.get("downwardAPI"):
        return _downward(dapi, token)
    return [src]


def _downward(dapi: Obj, token: str) -> list[Obj]:
    """Projected sources for downward-API items: the pod's name, namespace, UID, labels and annotations as the
    tenant pod's, from its Secret; the rest (its resources) as the compute copy's."""
    items = dapi.get("items") or []
    mine = [i for i in items if (i.get("fieldRef") or {}).get("fieldPath") in IDENTITY_KEYS]
    rest = [i for i in items if i not in mine]
    out: list[Obj] = []
    if rest:
        out.append({"downwardAPI": {"items": rest}})
    if mine:
        items = [{"key": IDENTITY_KEYS[i["fieldRef"]["fieldPath"]], "path": i["path"]} for i in mine]
        for item, i in zip(items, mine, strict=True):
            if "mode" in i:
                item["mode"] = i["mode"]
        out.append({"secret": {"name": token, "items": items}})
    return out


API_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT_HTTPS", "KUBERNETES_PORT")


def _tenant_api_env(c: Obj, api: tuple[str, int]) -> None:
    """Where in-cluster clients (client-go, the Python client, kubectl) find the API server: the tenant's,
    whose token and CA the pod is given, not the compute cluster's, which its kubelet would name. A value
    the container sets itself is kept; a container's own variables take precedence over a kubelet's."""
    host, port = api
    values = dict(zip(API_ENV, (host, str(port), str(port), f"tcp://{_url_host(host)}:{port}"), strict=True))
    own = {e.get("name") for e in c.get("env") or []}
    c["env"] = [*[{"name": k, "value": v} for k, v in values.items() if k not in own], *(c.get("env") or [])]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _rewrite_env(c: Obj, upstream: dict[str, str], cms: dict[str, str], secs: dict[str, str]) -> None:
    for env in c.get("env") or []:
        ref = env.get("valueFrom") or {}
        if (fr := ref.get("fieldRef")) and fr.get("fieldPath") in upstream:
            env.pop("valueFrom")
            env["value"] = upstream[fr["fieldPath"]]
        elif cm := ref.get("configMapKeyRef"):
            cm["name"] = cms[cm["name"]]
        elif sec := ref.get("secretKeyRef"):
            sec["name"] = secs[sec["name"]]
    for src in c.get("envFrom") or []:
        if cm := src.get("configMapRef"):
            cm["name"] = cms[cm["name"]]
        if sec := src.get("secretRef"):
            sec["name"] = secs[sec["name"]]


def _copy_metadata(b: Bridge, ns: str, name: str, kind: str) -> Obj:
    """The compute copy of tenant object ``ns/name``: its name, and the labels and annotation that own it."""
    return {"name": naming.compute_name(b.tenant, ns, name), "namespace": b.namespace,
            "labels": {**naming.owner_labels(b.tenant, b.node, ns), naming.KIND_LABEL: kind},
            "annotations": {naming.UPSTREAM_NAME_ANNOTATION: name}}


def copy_of(obj: Obj, b: Bridge, kind: str) -> Obj:
    """A compute-side copy of a tenant ConfigMap or Secret, owned by labels."""
    meta = obj["metadata"]
    out: Obj = {"apiVersion": "v1", "kind": kind, "metadata": _copy_metadata(b, meta["namespace"], meta["name"], kind)}
    for key in ("data", "binaryData", "stringData", "type", "immutable"):
        if key in obj:
            out[key] = obj[key]
    return out


def is_alias(svc: Obj) -> bool:
    """An ExternalName Service: a name for another name (``spec.externalName``), selecting no pods. Its
    namespace's bridged pods need it copied all the same, so that ``ferry dns`` answers its CNAME."""
    return (svc.get("spec") or {}).get("type") == "ExternalName"


def has_own_endpoints(svc: Obj) -> bool:
    """A Service without a selector that is not an alias: its endpoints are made by hand (an Endpoints object
    mirrored to EndpointSlices, or EndpointSlices), e.g. a database outside the cluster. Its EndpointSlices
    are copied with it (:func:`compute_endpoint_slice`). Not ``default/kubernetes``, the tenant cluster's
    own API, whose endpoints its apiserver keeps: it is no Service of the tenant's workloads."""
    meta = svc.get("metadata") or {}
    if (meta.get("namespace"), meta.get("name")) == ("default", "kubernetes"):
        return False
    return not is_alias(svc) and not (svc.get("spec") or {}).get("selector")


def selects(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    """A Service's selector chooses a pod with these labels (an empty selector chooses none: such a Service
    has endpoints of its own, :func:`has_own_endpoints`)."""
    return bool(selector) and all((labels or {}).get(k) == v for k, v in (selector or {}).items())


def used_by(svc: Obj, labels: dict[str, str] | None) -> bool:
    """A pod with these labels needs the tenant Service copied: its selector chooses the pod, or it selects
    no pods (an ExternalName Service, or one with endpoints of its own), so any pod of its namespace may
    look it up."""
    return is_alias(svc) or has_own_endpoints(svc) or selects((svc.get("spec") or {}).get("selector"), labels)


def compute_service(svc: Obj, b: Bridge) -> Obj:
    """The compute copy of a tenant Service that selects pods of this vnode, so that a Service name resolves
    (`ferry dns`) and routes to their compute pods: the same ports, the compute pods it selects (tenant
    labels are kept on them) and only this tenant's, of the Service's namespace. A cluster IP of its own,
    or none where the tenant's Service is headless; NodePort and LoadBalancer become ClusterIP (the
    tenant's clients do not reach the compute cluster's nodes). An ExternalName Service stays one."""
    meta, spec = svc["metadata"], svc.get("spec", {})
    ns = meta["namespace"]
    copied = {"apiVersion": "v1", "kind": "Service", "metadata": _copy_metadata(b, ns, meta["name"], "Service")}
    if is_alias(svc):  # the same name for the same other name
        return {**copied, "spec": {"type": "ExternalName", "externalName": spec.get("externalName", "")}}
    out: Obj = {"type": "ClusterIP",
                "ports": [{k: p[k] for k in ("name", "port", "protocol", "targetPort", "appProtocol") if k in p}
                          for p in spec.get("ports") or []],
                "publishNotReadyAddresses": bool(spec.get("publishNotReadyAddresses"))}
    if selector := spec.get("selector"):  # else the copies of its EndpointSlices are its endpoints
        out["selector"] = {**selector, naming.TENANT_LABEL: b.tenant, naming.UPSTREAM_NS_LABEL: ns}
    if spec.get("clusterIP") == "None":
        out["clusterIP"] = "None"
    return {**copied, "spec": out}


SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # an EndpointSlice's Service
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICES_MANAGED_BY = "vnode.kubeferry.io"  # the copies' manager: the clusters' EndpointSlice controllers leave them
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"  # what makes the slices of Services with a selector


def compute_endpoint_slice(es: Obj, b: Bridge) -> Obj:
    """The compute copy of a tenant EndpointSlice of a Service with endpoints of its own: the same addresses,
    conditions and ports, for the Service's compute copy. What names tenant objects (the node, the zone, a
    target reference) is left out: the compute cluster has none of them."""
    meta = es["metadata"]
    ns, service = meta["namespace"], (meta.get("labels") or {}).get(SERVICE_NAME_LABEL, "")
    copied = _copy_metadata(b, ns, meta["name"], "EndpointSlice")
    copied["labels"] |= {SERVICE_NAME_LABEL: naming.compute_name(b.tenant, ns, service),
                         MANAGED_BY_LABEL: SLICES_MANAGED_BY}
    endpoints = [{k: e[k] for k in ("addresses", "conditions", "hostname") if k in e}
                 for e in es.get("endpoints") or []]
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": copied,
            "addressType": es.get("addressType", "IPv4"), "endpoints": endpoints,
            "ports": [{k: p[k] for k in ("name", "port", "protocol", "appProtocol") if k in p}
                      for p in es.get("ports") or []]}


def api_service(address: str, port: int) -> tuple[Obj, Obj] | None:
    """The tenant cluster's ``default/kubernetes`` Service as compute pods reach it (``--tenant-api``), as a
    tenant Service with endpoints of its own and its one EndpointSlice, which the copies above translate:
    port 443 to ``address:port``, so that ``https://kubernetes.default.svc`` (Spark, many charts) reaches
    the pod's own cluster, as ``KUBERNETES_SERVICE_HOST`` does. None where ``address`` is no address an
    EndpointSlice may hold (loopback, link-local, unspecified: the API refuses them)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_loopback or ip.is_link_local or ip.is_unspecified:
        return None
    meta = {"namespace": "default", "name": "kubernetes"}
    svc = {"metadata": meta, "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]}}
    es = {"metadata": {**meta, "labels": {SERVICE_NAME_LABEL: "kubernetes"}},
          "addressType": "IPv6" if ip.version == 6 else "IPv4",
          "endpoints": [{"addresses": [str(ip)], "conditions": {"ready": True}}],
          "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}
    return svc, es


def slice_digest(es: Obj) -> str:
    """Changes when a copied EndpointSlice's payload does."""
    payload = {k: es.get(k) for k in ("addressType", "endpoints", "ports")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def subdomain_service(ns: str, subdomain: str, upstream: Obj | None, b: Bridge) -> Obj:
    """The headless Service behind a subdomain of pods in ``ns``: it chooses the compute pods of that
    subdomain (their hostname records need it), on the ports of the tenant's Service of that name, if any."""
    meta = _copy_metadata(b, ns, subdomain, "Service")
    ports = [{k: v for k, v in p.items() if k in ("name", "port", "protocol", "targetPort")}
             for p in ((upstream or {}).get("spec", {}).get("ports") or [])]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": "None", "selector": {naming.SUBDOMAIN_LABEL: meta["name"]},
                     "publishNotReadyAddresses": True, "ports": ports}}


def spec_digest(obj: Obj) -> str:
    """Changes when a copied Service's spec does (the API adds defaults to what it stores)."""
    return hashlib.sha256(json.dumps(obj.get("spec"), sort_keys=True).encode()).hexdigest()[:16]


def content_digest(obj: Obj) -> str:
    """Changes when a copy's payload changes (so updates propagate and no-ops are skipped)."""
    payload = {k: obj.get(k) for k in ("data", "binaryData", "type")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
