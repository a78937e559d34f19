"""Certificates for the multi-host tests, made as a cluster's operator makes them: a CA,
and for each host and client a key and a certificate the CA signs (X.509 with the host's
IP address as subject alternative name), written as PEM files; plus what must be refused:
a certificate of another CA, and an expired one. Made with ``cryptography``."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


class CertificateAuthority:
    """A CA whose certificate and key live in ``directory`` (``<name>-ca.pem``)."""

    def __init__(self, directory: Path, name: str = "cluster") -> None:
        self.directory, self.name = directory, name
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(f"{name} CA"))
            .issuer_name(_name(f"{name} CA"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common: str, addresses: list[str] = (), *, expired: bool = False) -> tuple[Path, Path]:
        """``(certificate file, key file)`` for ``common``, valid for ``addresses`` (IPs)
        and ``localhost``, for both TLS server and client use; ``expired``: valid only
        until yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (
            (now - dt.timedelta(days=3), now - dt.timedelta(days=1))
            if expired
            else (
                now - dt.timedelta(days=1),
                now + dt.timedelta(days=30),
            )
        )
        names = [x509.DNSName("localhost"), *(x509.IPAddress(ipaddress.ip_address(a)) for a in addresses)]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        stem = self.directory / f"{self.name}-{common}{'-expired' if expired else ''}"
        cert_file, key_file = stem.with_suffix(".pem"), stem.with_suffix(".key")
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_file)
        return cert_file, key_file
