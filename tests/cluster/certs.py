"""The certificates and keys a control plane on loopback needs, made fresh for each one.

One CA signs the API server's serving certificate (for 127.0.0.1 and the names a pod uses for the
API) and a client certificate per identity; Kubernetes takes a client certificate's CN as the user
and its O entries as groups (``system:masters`` is the cluster admin, ``system:nodes`` with CN
``system:node:NAME`` a node, which the Node authorizer and NodeRestriction then hold to its own
node and pods). The service-account key pair signs and checks the tokens the controller-manager
mints for ServiceAccounts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=2)


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name([*parts, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, key, *, ca: bool) -> x509.CertificateBuilder:
    """A certificate of ``subject`` for ``key``'s public half, valid from a few minutes ago."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class CertificateAuthority:
    """A CA whose files live in ``folder`` (``ca.crt``, ``ca.key``), signing what :meth:`issue` asks."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name("jupyter-vgpu-test-ca")
        self._cert = (
            _builder(subject, subject, self._key, ca=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = folder / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """A certificate for a client (``organizations`` are its groups) or, with server names or
        addresses, for a server; written as ``NAME.crt`` and ``NAME.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        serving = bool(server_names or server_ips)
        builder = _builder(_name(common_name, organizations), self._cert.subject, key, ca=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if serving else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        if serving:
            alternatives = [x509.DNSName(item) for item in server_names] + [
                x509.IPAddress(ipaddress.ip_address(item)) for item in server_ips
            ]
            builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        return pair


def service_account_keys(folder: Path) -> KeyPair:
    """The RSA pair that signs ServiceAccount tokens (``sa.key``) and checks them (``sa.pub``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pair = KeyPair(folder / "sa.pub", folder / "sa.key")
    pair.key.write_bytes(_pem_key(key))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pair
