"""Every request passes here first (an ASGI middleware, so streamed responses pass too):
the Host header must name this server (DNS rebinding), an Origin header must be our own
(another site's page), the access token must come with every request when the server has one
(Bearer or the cookie the login page sets), and a state-changing request must carry the
workspace secret (the pages get it same-origin; a foreign page cannot read it). Every
response gets headers that keep pages from loading anything from elsewhere."""

from __future__ import annotations

import hmac
from http.cookies import CookieError, SimpleCookie

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, RedirectResponse, Response

from simpletuner.ui.settings import ServerSettings

TOKEN_COOKIE = "simpletuner_token"
SECRET_HEADER = "x-simpletuner-secret"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
OPEN_PATHS = ("/login",)  # reachable without the access token (and, /login, the secret)
OPEN_PREFIXES = ("/static/",)
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def bearer(headers: Headers) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def cookie(headers: Headers, name: str) -> str | None:
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:  # a malformed Cookie header carries no token
        return None
    return jar[name].value if name in jar else None


class Guard:
    def __init__(self, app, settings: ServerSettings, secret: str):
        self.app, self.settings, self.secret = app, settings, secret

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope, Headers(scope=scope))
        if refusal is not None:
            return await refusal(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def refusal(self, scope, headers: Headers) -> Response | None:
        host = headers.get("host", "")
        if not self.settings.answers_host(host):
            return _refuse(400, f"this server does not answer for Host {host!r}")
        origin = headers.get("origin")
        if origin is not None and origin != f"http://{host}":
            return _refuse(403, f"requests from another site ({origin}) are refused")
        path, method = scope["path"], scope["method"]
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return None
        if self.settings.token is not None and not self.has_token(headers):
            if method == "GET" and not path.startswith("/api/"):
                return RedirectResponse("/login", status_code=303)
            return _refuse(401, "this server needs its access token: 'Authorization: Bearer "
                           "<token>', or log in at /login")
        if method not in SAFE_METHODS and not self.has_secret(headers):
            return _refuse(403, "a state-changing request needs the workspace secret "
                           "(WORKSPACE/.token) as 'Authorization: Bearer <secret>' or "
                           "'X-SimpleTuner-Secret: <secret>'")
        return None

    def has_token(self, headers: Headers) -> bool:
        token = self.settings.token
        return same(bearer(headers), token) or same(cookie(headers, TOKEN_COOKIE), token)

    def has_secret(self, headers: Headers) -> bool:
        return same(bearer(headers), self.secret) or same(headers.get(SECRET_HEADER), self.secret)


def _refuse(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=SECURITY_HEADERS)
