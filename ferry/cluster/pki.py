"""Certificates and keys for local control planes (one CA per cluster: separate trust domains)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ferry import certs


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


def _write_key(path: Path, key: certs.PrivateKey) -> None:
    path.write_bytes(certs.key_pem(key))
    path.chmod(0o600)


class CertificateAuthority:
    """A CA whose key stays in its folder; issues serving and client certificates."""

    def __init__(self, folder: Path, common_name: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.cert_path = folder / "ca.crt"
        self.key_path = folder / "ca.key"
        self._ca = certs.new_ca(common_name)
        self.cert_path.write_bytes(self.pem)
        _write_key(self.key_path, self._ca.key)

    @property
    def pem(self) -> bytes:
        return certs.cert_pem(self._ca.cert)

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        orgs: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> CertPair:
        """Write ``stem.crt``/``stem.key`` signed by this CA."""
        made = certs.issue(self._ca, common_name, orgs=orgs, dns=dns, ips=ips, server=server, client=client)
        pair = CertPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        pair.cert.write_bytes(certs.cert_pem(made.cert))
        _write_key(pair.key, made.key)
        return pair


def service_account_keys(folder: Path) -> CertPair:
    """RSA key pair the apiserver signs service-account tokens with (``cert`` holds the public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = folder / "sa.pub"
    priv = folder / "sa.key"
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    _write_key(priv, key)
    return CertPair(pub, priv)
