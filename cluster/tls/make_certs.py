#!/usr/bin/env python3
"""Make a private CA and TLS certificates for a *test* gear_flow/Dask deployment.

    python cluster/tls/make_certs.py --out cluster/tls/certs --hosts scheduler.example.org,10.0.0.5

writes, in ``--out``:

=====================  ==========================================================
``ca.pem``             the CA certificate: every process trusts it (``--tls-ca-file``)
``ca-key.pem``         the CA's private key: only needed to sign more certificates;
                       keep it off the cluster
``scheduler.pem``,     certificate and key of the scheduler (``dask scheduler
``scheduler-key.pem``  --tls-cert/--tls-key``)
``worker.pem``,        the workers' (``dask worker`` / ``dask cuda worker``)
``worker-key.pem``
``client.pem``,        the clients' (``gear-flow --tls-dir``, ``distributed.Security``)
``client-key.pem``
=====================  ==========================================================

Every leaf certificate is signed by the CA and valid for both TLS server and
client authentication (a worker both listens and connects); its subject
alternative names are ``--hosts`` plus ``localhost``, ``127.0.0.1`` and this
machine's host name.  Keys are ECDSA P-256, written with mode 0600.

Dask verifies the peer's certificate chain against the CA in both directions
(mutual TLS) but does not check host names, and does not tell roles apart: any
holder of a key and certificate signed by this CA can join as a worker or
connect as a client, and so run code on the cluster.  Guard the keys
accordingly.  For production, issue certificates from your organisation's CA.

Two backends: the ``cryptography`` package (``pip install gear-flow[cluster]``)
or, when that is missing, the ``openssl`` command line tool.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROLES = ("scheduler", "worker", "client")
FILES = ("ca.pem", "ca-key.pem") + tuple(f for r in ROLES for f in (f"{r}.pem", f"{r}-key.pem"))


def default_hosts(extra=()) -> list[str]:
    """``extra`` then localhost, 127.0.0.1 and this host's name, without repeats."""
    hosts = [h.strip() for h in extra if h and h.strip()]
    for h in ("localhost", "127.0.0.1", socket.gethostname()):
        if h and h not in hosts:
            hosts.append(h)
    return hosts


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return False
    return True


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


# -- cryptography backend -------------------------------------------------------------------------
def _make_with_cryptography(out: Path, hosts: list[str], days: int, name: str) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (out / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(out / "ca-key.pem", pem_key(ca_key))
    sans = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h) for h in hosts]
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-{role}")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, True, False, False, False, False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (out / f"{role}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(out / f"{role}-key.pem", pem_key(key))


# -- openssl backend ------------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")


def _make_with_openssl(out: Path, hosts: list[str], days: int, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "ca.ext").write_text(
            "basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier=hash\n"
        )
        san = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)
        (t / "leaf.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment,keyAgreement\n"
            f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={san}\nauthorityKeyIdentifier=keyid\n"
        )
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", "-new", *ec, "-keyout", "ca-key.pem", "-out", "ca.csr", "-subj", f"/CN={name} test CA", cwd=t)
        _openssl("x509", "-req", "-in", "ca.csr", "-signkey", "ca-key.pem", "-out", "ca.pem", "-days", str(days),
                 "-sha256", "-extfile", "ca.ext", cwd=t)  # fmt: skip
        for role in ROLES:
            _openssl("req", "-new", *ec, "-keyout", f"{role}-key.pem", "-out", f"{role}.csr",
                     "-subj", f"/CN={name}-{role}", cwd=t)  # fmt: skip
            _openssl("x509", "-req", "-in", f"{role}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                     "-CAcreateserial", "-out", f"{role}.pem", "-days", str(days), "-sha256",
                     "-extfile", "leaf.ext", cwd=t)  # fmt: skip
        for f in FILES:
            data = (t / f).read_bytes()
            if f.endswith("-key.pem"):
                _write_private(out / f, data)
            else:
                (out / f).write_bytes(data)


BACKENDS = {"cryptography": _make_with_cryptography, "openssl": _make_with_openssl}


def pick_backend(backend: str = "auto") -> str:
    """``auto``: cryptography when importable, else openssl when on PATH."""
    if backend != "auto":
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} must be one of {['auto', *BACKENDS]}")
        return backend
    try:
        import cryptography  # noqa: F401

        return "cryptography"
    except ImportError:
        pass
    if shutil.which("openssl"):
        return "openssl"
    raise RuntimeError("neither the cryptography package nor the openssl tool is available: pip install cryptography")


def make_certs(
    out, hosts=(), days: int = 30, backend: str = "auto", name: str = "gear-flow", force: bool = False
) -> dict:
    """Write a CA and scheduler/worker/client certificates into ``out``; returns ``{file: path}``.

    Refuses to overwrite existing files unless ``force``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    existing = [f for f in FILES if (out / f).exists()]
    if existing and not force:
        raise FileExistsError(f"{out} already holds {existing}; pass force=True (--force) to replace them")
    if not isinstance(days, int) or days < 1:
        raise ValueError(f"days ({days!r}) must be a positive integer")
    BACKENDS[pick_backend(backend)](out, default_hosts(hosts), days, name)
    return {f: str(out / f) for f in FILES}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="make_certs.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default=str(Path(__file__).with_name("certs")), help="output folder (default: %(default)s)")
    p.add_argument("--hosts", default="", help="comma-separated host names/IPs of the nodes, added to the certificates")
    p.add_argument("--days", type=int, default=30, help="validity in days (default: %(default)s)")
    p.add_argument("--backend", default="auto", choices=["auto", *BACKENDS], help="how to make them (default: auto)")
    p.add_argument("--force", action="store_true", help="replace existing files")
    args = p.parse_args(argv)
    try:
        files = make_certs(args.out, args.hosts.split(","), args.days, args.backend, force=args.force)
    except (FileExistsError, RuntimeError, ValueError) as e:
        print(f"make_certs.py: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(Path(f).name for f in files.values())} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
