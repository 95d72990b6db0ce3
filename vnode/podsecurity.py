"""The Pod Security Standards (baseline, restricted) as the vnode applies them to a tenant pod before its copy
is made: the compute cluster is shared, so what a tenant's pod may do on its nodes is the platform's choice
(``ferry vnode --pod-security``), not the tenant's. The same controls as the apiserver's PodSecurity
admission (https://kubernetes.io/docs/concepts/security/pod-security-standards/), said in words a tenant's
user reads in the refused pod's Event and status. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

Obj = dict[str, Any]
PodSecurity = Literal["privileged", "baseline", "restricted"]

# baseline: capabilities a container may add
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_CAPS = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def violation(pod: Obj, level: PodSecurity) -> str | None:
    """The first control of ``level`` the pod breaks, in words; None if it meets the level."""
    if level == "privileged":
        return None
    return next(_baseline(pod, level), None) or (next(_restricted(pod), None) if level == "restricted" else None)


def _containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def _baseline(pod: Obj, level: str) -> Iterator[str]:
    spec = pod.get("spec", {})
    psc = spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            yield f"spec.{host} is not allowed by the {level} Pod Security level"
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        yield f"a Windows HostProcess pod is not allowed by the {level} Pod Security level"
    unsafe = sorted(s.get("name", "") for s in psc.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS)
    if unsafe:
        yield f"sysctls {', '.join(unsafe)} are not allowed by the {level} Pod Security level"
    yield from _profiles("the pod", psc, level)
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and value not in ("", "runtime/default") \
                and not str(value).startswith("localhost/"):
            yield f"AppArmor profile {value!r} of container {key[len(APPARMOR_ANNOTATION):]!r} is not allowed " \
                  f"by the {level} Pod Security level"
    allowed = RESTRICTED_CAPS if level == "restricted" else BASELINE_CAPS
    for c in _containers(spec):
        sc, name = c.get("securityContext") or {}, c.get("name")
        if sc.get("privileged"):
            yield f"container {name!r} is privileged, which the {level} Pod Security level does not allow"
        extra = set((sc.get("capabilities") or {}).get("add") or []) - allowed
        if extra:
            yield f"container {name!r} adds capabilities {', '.join(sorted(extra))} beyond the {level} " \
                  f"Pod Security level"
        if any(p.get("hostPort") for p in c.get("ports") or []):
            yield f"container {name!r} uses a hostPort, which the {level} Pod Security level does not allow"
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"container {name!r} is a Windows HostProcess container, which the {level} Pod Security " \
                  f"level does not allow"
        if sc.get("procMount") not in (None, "Default"):
            yield f"container {name!r} sets procMount {sc['procMount']}, which the {level} Pod Security level " \
                  f"does not allow"
        yield from _profiles(f"container {name!r}", sc, level)


def _profiles(who: str, sc: Obj, level: str) -> Iterator[str]:
    """seccomp, AppArmor and SELinux settings of a pod's or a container's security context."""
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield f"{who} sets seccomp profile Unconfined, which the {level} Pod Security level does not allow"
    if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        yield f"{who} sets AppArmor profile Unconfined, which the {level} Pod Security level does not allow"
    se = sc.get("seLinuxOptions") or {}
    if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
        yield f"{who} sets SELinux options beyond the {level} Pod Security level (a type of " \
              f"{', '.join(sorted(SELINUX_TYPES - {''}))}, no user or role)"


def _restricted(pod: Obj) -> Iterator[str]:
    spec = pod.get("spec", {})
    psc = spec.get("securityContext") or {}
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in _containers(spec):
        sc, name = c.get("securityContext") or {}, c.get("name")
        if sc.get("allowPrivilegeEscalation", True):
            yield f"container {name!r} must set allowPrivilegeEscalation: false (restricted Pod Security level)"
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            yield f"container {name!r} must drop capabilities ALL (restricted Pod Security level)"
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            yield f"container {name!r} must set runAsNonRoot: true, or its pod must (restricted Pod Security level)"
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            yield f"container {name!r} must not run as user 0 (restricted Pod Security level)"
        if (sc.get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            yield f"container {name!r} must set a seccomp profile RuntimeDefault or Localhost, or its pod must " \
                  f"(restricted Pod Security level)"
