"""Receivers that want more than a signature: an OAuth2 token server built on Authlib's
authorization server, a receiver that accepts only its bearer tokens, and a test CA
(made with ``cryptography``) for a receiver that requires a client certificate."""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import json
import secrets
import ssl
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web
from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request, grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerToken
from authlib.oauth2.rfc7523 import JWTBearerClientAssertion
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from joserfc import jwk

# --- the token server -----------------------------------------------------------------


@dataclass
class OAuthClient(ClientMixin):  # type: ignore[misc]
    """A registered client: a secret for the two secret methods, a public key for
    ``private_key_jwt``; ``method`` is the one authentication it may use."""

    client_id: str
    method: str = "client_secret_basic"
    secret: str | None = None
    public_key: str | None = None

    def get_client_id(self) -> str:
        return self.client_id

    def check_client_secret(self, client_secret: str) -> bool:
        return self.secret is not None and hmac.compare_digest(client_secret, self.secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return endpoint == "token" and method == self.method

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "client_credentials"

    def get_allowed_scope(self, scope: str | None) -> str:
        return scope or ""


class _ClientCredentials(grants.ClientCredentialsGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS: ClassVar[list[str]] = [
        "client_secret_basic",
        "client_secret_post",
        "private_key_jwt",
    ]


class _KeyAssertion(JWTBearerClientAssertion):  # type: ignore[misc]
    CLIENT_AUTH_METHOD = "private_key_jwt"

    def __init__(self, server: TokenServer) -> None:
        super().__init__()
        self._server = server
        self._seen: set[str] = set()

    def get_audiences(self) -> list[str]:
        return [self._server.token_url]

    def validate_jti(self, claims: Any, jti: str) -> bool:
        if jti in self._seen:
            return False
        self._seen.add(jti)
        return True

    def resolve_client_public_key(self, client: OAuthClient) -> jwk.Key:
        assert client.public_key is not None
        return jwk.ECKey.import_key(client.public_key)


class _FormRequest(OAuth2Request):  # type: ignore[misc]
    """An aiohttp request as Authlib reads it: the form, no query."""

    form_data: dict[str, str]

    @property
    def form(self) -> dict[str, str]:
        return self.form_data

    @property
    def args(self) -> dict[str, str]:
        return {}


@dataclass
class TokenRequest:
    """What one token request asked for, as the server read it."""

    status: int
    client_id: str | None
    form: dict[str, str]
    headers: dict[str, str]


class TokenServer(AuthorizationServer):  # type: ignore[misc]
    """Authlib's authorization server with the client credentials grant, on aiohttp.

    Issues opaque tokens valid for ``expires_in`` seconds; :meth:`revoke` withdraws
    every token issued so far (the receiver then answers 401).
    """

    def __init__(self, *, expires_in: int = 3600) -> None:
        super().__init__(scopes_supported=None)
        self.expires_in = expires_in
        self.clients: dict[str, OAuthClient] = {}
        self.valid: set[str] = set()
        self.requests: list[TokenRequest] = []
        self.issued: list[dict[str, Any]] = []
        self.register_grant(_ClientCredentials)
        self.register_client_auth_method("private_key_jwt", _KeyAssertion(self))
        self.register_token_generator(
            "default",
            BearerToken(
                access_token_generator=lambda **_: secrets.token_urlsafe(24),
                expires_generator=lambda client, grant_type: self.expires_in,
            ),
        )
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def token_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def add(self, client: OAuthClient) -> OAuthClient:
        self.clients[client.client_id] = client
        return client

    def revoke(self) -> None:
        self.valid.clear()

    # Authlib's hooks.
    def query_client(self, client_id: str) -> OAuthClient | None:
        return self.clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        self.valid.add(token["access_token"])
        self.issued.append({**token, "audience": request.payload.data.get("audience")})

    def create_oauth2_request(self, request: OAuth2Request) -> OAuth2Request:
        return request

    def handle_response(
        self, status: int, body: Any, headers: list[tuple[str, str]]
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        return status, body, headers

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        return

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        # Authlib insists on https; the test server is plain http on loopback.
        oauth_request = _FormRequest(
            request.method, str(request.url.with_scheme("https")), headers=request.headers
        )
        oauth_request.payload = BasicOAuth2Payload(form)
        oauth_request.form_data = form
        status, body, headers = self.create_token_response(oauth_request)
        client = getattr(oauth_request, "client", None)
        self.requests.append(
            TokenRequest(status, client.client_id if client else None, form, dict(request.headers))
        )
        return web.Response(body=json.dumps(body), status=status, headers=dict(headers))

    async def start(self) -> TokenServer:
        app = web.Application()
        app.router.add_post("/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class Protected:
    """A receiver that accepts only ``server``'s current tokens (401 otherwise) and,
    over TLS, says which client certificate each request came with."""

    server: TokenServer | None = None
    tls: ssl.SSLContext | None = None
    statuses: Counter[int] = field(default_factory=Counter)
    delivered: list[str] = field(default_factory=list)
    """``webhook-id`` of each accepted request, in order."""
    refused: list[str] = field(default_factory=list)
    peers: list[str | None] = field(default_factory=list)
    """The client certificate's common name of each request (None without one)."""
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        await request.read()
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        self.peers.append(_common_name(peer))
        event_id = request.headers.get("webhook-id", "")
        if self.server is not None:
            auth = request.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ")
            if not auth.startswith("Bearer ") or token not in self.server.valid:
                self.statuses[401] += 1
                self.refused.append(event_id)
                return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
        self.statuses[200] += 1
        self.delivered.append(event_id)
        return web.Response(status=200, text="ok")

    async def start(self) -> Protected:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _common_name(peer: Any) -> str | None:
    if not peer:
        return None
    for rdn in peer.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# --- a test CA ------------------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM."""

    certificate: str
    key: str = field(repr=False)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


class TestCA:
    """A certificate authority for one test: issues server and client certificates."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, name: str = "Herald Test CA") -> None:
        self._key = new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._name = subject
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def issue(
        self,
        common_name: str,
        *,
        server: bool = False,
        not_after: dt.datetime | None = None,
        key: ec.EllipticCurvePrivateKey | None = None,
    ) -> Issued:
        key = key or new_key()
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=2))
            .not_valid_after(not_after or now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem(key))

    def server_context(self, tmp: Any) -> ssl.SSLContext:
        """A server context for 127.0.0.1 that requires a client certificate of this CA
        (``tmp``: a directory for the files the ssl module reads)."""
        issued = self.issue("127.0.0.1", server=True)
        cert_path, key_path = tmp / "server.pem", tmp / "server.key"
        cert_path.write_text(issued.certificate)
        key_path.write_text(issued.key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_path, key_path)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.pem)
        return context
