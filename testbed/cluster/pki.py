"""The cluster's own certificate authority, serving and client certificates, made with openssl.

ECDSA P-256 keys: generated in milliseconds and accepted everywhere Kubernetes takes a key (serving,
client certificates, service-account token signing). Nothing here is meant to outlive a test run.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from goodput.testbed.cluster.config import FRONT_PROXY_CLIENT, LOOPBACK, SERVICE_CIDR

VALID_DAYS = 3650
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


class PkiError(RuntimeError):
    """openssl is missing or refused a step."""


@dataclass(frozen=True, slots=True)
class Subject:
    common_name: str
    organization: str | None = None

    def openssl(self) -> str:
        parts = [f"/O={self.organization}"] if self.organization else []
        return "".join([*parts, f"/CN={self.common_name}"])


def first_service_ip(service_cidr: str = SERVICE_CIDR) -> str:
    """The ClusterIP of the `kubernetes` Service: the first address of the service range."""
    return str(next(ipaddress.ip_network(service_cidr).hosts()))


def apiserver_subject_alt_names() -> str:
    names = [f"DNS:{name}" for name in APISERVER_DNS_NAMES]
    names += [f"IP:{LOOPBACK}", f"IP:{first_service_ip()}"]
    return ",".join(names)


def create_cluster_pki(pki_dir: Path) -> None:
    """CA, apiserver serving certificate, admin client certificate (system:masters), the aggregator's
    front-proxy client certificate, service-account key pair. File names follow `StatePaths.cert/key`:
    ca, apiserver, admin, front-proxy-client, service-account (+ .pub).
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PkiError("openssl is not installed (Debian: apt-get install openssl)")
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = pki_dir / "ca.crt", pki_dir / "ca.key"
    _run(
        openssl, "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-keyout", str(ca_key), "-out", str(ca_cert), "-days", str(VALID_DAYS),
        "-subj", Subject("goodput-local-ca").openssl(),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    _issue(
        openssl, pki_dir, "apiserver", Subject("kube-apiserver"), ca=(ca_cert, ca_key),
        extensions=f"subjectAltName={apiserver_subject_alt_names()}\nextendedKeyUsage=serverAuth\n",
    )  # fmt: skip
    admin = Subject("goodput-admin", organization="system:masters")
    _issue(openssl, pki_dir, "admin", admin, ca=(ca_cert, ca_key), extensions="extendedKeyUsage=clientAuth\n")
    # The aggregator presents this client certificate to extension API servers (KEDA's metrics
    # adapter) and vouches for the user in request headers they trust only from this name.
    _issue(
        openssl, pki_dir, FRONT_PROXY_CLIENT, Subject(FRONT_PROXY_CLIENT), ca=(ca_cert, ca_key),
        extensions="extendedKeyUsage=clientAuth\n",
    )  # fmt: skip
    _run(
        openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-out", str(pki_dir / "service-account.key"),
    )  # fmt: skip
    # The API server verifies tokens with the public half (it does not derive it from a PKCS#8 EC key).
    _run(openssl, "pkey", "-in", str(pki_dir / "service-account.key"), "-pubout",
         "-out", str(pki_dir / "service-account.pub"))  # fmt: skip
    for key in pki_dir.glob("*.key"):
        key.chmod(0o600)


def issue_client_certificate(pki_dir: Path, name: str, subject: Subject) -> None:
    """A client certificate `name`.crt/.key signed by the cluster's CA: the API server knows its
    holder as `subject.common_name` (in group `subject.organization`), in RBAC and in its audit log."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PkiError("openssl is not installed (Debian: apt-get install openssl)")
    ca = (pki_dir / "ca.crt", pki_dir / "ca.key")
    _issue(openssl, pki_dir, name, subject, ca=ca, extensions="extendedKeyUsage=clientAuth\n")
    (pki_dir / f"{name}.key").chmod(0o600)


def issue_service_certificate(pki_dir: Path, name: str, dns_names: Sequence[str]) -> None:
    """A certificate `name`.crt/.key signed by the cluster's CA that serves TLS for `dns_names` and
    authenticates as a client too (KEDA's operator and metrics adapter use one pair for both ends of
    their gRPC link and for the adapter's HTTPS)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PkiError("openssl is not installed (Debian: apt-get install openssl)")
    ca = (pki_dir / "ca.crt", pki_dir / "ca.key")
    alt_names = ",".join([*(f"DNS:{dns}" for dns in dns_names), f"IP:{LOOPBACK}"])
    extensions = f"subjectAltName={alt_names}\nextendedKeyUsage=serverAuth,clientAuth\n"
    _issue(openssl, pki_dir, name, Subject(dns_names[0]), ca=ca, extensions=extensions)
    (pki_dir / f"{name}.key").chmod(0o600)


def _issue(
    openssl: str, pki_dir: Path, name: str, subject: Subject, *, ca: tuple[Path, Path], extensions: str
) -> None:
    ca_cert, ca_key = ca
    key, cert = pki_dir / f"{name}.key", pki_dir / f"{name}.crt"
    with tempfile.TemporaryDirectory(prefix="goodput-pki-") as scratch:
        csr = Path(scratch) / f"{name}.csr"
        ext = Path(scratch) / f"{name}.ext"
        ext.write_text(
            extensions + "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        )
        _run(
            openssl, "req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-keyout", str(key), "-out", str(csr), "-subj", subject.openssl(),
        )  # fmt: skip
        _run(
            openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", str(VALID_DAYS), "-extfile", str(ext),
        )  # fmt: skip
    (pki_dir / "ca.srl").unlink(missing_ok=True)


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        raise PkiError(f"{' '.join(argv[:3])} failed ({result.returncode}): {result.stderr.strip()}")
