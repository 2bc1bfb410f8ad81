"""What the server adds to every answer to keep a reader's browser and the server itself safe.

- `BodyLimit`: request bodies over the limit are refused with 413, counted as they arrive whatever the
  framing; Content-Length with Transfer-Encoding is a 400 that closes the connection (smuggling); a body
  that does not arrive in time is a 408.
- `CatchAll`: an exception that escapes the app is a JSON 500 with Connection: close, never a dropped
  connection or a plain-text page.
- `SecurityHeaders`: `X-Content-Type-Options: nosniff` on everything, and on the site's pages a
  Content-Security-Policy that lets the pages do what they do (Pyodide compiling WebAssembly in a module
  worker, BokehJS from the same origin, Bokeh's inline styles) and nothing from any other host. The
  inline scripts Bokeh's `file_html` writes are allowed by their SHA-256 hashes, computed from the page
  as it is served, so no other inline script runs. Pages need `'unsafe-eval'` for Bokeh's CustomJS
  callbacks (compiled with `new Function`). Scripts, the worker's among them, get the same policy
  without it: a module worker's policy is the one its own script is served with, and Pyodide needs
  only `'wasm-unsafe-eval'` there, to compile its WebAssembly.
- `csp_for_html`: the policy for one page, also used to write a `_headers` file for static hosts:
  `python -m kvx.compute.security build/site > build/site/_headers`.
  A HEAD on the site is answered as the GET would be, without its body, so both carry the same policy.

Pure ASGI middleware (not `BaseHTTPMiddleware`), so responses stream through untouched except HTML.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import json
import logging
import re
import sys
import threading
from pathlib import Path

# The policy for the site's pages. `{scripts}` gets the hashes of the page's own inline scripts.
CSP = ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval' 'unsafe-eval'{scripts}; worker-src 'self'; "
       "connect-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; font-src 'self' data:; "
       "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors *")
# Everything else of the site (scripts, the worker, styles, data): the same policy without eval.
SCRIPT_CSP = CSP.format(scripts="").replace(" 'unsafe-eval'", "")
# Paths the policy is not for: the API answers JSON. /docs and /redoc are pages like the site's (their
# Swagger UI and ReDoc scripts are served from this server, never from a CDN), so they get the policy.
NOT_SITE = ("/api/", "/openapi.json")

_SCRIPT = re.compile(rb"<script\b([^>]*)>(.*?)</script\s*>", re.IGNORECASE | re.DOTALL)
_TYPE = re.compile(rb"""\btype\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE)
_SRC = re.compile(rb"\bsrc\s*=", re.IGNORECASE)
_JS_TYPES = {b"", b"module", b"text/javascript", b"application/javascript", b"text/ecmascript"}


def inline_script_hashes(html: bytes) -> list[str]:
    """'sha256-…' of every inline script a browser would run (not src=, not JSON data blocks), in order."""
    hashes = []
    for attrs, body in _SCRIPT.findall(html):
        if _SRC.search(attrs):
            continue
        kind = _TYPE.search(attrs)
        if (kind.group(1).lower() if kind else b"") not in _JS_TYPES:
            continue
        digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
        hashes.append(f"'sha256-{digest}'")
    return list(dict.fromkeys(hashes))


def csp_for_html(html: bytes) -> str:
    hashes = inline_script_hashes(html)
    return CSP.format(scripts="".join(" " + h for h in hashes))


class BodyLimit:
    """The request body, counted as it arrives, whatever the framing; refused past `max_bytes` (413).

    - Content-Length together with Transfer-Encoding is refused (400) and the connection closed: the two
      framings disagree about where the body ends, which is how requests are smuggled past a proxy
      (RFC 9112 section 6.3 says a server ought to treat such a message as an error and close).
    - A Content-Length that is not a number is a 400; one over the limit is a 413 before any of it is read.
    - Otherwise the body is read here, counting the bytes actually received, up to the limit, and then
      handed to the app: a chunked body can never get past the limit. It must arrive within
      `body_timeout_s` of the headers (408 otherwise), so a client that trickles a body cannot hold a
      connection open.
    """

    def __init__(self, app, max_bytes: int, body_timeout_s: float = 30.0, max_header_bytes: int = 16 * 1024,
                 larger: dict[str, int] | None = None):
        self.app, self.max_bytes, self.body_timeout_s = app, max_bytes, body_timeout_s
        self.max_header_bytes = max_header_bytes
        self.larger = larger or {}                # path -> its own limit (the routes that take a trace upload)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        size = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) + \
            sum(len(k) + len(v) + 4 for k, v in scope["headers"])
        if size > self.max_header_bytes:          # h11 checks only headers that arrive in pieces
            return await _json(send, 431, f"The request line and headers may be at most {self.max_header_bytes} "
                                          f"bytes together; got {size}.")
        headers = dict(scope["headers"])
        limit = self.larger.get(scope.get("path", ""), self.max_bytes)
        length = headers.get(b"content-length")
        if length is not None and b"transfer-encoding" in headers:
            return await _json(send, 400, "A request may not have both Content-Length and Transfer-Encoding "
                                          "(RFC 9112, section 6.3); the connection is closed.")
        if length is not None:
            text = length.decode("latin-1").strip()
            if not text.isdigit():
                return await _json(send, 400, f"Content-Length must be a whole number of bytes; got {short(text)}.")
            if int(text) > limit:
                return await _json(send, 413, f"The request body may be at most {limit} bytes; "
                                              f"got {text[:20]}.")
        if length is None and b"transfer-encoding" not in headers:
            return await self.app(scope, receive, send)     # no body (RFC 9112 section 6.3): nothing to count
        try:
            async with asyncio.timeout(self.body_timeout_s):    # unlike wait_for, no task per request
                body = await self._read(receive, limit)
        except TimeoutError:
            return await _json(send, 408, f"The request body did not arrive within {self.body_timeout_s:g} s.")
        except _TooLarge:
            return await _json(send, 413, f"The request body may be at most {limit} bytes; got more "
                                          f"than that.")
        if body is None:                          # the client went away before sending it all
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _read(self, receive, limit: int) -> bytes | None:
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > limit:
                raise _TooLarge()
        return b"".join(chunks)


