"""`--web.config.file`: TLS and basic auth in the Prometheus exporter-toolkit's format, so
operators reuse the file they already have for node_exporter:

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), ...
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...            # bcrypt hash, as htpasswd -nBC 10 writes it

Relative paths are relative to the file. SIGHUP reloads it (new certificates and users
apply to new connections; a broken file is refused and the previous one kept).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
               "RequireAnyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
KNOWN_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}


class WebConfigError(Exception):
    pass


@dataclass
class WebConfig:
    path: Path
    tls: dict = field(default_factory=dict)
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _verified: dict[tuple[str, bytes], bool] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> WebConfig:
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise WebConfigError(f"{path}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise WebConfigError(f"{where}: not YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(doc, dict) or not set(doc) <= KNOWN_KEYS:
            raise WebConfigError(f"{path}: unknown keys {sorted(set(doc) - KNOWN_KEYS) if isinstance(doc, dict) else doc}")
        tls = doc.get("tls_server_config") or {}
        for key in ("cert_file", "key_file", "client_ca_file"):
            if tls.get(key):
                tls[key] = str((path.parent / tls[key]).resolve())
        if tls and not (tls.get("cert_file") and tls.get("key_file")):
            raise WebConfigError(f"{path}: tls_server_config needs cert_file and key_file")
        if tls.get("client_auth_type", "NoClientCert") not in CLIENT_AUTH:
            raise WebConfigError(f"{path}: client_auth_type {tls.get('client_auth_type')!r} is not one of "
                                 f"{', '.join(CLIENT_AUTH)}")
        users = {}
        for user, hashed in (doc.get("basic_auth_users") or {}).items():
            if not isinstance(hashed, str) or not hashed.startswith("$2"):
                raise WebConfigError(f"{path}: basic_auth_users.{user}: not a bcrypt hash")
            users[str(user)] = hashed.encode()
        config = cls(path, tls, users)
        if tls:
            config.ssl_context()  # refuse now a certificate that cannot be loaded
        return config

    def ssl_context(self, context: ssl.SSLContext | None = None) -> ssl.SSLContext | None:
        """The server TLS context, or the given one with this file's certificates loaded
        (a reload: new connections get them)."""
        if not self.tls:
            return None
        ctx = context or ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.tls["cert_file"], self.tls["key_file"])
            ctx.minimum_version = TLS_VERSIONS.get(self.tls.get("min_version", "TLS12"), ssl.TLSVersion.TLSv1_2)
            ctx.verify_mode = CLIENT_AUTH[self.tls.get("client_auth_type", "NoClientCert")]
            if self.tls.get("client_ca_file"):
                ctx.load_verify_locations(self.tls["client_ca_file"])
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"{self.path}: TLS: {e}") from None
        return ctx

    def authorised(self, header: str | None) -> bool:
        """Basic auth check; bcrypt is slow on purpose, so a good pair is remembered (by a
        keyed digest, never in clear) and later scrapes cost a dictionary lookup."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = (user, hmac.new(hashed, password.encode(), hashlib.sha256).digest())
        cached = self._verified.get(key)
        if cached is None:
            import bcrypt

            cached = bcrypt.checkpw(password.encode(), hashed)
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified[key] = cached
        return cached
