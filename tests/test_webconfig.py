"""--web.config.file (exporter-toolkit format): a real TLS handshake, basic auth, client
certificates, a real Prometheus scraping over TLS with basic auth, and SIGHUP reloads."""

import base64
import json
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import bcrypt
import pytest
from conftest import FIXTURES
from procs import REPO, Process, exporter_command, free_port, start_prometheus, wait_for

from exporter.exposition import MAX_LABEL_VALUE, Family, Renderer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    d = tmp_path / "pki"
    d.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gpunet test CA",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                "-out", str(d / f"{name}.csr"))
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt"))
    return d


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write_config(path, pki, users: dict[str, str], client_auth: str = "NoClientCert") -> None:
    tls = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"), "client_auth_type": client_auth}
    if client_auth != "NoClientCert":
        tls["client_ca_file"] = str(pki / "ca.crt")
    path.write_text(json.dumps({"tls_server_config": tls,
                                "basic_auth_users": {u: bcrypt_hash(p) for u, p in users.items()}}))


def get(url: str, pki, user: str | None = None, password: str | None = None, client_cert: bool = False) -> int:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=ctx, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def exporter(tmp_path):
    procs = []

    def start(config) -> str:
        port = free_port()
        proc = Process(exporter_command("--root", str(FIXTURES / "roce-mlx5"), "--listen", f"127.0.0.1:{port}",
                                        f"--web.config.file={config}"), tmp_path / f"exp-{port}.log", cwd=REPO)
        procs.append(proc)
        import socket
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True,
                 what="exporter listening")
        proc.url = f"https://127.0.0.1:{port}"
        return proc

    yield start
    for p in procs:
        p.stop()


def test_tls_and_basic_auth(tmp_path, pki, exporter):
    config = tmp_path / "web.yml"
    write_config(config, pki, {"prometheus": "right-horse"})
    proc = exporter(config)
    assert get(proc.url + "/metrics", pki, "prometheus", "right-horse") == 200
    assert get(proc.url + "/metrics", pki, "prometheus", "wrong") == 401
    assert get(proc.url + "/metrics", pki) == 401
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer from TLS
        urllib.request.urlopen(proc.url.replace("https", "http") + "/metrics", timeout=3)


def test_client_certificate_required(tmp_path, pki, exporter):
    config = tmp_path / "web.yml"
    write_config(config, pki, {}, client_auth="RequireAndVerifyClientCert")
    proc = exporter(config)
    assert get(proc.url + "/healthz", pki, client_cert=True) == 200
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
        get(proc.url + "/healthz", pki, client_cert=False)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_real_prometheus_scrapes_over_tls_with_basic_auth(tmp_path, pki, exporter):
    config = tmp_path / "web.yml"
    write_config(config, pki, {"prometheus": "right-horse"})
    proc = exporter(config)
    target = proc.url.removeprefix("https://")
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "gpunet", "scheme": "https", "tls_config": {"ca_file": str(pki / "ca.crt")},
         "basic_auth": {"username": "prometheus", "password": "right-horse"},
         "static_configs": [{"targets": [target]}]},
        {"job_name": "wrong-password", "scheme": "https", "tls_config": {"ca_file": str(pki / "ca.crt")},
         "basic_auth": {"username": "prometheus", "password": "nope"}, "static_configs": [{"targets": [target]}]}]}))
    prom, url = start_prometheus([f"--config.file={prom_config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
                                 tmp_path / "prom.log")
    try:
        def health():
            body = urllib.request.urlopen(url + "/api/v1/targets", timeout=5).read()
            targets = {t["labels"]["job"]: t for t in json.loads(body)["data"]["activeTargets"]}
            return targets if all(t["health"] != "unknown" for t in targets.values()) and len(targets) == 2 else None
        targets = wait_for(health, timeout=30, what="both scrapes tried")
        assert targets["gpunet"]["health"] == "up", targets["gpunet"]["lastError"]
        assert targets["wrong-password"]["health"] == "down" and "401" in targets["wrong-password"]["lastError"]
    finally:
        prom.stop()


def test_sighup_reloads_users_and_keeps_the_old_file_when_the_new_is_broken(tmp_path, pki, exporter):
    config = tmp_path / "web.yml"
    write_config(config, pki, {"prometheus": "first"})
    proc = exporter(config)
    assert get(proc.url + "/metrics", pki, "prometheus", "first") == 200
    write_config(config, pki, {"prometheus": "second"})
    proc.popen.send_signal(signal.SIGHUP)
    wait_for(lambda: get(proc.url + "/metrics", pki, "prometheus", "second") == 200, what="reload")
    assert get(proc.url + "/metrics", pki, "prometheus", "first") == 401
    config.write_text("tls_server_config: [unclosed\n")
    proc.popen.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert proc.alive() and get(proc.url + "/metrics", pki, "prometheus", "second") == 200
    assert "reload refused" in proc.log()


def test_label_values_are_bounded_and_escaped():
    body = Renderer().render([Family("gpunet_nic_info", "gauge", "x", [
        ("gpunet_nic_info", ("device", "driver"), ("eth0", 'we"ird\n' + "x" * 500), 1.0)])], openmetrics=False)
    line = body.decode().splitlines()[-1]
    assert 'driver="we\\"ird\\n' in line and len(line) < MAX_LABEL_VALUE + 80
