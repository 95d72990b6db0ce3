"""kubeconfig files with embedded credentials, so they can be copied anywhere."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write(path: Path, *, cluster: str, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
