"""``python -m crane_extender`` over HTTPS as kube-scheduler's extender config expects (enableHTTPS, tlsConfig with
caData and certFile/keyFile): the serving certificate verifies against the CA, and with --client-ca-file a
client without a certificate signed by that CA is refused during the handshake."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from crane_sandbox.pki import Pki, make_pki
from crane_sandbox.procs import ManagedProcess, free_port

FILTER = {
    "Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}},
    "Nodes": {"items": []},
}


def _client_cert(pki: Pki, directory: Path) -> tuple[Path, Path]:
    key, csr, cert = directory / "client.key", directory / "client.csr", directory / "client.crt"
    ext = directory / "client.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    ca_key = pki.ca_cert.parent / "ca.key"
    openssl = ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-scheduler"]
    subprocess.run([*openssl, "-keyout", str(key), "-out", str(csr)], check=True, capture_output=True)
    sign = ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(ca_key)]
    sign += ["-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert)]
    subprocess.run(sign, check=True, capture_output=True)
    return cert, key


@contextlib.asynccontextmanager
async def extender(pki: Pki, run_dir: Path, *extra: str) -> AsyncIterator[str]:
    port = free_port()
    proc = ManagedProcess(
        "crane-extender-tls",
        [
            *(sys.executable, "-m", "crane_extender", "--port", str(port), "--listen-address", "127.0.0.1"),
            *("--tls-cert-file", str(pki.serving_cert), "--tls-private-key-file", str(pki.serving_key), *extra),
        ],
        run_dir / f"crane-extender-tls-{port}.log",
    )
    await proc.start()
    try:
        await proc.wait_ready(lambda: _tcp(port), timeout=30)
        yield f"https://127.0.0.1:{port}"
    finally:
        await proc.stop()


async def _tcp(port: int) -> bool:
    from crane_sandbox.procs import tcp_open

    return await tcp_open("127.0.0.1", port)


async def _post(url: str, context: ssl.SSLContext | bool) -> int:
    async with aiohttp.ClientSession() as s, s.post(url, json=FILTER, ssl=context) as r:
        await r.read()
        return r.status


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("extender-pki"))


async def test_https_with_the_ca_verifies_and_plain_http_is_not_served(pki: Pki, tmp_path: Path) -> None:
    async with extender(pki, tmp_path) as base:
        trusting = ssl.create_default_context(cafile=str(pki.ca_cert))
        assert await _post(f"{base}/extender/filter", trusting) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # verification stays on: unknown CA fails
            await _post(f"{base}/extender/filter", ssl.create_default_context())
        with pytest.raises(aiohttp.ClientError):
            await _post(base.replace("https://", "http://") + "/extender/filter", False)


async def test_client_certificate_required_with_client_ca_file(pki: Pki, tmp_path: Path) -> None:
    cert, key = _client_cert(pki, tmp_path)
    async with extender(pki, tmp_path, "--client-ca-file", str(pki.ca_cert)) as base:
        anonymous = ssl.create_default_context(cafile=str(pki.ca_cert))
        assert await _post(f"{base}/extender/filter", anonymous) == 403
        with_cert = ssl.create_default_context(cafile=str(pki.ca_cert))
        with_cert.load_cert_chain(str(cert), str(key))
        assert await _post(f"{base}/extender/filter", with_cert) == 200
        # the kubelet's probes present no certificate: they still reach the health endpoints
        async with aiohttp.ClientSession() as s, s.get(f"{base}/healthz", ssl=anonymous) as r:
            assert r.status == 200
        # a certificate another CA signed fails the handshake
        other = make_pki(tmp_path / "other")
        (tmp_path / "other-client").mkdir()
        foreign_cert, foreign_key = _client_cert(other, tmp_path / "other-client")
        foreign = ssl.create_default_context(cafile=str(pki.ca_cert))
        foreign.load_cert_chain(str(foreign_cert), str(foreign_key))
        with pytest.raises(aiohttp.ClientError):
            await _post(f"{base}/extender/filter", foreign)


def test_tls_flags_are_checked_before_serving(pki: Pki) -> None:
    for argv, named in (
        (["--tls-cert-file", str(pki.serving_cert)], "--tls-private-key-file"),
        (["--client-ca-file", str(pki.ca_cert)], "--client-ca-file"),
        (["--tls-cert-file", "/nonexistent", "--tls-private-key-file", "/nonexistent"], "--tls-cert-file"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "crane_extender", *argv], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and named in done.stderr, done.stderr
