"""`--web.config.file`: TLS, basic auth, response headers and a rate limit in the Prometheus
exporter-toolkit's format, so operators reuse the file they already have for node_exporter:

    tls_server_config:
      cert_file: server.crt            # or cert: <inline PEM>
      key_file: server.key             # or key: <inline PEM>
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), ...
      client_ca_file: ca.crt           # or client_ca: <inline PEM>
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # TLS 1.2 and below, Go's names
      prefer_server_cipher_suites: true
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...            # bcrypt hash, as htpasswd -nBC 10 writes it
    rate_limit: {interval: 100ms, burst: 20}

Every key is either honoured or refused by name: a file that loads is a file that works.
Refused because Python's TLS cannot do what Go's does: `RequireAnyClientCert` (a client
certificate without verification), `curve_preferences`, `http2: true`. Relative paths are
relative to the file. Each load builds a fresh TLS context; SIGHUP loads the file again and
the server swaps the new context in (exporter/cli.py), so removed CAs, certificates and
users lose access at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpunet.window import parse_duration

if TYPE_CHECKING:  # imported where a TLS context is built: without TLS the exporter never loads it
    import ssl

# exporter-toolkit's client_auth_type -> what Python's ssl does. RequestClientCert asks for a
# certificate and ignores it, so it admits the same clients as NoClientCert.
CLIENT_AUTH = {"NoClientCert": "CERT_NONE", "RequestClientCert": "CERT_NONE",
               "VerifyClientCertIfGiven": "CERT_OPTIONAL", "RequireAndVerifyClientCert": "CERT_REQUIRED"}
NEEDS_CA = {"VerifyClientCertIfGiven", "RequireAndVerifyClientCert"}
TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}  # ssl.TLSVersion
# Go's crypto/tls names (those tls.CipherSuites() and InsecureCipherSuites() list for TLS 1.2
# and below) -> OpenSSL's names for the same suites.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA", "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256", "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3 suites are listed by Go too but are not configurable there either: accepted, no effect.
TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
# The response headers exporter-toolkit lets a web config set, and the values it accepts.
HEADERS = {"Content-Security-Policy": None, "X-Frame-Options": {"deny", "sameorigin"},
           "X-Content-Type-Options": {"nosniff"}, "X-XSS-Protection": None, "Strict-Transport-Security": None}
KEYS = {"tls_server_config", "basic_auth_users", "http_server_config", "rate_limit"}
TLS_KEYS = {"cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file", "client_auth_type",
            "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
            "curve_preferences"}
REFUSED = {"curve_preferences": "is not supported (Python's ssl cannot order the curves); remove it"}


class WebConfigError(Exception):
    pass


@dataclass
class WebConfig:
    path: Path
    context: ssl.SSLContext | None = None  # TLS, None for plain HTTP
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    allowed_sans: frozenset[str] = frozenset()  # normalised (IPs in their canonical form)
    headers: dict[str, str] = field(default_factory=dict)
    rate_limit: tuple[float, int] | None = None  # (seconds between requests, burst)
    _verified: dict[str, bytes] = field(default_factory=dict)  # user -> digest of the verified password

    @classmethod
    def load(cls, path: str | Path) -> WebConfig:
        import yaml  # only with --web.config.file: an exporter without one does not load it

        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise WebConfigError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise WebConfigError(f"{where}: not YAML: {getattr(e, 'problem', e)}") from None
        doc = _mapping(path, "the file", doc if doc is not None else {}, KEYS)
        config = cls(path)
        tls = _mapping(path, "tls_server_config", doc.get("tls_server_config"), TLS_KEYS)
        if tls:
            config.context = _tls_context(path, tls)
            config.allowed_sans = _allowed_sans(path, tls)
        http = _mapping(path, "http_server_config", doc.get("http_server_config"), {"http2", "headers"})
        if http.get("http2") not in (None, False):
            raise WebConfigError(f"{path}: http_server_config.http2: gpunet-exporter serves HTTP/1.1 only; "
                                 "remove http2 or set it to false")
        config.headers = _headers(path, http.get("headers"))
        for user, hashed in _mapping(path, "basic_auth_users", doc.get("basic_auth_users"), None).items():
            config.users[str(user)] = _bcrypt_hash(path, str(user), hashed)
        config.rate_limit = _rate_limit(path, doc.get("rate_limit"))
        return config

    # --- basic auth --------------------------------------------------------------------
    # bcrypt is slow on purpose (~70 ms at cost 10), so the server asks `cached` on its event
    # loop and runs `verify` on a worker, a few at a time (exporter/server.py). A verified
    # password is remembered, one per user (a hash matches one password), by a digest keyed
    # with the user's hash, never in clear; wrong ones are not remembered, so guesses, however
    # many, cannot push out what the real scraper needs, and a reload keeps what still holds.
    def cached(self, header: str | None) -> bool | None:
        """True/False when known without bcrypt; None when `verify` must run."""
        if not self.users:
            return True
        pair = _credentials(header)
        if pair is None or pair[0] not in self.users:
            return False
        verified = self._verified.get(pair[0])
        if verified is not None and hmac.compare_digest(verified, self._digest(*pair)):
            return True
        return None

    def verify(self, header: str | None) -> bool:
        """The bcrypt check (blocking: run it off the event loop)."""
        cached = self.cached(header)
        if cached is not None:
            return cached
        user, password = _credentials(header) or ("", "")
        import bcrypt

        try:
            good = bcrypt.checkpw(password.encode(), self.users[user])
        except ValueError:  # a password bcrypt refuses (over 72 bytes in bcrypt 5) is no match
            good = False
        if good:
            self._verified[user] = self._digest(user, password)
        return good

    def keep_verified(self, previous: WebConfig) -> None:
        """Take over the passwords verified under the previous file, for the users whose
        hash is the same in this one (a changed or removed user is checked anew)."""
        for user, verified in previous._verified.items():
            if user in self.users and self.users[user] == previous.users.get(user):
                self._verified.setdefault(user, verified)

    def _digest(self, user: str, password: str) -> bytes:
        return hmac.new(self.users[user], password.encode(), hashlib.sha256).digest()

    def allows_peer(self, peercert: dict | None) -> bool:
        """client_allowed_sans: the verified client certificate names one of them."""
        if not self.allowed_sans:
            return True
        names = {_san(value) for kind, value in (peercert or {}).get("subjectAltName", ())
                 if kind in ("DNS", "IP Address", "email", "URI")}
        return bool(names & self.allowed_sans)


def _mapping(path: Path, where: str, value: object, known: set[str] | None) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{path}: {where}: expected a mapping, got {type(value).__name__}")
    if known is not None and (unknown := sorted(str(k) for k in value if k not in known)):
        raise WebConfigError(f"{path}: {where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return value


def _strings(path: Path, where: str, value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WebConfigError(f"{path}: {where}: expected a list of strings")
    return value


def _tls_context(path: Path, tls: dict) -> ssl.SSLContext:
    import ssl

    for key, reason in REFUSED.items():
        if key in tls:
            raise WebConfigError(f"{path}: tls_server_config.{key} {reason}")
    for inline, file in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if tls.get(inline) and tls.get(file):
            raise WebConfigError(f"{path}: tls_server_config: give {inline} or {file}, not both")
        if inline in tls and not isinstance(tls[inline], str) or file in tls and not isinstance(tls[file], str):
            raise WebConfigError(f"{path}: tls_server_config.{inline if inline in tls else file}: expected a string")
    if not (tls.get("cert") or tls.get("cert_file")) or not (tls.get("key") or tls.get("key_file")):
        raise WebConfigError(f"{path}: tls_server_config needs a certificate (cert_file or cert) and its key "
                             "(key_file or key)")
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth == "RequireAnyClientCert":
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type RequireAnyClientCert (a certificate "
                             "nobody verifies) is not supported: use RequireAndVerifyClientCert with client_ca_file")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type {auth!r} is not one of "
                             f"{', '.join(CLIENT_AUTH)}")
    has_ca = bool(tls.get("client_ca") or tls.get("client_ca_file"))
    if auth in NEEDS_CA and not has_ca:
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type {auth} needs client_ca_file (or client_ca): "
                             "without a CA no client certificate can be verified")
    if tls.get("client_allowed_sans") and auth != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{path}: tls_server_config.client_allowed_sans needs client_auth_type "
                             "RequireAndVerifyClientCert (otherwise a client may send no certificate at all)")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = tls.get(key, default)
        if name not in TLS_VERSIONS:
            raise WebConfigError(f"{path}: tls_server_config.{key} {name!r} is not one of {', '.join(TLS_VERSIONS)}")
        versions[key] = getattr(ssl.TLSVersion, TLS_VERSIONS[name])
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError(f"{path}: tls_server_config: min_version is above max_version")
    suites = _strings(path, "tls_server_config.cipher_suites", tls.get("cipher_suites"))
    unknown = [s for s in suites if s not in CIPHER_SUITES and s not in TLS13_SUITES]
    if unknown:
        raise WebConfigError(f"{path}: tls_server_config.cipher_suites: unknown {', '.join(unknown)} "
                             f"(Go's names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise WebConfigError(f"{path}: tls_server_config.prefer_server_cipher_suites: expected true or false")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca_file = _readable(path, tls, "client_ca_file") if tls.get("client_ca_file") else None
    loading = "min_version, max_version"  # what an error is about
    try:
        ctx.minimum_version, ctx.maximum_version = versions["min_version"], versions["max_version"]
        loading = f"{_source(tls, 'cert')} with {_source(tls, 'key')}"
        with _pem(path, tls, "cert") as cert, _pem(path, tls, "key") as key:
            ctx.load_cert_chain(cert, key)
        loading = _source(tls, "client_ca")
        if ca_file:
            ctx.load_verify_locations(cafile=ca_file)
        elif tls.get("client_ca"):
            ctx.load_verify_locations(cadata=tls["client_ca"])
        loading = "cipher_suites"
        ctx.verify_mode = getattr(ssl, CLIENT_AUTH[auth])
        tls12 = [CIPHER_SUITES[s] for s in suites if s in CIPHER_SUITES]
        if tls12:
            ctx.set_ciphers(":".join(tls12))
        if prefer:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    except (OSError, ssl.SSLError, ValueError) as e:
        raise WebConfigError(f"{path}: tls_server_config: {loading}: {getattr(e, 'strerror', None) or e}") from None
    return ctx


def _source(tls: dict, name: str) -> str:
    """How an error names a PEM: its file as written in the config, or that it is inline."""
    return f"{name}_file {tls[f'{name}_file']}" if tls.get(f"{name}_file") else f"{name} (inline)"


def _readable(path: Path, tls: dict, key: str) -> str:
    """The file a *_file key names (relative to the web config), checked here so that an
    error names it (OpenSSL's says only "No such file or directory"): readable, and a regular
    file (OpenSSL would wait forever on a FIFO)."""
    file = path.parent / tls[key]
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise WebConfigError(f"{path}: tls_server_config.{key}: {file}: {getattr(e, 'strerror', None) or e}") from None
    if not regular:
        raise WebConfigError(f"{path}: tls_server_config.{key}: {file}: not a regular file")
    return str(file)


class _pem:
    """The path of a PEM given as a file (relative to the web config) or inline; an inline
    one lives in an anonymous memory file for as long as the `with` lasts, never on disk."""

    def __init__(self, path: Path, tls: dict, name: str):
        self.path, self.tls, self.name = path, tls, name
        self.inline: str = tls.get(name) or ""
        self.fd: int | None = None

    def __enter__(self) -> str:
        if self.tls.get(f"{self.name}_file"):
            return _readable(self.path, self.tls, f"{self.name}_file")
        self.fd = os.memfd_create("gpunet-web-config", 0)
        os.write(self.fd, self.inline.encode())
        return f"/proc/self/fd/{self.fd}"

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _allowed_sans(path: Path, tls: dict) -> frozenset[str]:
    return frozenset(_san(s) for s in _strings(path, "tls_server_config.client_allowed_sans",
                                               tls.get("client_allowed_sans")))


def _san(value: str) -> str:
    """One spelling per name: Python writes IPv6 SANs in full and upper case."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value


def _headers(path: Path, value: object) -> dict[str, str]:
    headers = _mapping(path, "http_server_config.headers", value, set(HEADERS))
    out = {}
    for name, text in headers.items():
        if text in (None, ""):
            continue  # blank: unset, as in exporter-toolkit
        allowed = HEADERS[name]
        if not isinstance(text, str) or "\n" in text or "\r" in text or (allowed and text.lower() not in allowed):
            raise WebConfigError(f"{path}: http_server_config.headers.{name}: {text!r} is not accepted"
                                 + (f" (one of {', '.join(sorted(allowed))})" if allowed else ""))
        out[name] = text
    return out


# $2a$/$2b$/$2y$, a cost of 4 to 31, then 22 characters of salt and 31 of hash.
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


def _bcrypt_hash(path: Path, user: str, hashed: object) -> bytes:
    # Checked here by its shape (bcrypt itself would cost a hash per user on every reload):
    # a malformed hash would otherwise fail every request.
    if isinstance(hashed, str) and BCRYPT_HASH.fullmatch(hashed):
        return hashed.encode()
    raise WebConfigError(f"{path}: basic_auth_users.{user}: not a bcrypt hash (make one with htpasswd -nBC 10 \"\")")


def _rate_limit(path: Path, value: object) -> tuple[float, int] | None:
    limit = _mapping(path, "rate_limit", value, {"interval", "burst"})
    if not limit:
        return None
    interval, burst = limit.get("interval", "0s"), limit.get("burst", 0)
    try:
        seconds = 0.0 if str(interval) in ("0", "0s") else parse_duration(str(interval))
    except ValueError:
        raise WebConfigError(f"{path}: rate_limit.interval: {interval!r} is not a duration (e.g. 100ms)") from None
    if seconds == 0:
        return None  # 0 turns the limit off, as in exporter-toolkit
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
        raise WebConfigError(f"{path}: rate_limit.burst: expected a whole number >= 1 (0 would refuse every "
                             f"request), got {burst!r}")
    return seconds, burst


def _credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header.startswith("Basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password) if sep else None