class _TooLarge(Exception):
    pass


def short(value, limit: int = 40) -> str:
    """A bad value quoted in an error: its repr, cut to a short prefix (an error must not echo a megabyte)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


class CatchAll:
    """Any exception the app lets out becomes a JSON 500 with Connection: close, logged once, never re-raised.

    Starlette's own handler re-raises after answering, and uvicorn then drops the connection without
    saying so; here the client is told the connection closes, and the server's log gets one line.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as err:
            logging.getLogger("kvx").error("%s %s failed: %s", scope.get("method"), scope.get("path"),
                                           type(err).__name__, exc_info=err)
            if not started:
                await _json(send, 500, f"The server failed on this request ({type(err).__name__}); other "
                                       f"requests are unaffected. Please report it.")


class SecurityHeaders:
    """nosniff on every answer; the Content-Security-Policy on the site's pages and scripts."""

    def __init__(self, app, cache_size: int = 256):
        self.app = app
        self.cache: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self.cache_size = cache_size
        self.lock = threading.Lock()

    def _policy(self, html: bytes) -> str:
        key = hashlib.sha256(html).digest()
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        policy = csp_for_html(html)
        with self.lock:
            self.cache[key] = policy
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        site = not scope["path"].startswith(NOT_SITE)
        head = scope["method"] == "HEAD"
        if site and head:      # answered as a GET without its body, so the policy hashes the page's scripts
            scope = {**scope, "method": "GET"}
        held: dict | None = None
        body: list[bytes] = []

        async def wrapped(message):
            nonlocal held
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-content-type-options"]
                headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
                kind = dict((k.lower(), v) for k, v in headers).get(b"content-type", b"")
                if site and kind.startswith(b"text/html"):
                    held = message               # the policy names the page's inline scripts: wait for them
                    return
                if site:
                    message["headers"].append((b"content-security-policy", SCRIPT_CSP.encode()))
                return await send(message)
            if held is not None and message["type"] == "http.response.body":
                body.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                html = b"".join(body)
                coding = dict((k.lower(), v) for k, v in held["headers"]).get(b"content-encoding", b"")
                held["headers"].append((b"content-security-policy", self._policy(_decoded(html, coding)).encode()))
                await send(held)
                return await send({"type": "http.response.body", "body": b"" if head else html,
                                   "more_body": False})
            if site and head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            return await send(message)

        return await self.app(scope, receive, wrapped)


def _decoded(body: bytes, coding: bytes) -> bytes:
    """A precompressed page (compute/static_files.py) as the browser will see it, to hash its scripts."""
    if coding == b"gzip":
        import gzip
        return gzip.decompress(body)
    if coding == b"br":
        import brotli
        return brotli.decompress(body)
    return body


async def _json(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"x-content-type-options", b"nosniff"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def headers_file(site: Path) -> str:
    """A `_headers` file (Netlify, Cloudflare Pages) giving each page of a built site its policy."""
    lines = ["/*", "  X-Content-Type-Options: nosniff"]
    # Hosts merge the headers of every rule a path matches, and two policies are both enforced, so each
    # path gets exactly one Content-Security-Policy: its page's, or the plain one for the scripts it loads.
    for page in sorted(site.rglob("*.html")):
        rel = "/" + page.relative_to(site).as_posix()
        paths = [rel, rel.removesuffix(".html")] + (["/"] if rel == "/index.html" else [])
        for path in paths:
            lines += [path, f"  Content-Security-Policy: {csp_for_html(page.read_bytes())}"]
    for folder in sorted(p.name for p in site.iterdir() if p.is_dir() and not any(p.rglob("*.html"))):
        lines += [f"/{folder}/*", f"  Content-Security-Policy: {SCRIPT_CSP}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(headers_file(Path(sys.argv[1] if len(sys.argv) > 1 else "build/site")), end="")
