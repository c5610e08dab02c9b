"""Certificates and tokens for the local API server, made with the openssl CLI.

The API server serves TLS signed by a throwaway CA that clients verify (TLS verification stays on everywhere),
authenticates the admin by a static bearer token in ``system:masters``, and signs service-account tokens so tests
can act as the least-privilege identities the deploy manifests grant.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    admin_token: str
    tokens: dict[str, str]
    """bearer token per user of ``USERS`` (each component authenticates as itself)"""


USERS = ("system:kube-controller-manager", "system:kube-scheduler", "kwok-controller")
"""Static-token users besides the admin: the first two are bound by the API server's bootstrap
RBAC policy; the sandbox binds ``kwok-controller`` to KWOK's own ClusterRole."""


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> Pki:
    """Write a CA, a serving certificate for 127.0.0.1/localhost, a service-account key pair and a token file."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=crane-sandbox-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.crt"),
    )
    ext = d / "serving.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=kube-apiserver",
        "-keyout",
        str(d / "serving.key"),
        "-out",
        str(d / "serving.csr"),
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(d / "serving.csr"),
        "-CA",
        str(d / "ca.crt"),
        "-CAkey",
        str(d / "ca.key"),
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        str(ext),
        "-out",
        str(d / "serving.crt"),
    )
    _openssl("genrsa", "-out", str(d / "sa.key"), "2048")
    _openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
    token = secrets.token_hex(24)
    tokens = {user: secrets.token_hex(24) for user in USERS}
    token_file = d / "tokens.csv"
    lines = [f'{token},admin,admin-uid,"system:masters"']
    lines += [f"{tokens[user]},{user},{user}-uid" for user in USERS]
    # Create the file private: it holds every component's credentials.
    token_file.touch(mode=0o600)
    token_file.write_text("\n".join(lines) + "\n")
    return Pki(
        d / "ca.crt", d / "serving.crt", d / "serving.key", d / "sa.key", d / "sa.pub", token_file, token, tokens
    )
