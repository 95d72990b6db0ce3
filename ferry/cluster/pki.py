"""Certificates and keys for local control planes (one CA per cluster: separate trust domains)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=3650)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


class CertificateAuthority:
    """A CA whose key stays in its folder; issues serving and client certificates."""

    def __init__(self, folder: Path, common_name: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.cert_path = folder / "ca.crt"
        self.key_path = folder / "ca.key"
        now = dt.datetime.now(dt.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        self.key_path.write_bytes(_key_pem(self._key))
        self.key_path.chmod(0o600)

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

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
        now = dt.datetime.now(dt.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, orgs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        alt += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = CertPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        return pair


def service_account_keys(folder: Path) -> CertPair:
    """RSA key pair the apiserver signs service-account tokens with (``cert`` holds the public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = folder / "sa.pub"
    priv = folder / "sa.key"
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    priv.write_bytes(_key_pem(key))
    priv.chmod(0o600)
    return CertPair(pub, priv)
