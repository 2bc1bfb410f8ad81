"""The built site, served the way a static host would: cache headers per kind and precompressed files.

`kvx build` (site/assets.py) puts every file a page loads under `assets/` with its content hash in its
name, and writes `.br` and `.gz` copies beside the compressible files. Here:

- `assets/…` is `Cache-Control: public, max-age=31536000, immutable` (a new build means new names), so a
  second page loads Pyodide, BokehJS and the models from the browser's cache without asking;
- anything else (pages, `static/`, the health stand-in) is cached briefly and then revalidated by ETag,
  so a new build shows within a minute;
- the `.br` or `.gz` copy is sent when the request's Accept-Encoding allows it (brotli first), with
  `Content-Encoding`, the original file's Content-Type (so `.wasm` stays `application/wasm`, which
  Pyodide's streaming compile needs) and `Vary: Accept-Encoding` so shared caches keep them apart.
  Each copy is a file of its own, so its ETag differs from the plain file's, as HTTP requires.

The `_headers` file the build writes says the same for Netlify and Cloudflare Pages (site/assets.py).
"""
from __future__ import annotations

import mimetypes
import os

from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.responses import FileResponse, Response
from starlette.staticfiles import NotModifiedResponse

mimetypes.add_type("application/octet-stream", ".snapshot")     # the pages' Python heap (site/snapshot.py)
IMMUTABLE = "public, max-age=31536000, immutable"
SHORT = "public, max-age=60, must-revalidate"
ASSETS = "assets"
# Preference order when the client takes both; the suffix is the precompressed copy's.
ENCODINGS = (("br", ".br"), ("gzip", ".gz"))


def accepted(header: str) -> set[str]:
    """Codings the client takes (q=0 refuses one), from an Accept-Encoding header."""
    out = set()
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        q = params.strip()
        if q.startswith("q="):
            try:
                if float(q[2:]) == 0:
                    continue
            except ValueError:
                continue
        if name.strip():
            out.add(name.strip().lower())
    return out


def cache_control(relative: str) -> str:
    return IMMUTABLE if relative.split("/", 1)[0] == ASSETS else SHORT


class SiteFiles(StaticFiles):
    def file_response(self, full_path, stat_result: os.stat_result, scope, status_code: int = 200) -> Response:
        full_path = str(full_path)
        request_headers = Headers(scope=scope)
        relative = os.path.relpath(full_path, str(self.directory)).replace(os.sep, "/")
        media_type = mimetypes.guess_type(full_path)[0] or "text/plain"
        path, stat, coding, variants = full_path, stat_result, None, False
        takes = accepted(request_headers.get("accept-encoding", ""))
        for name, suffix in ENCODINGS:
            try:
                candidate = os.stat(full_path + suffix)
            except OSError:
                continue
            variants = True
            if coding is None and (name in takes or "*" in takes):
                path, stat, coding = full_path + suffix, candidate, name
        response = FileResponse(path, status_code=status_code, stat_result=stat, media_type=media_type)
        if coding:
            response.headers["content-encoding"] = coding
        if variants:
            response.headers["vary"] = "Accept-Encoding"
        response.headers["cache-control"] = cache_control(relative)
        if self.is_not_modified(response.headers, request_headers):
            return NotModifiedResponse(response.headers)
        return response
