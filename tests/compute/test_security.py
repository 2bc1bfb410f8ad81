"""Security: no user-supplied code or paths are ever loaded, the site never serves a file outside itself,
bodies are bounded, CORS is only for configured origins, and the pages carry a Content-Security-Policy."""
from __future__ import annotations

import ast
import base64
import contextlib
import hashlib
import json
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import uvicorn
from fastapi.testclient import TestClient

from kvx.compute import kernel_specs
from kvx.compute.app import create_app
from kvx.compute.security import SCRIPT_CSP, csp_for_html, headers_file, inline_script_hashes
from kvx.compute.serving import server_config
from kvx.compute.settings import Settings

ROOT = Path(__file__).parents[2]
PAGE = """<!doctype html><html><head><script>document.documentElement.classList.add("x");</script>
<script src="vendor/bokeh/bokeh.min.js"></script>
<script type="application/json" id="kvx-config">{"slug": "x"}</script>
<script type="module" src="static/kvx-page.js"></script></head>
<body><p>page</p><script type="text/javascript">
  console.log("embed");
</script></body></html>"""


@pytest.fixture
def layout(tmp_path):
    """A site, and next to it a secret the server must never hand out."""
    site = tmp_path / "site"
    (site / "static").mkdir(parents=True)
    (site / "index.html").write_text(PAGE)
    (site / "static" / "kvx-worker.mjs").write_text("self.onmessage = () => {};")
    (tmp_path / "secret.txt").write_text("TOPSECRET")
    (tmp_path / "site-other").mkdir()
    (tmp_path / "site-other" / "x.txt").write_text("TOPSECRET too")
    (site / "link.txt").symlink_to(tmp_path / "secret.txt")          # a symlink out of the site
    return tmp_path


# ---- no code, pickles or paths from users ---------------------------------------------------------------
SUSPECT = {"path", "file", "filename", "checkpoint", "pickle", "url", "script", "code", "command"}


def _types(prop: dict) -> set[str]:
    return {prop["type"]} if "type" in prop else {t for p in prop.get("anyOf", []) for t in _types(p)}


def test_no_endpoint_takes_code_pickles_or_paths(tmp_path):
    spec = TestClient(create_app(Settings(site_dir=tmp_path))).get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody")
            if body is None:
                continue
            assert set(body["content"]) == {"application/json"}, (path, body["content"])   # no uploads, no pickles
            ref = body["content"]["application/json"]["schema"]
            ref = next((s["$ref"] for s in ref.get("anyOf", [ref]) if "$ref" in s), None)
            props = schemas[ref.rsplit("/", 1)[1]]["properties"]
            for name, prop in props.items():
                assert not SUSPECT & set(name.lower().split("_")), f"{method} {path} takes {name!r}"
                assert _types(prop) <= {"number", "integer", "string", "null"}, (path, name, prop)  # no objects
                assert "binary" not in json.dumps(prop), (path, name)                               # no uploads
                if "/kernels/" in path and prop.get("type") == "string":
                    assert "enum" in prop, f"{path}: {name} is a free string"   # names from a fixed list only


@pytest.mark.parametrize("name", ["/etc/passwd", "../../compute/lm/checkpoints/mla", "gqa-large.pt",
                                  "http://evil.example/model.pt", "__import__('os')"])
@pytest.mark.parametrize("kernel", ["eviction", "quantization", "cross-layer"])
def test_a_model_named_by_path_is_refused_before_anything_loads(tmp_path, monkeypatch, name, kernel):
    loaded = []
    monkeypatch.setattr(kernel_specs, "trained", lambda n: loaded.append(n))
    r = TestClient(create_app(Settings(site_dir=tmp_path))).post(f"/api/v1/kernels/{kernel}", json={"model": name})
    assert r.status_code == 422 and loaded == []
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", "model"] and detail["msg"].startswith("model must be one of 'gqa-large'")


def test_explainer_names_are_names_not_files(tmp_path):
    r = TestClient(create_app(Settings(site_dir=tmp_path))).post("/api/v1/explainers/cache-renting",
                                                                 json={"model": "../../etc/passwd"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model"]


def test_a_pickle_is_never_read(tmp_path):
    import pickle
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    for kind in ("application/octet-stream", "application/python-pickle", "application/json"):
        r = client.post("/api/v1/kernels/paged", content=pickle.dumps({"context": 8}), headers={"content-type": kind})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            yield node, f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def test_the_server_code_has_no_eval_exec_pickle_or_unsafe_torch_load():
    """The server's code (and every model it evaluates) never runs strings or unpickles anything."""
    found = []
    for py in sorted([*(ROOT / "compute").rglob("*.py"), *(ROOT / "explainers").rglob("*.py")]):
        tree = ast.parse(py.read_text(), str(py))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            found += [f"{py.name}: import {n}" for n in names if n.split(".")[0] in ("pickle", "marshal", "dill",
                                                                                     "shelve", "subprocess")]
        for call, name in _calls(tree):
            where = f"{py.relative_to(ROOT)}:{call.lineno}"
            if isinstance(call.func, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
                found.append(f"{where} {name}()")
            on_torch = isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "torch"
            if name == "load" and on_torch:
                safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in call.keywords)
                if not safe:
                    found.append(f"{where} torch.load without weights_only=True")
            if isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "os" \
                    and (name in ("system", "popen") or name.startswith(("exec", "spawn"))):
                found.append(f"{where} {name}()")
    assert found == []


# ---- static files: never a file outside the site ------------------------------------------------------------
TRAVERSALS = ["/../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E%2Fsecret.txt", "/..%2fsecret.txt",
              "/static/..%2f..%2fsecret.txt", "/static/%2e%2e/%2e%2e/secret.txt", "/.%2e/secret.txt",
              "/static/../../secret.txt", "/%252e%252e/secret.txt", "/%c0%ae%c0%ae/secret.txt",
              "/..\\secret.txt", "/%5c..%5csecret.txt", "/..%5csecret.txt",
              "//secret.txt", "/%2fetc%2fpasswd", "/etc/passwd", "/{tmp}/secret.txt", "/%2f{tmp}%2fsecret.txt",
              "/../site-other/x.txt", "/..%2fsite-other/x.txt", "/link.txt", "/%00", "/a%00b.html", "/%ff",
              "/" + "a" * 5000, "/static%2f..%2f..%2fsecret.txt", "/api/../../secret.txt"]


def raw_get(url: str, target: str) -> tuple[int, bytes]:
    """GET exactly `target` (no client-side normalization), over a plain socket."""
    host, port = urlparse(url).hostname, urlparse(url).port
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_static_files_refuse_path_traversal(layout, serve):
    app = create_app(Settings(site_dir=layout / "site"))
    with serve(app) as url:
        assert raw_get(url, "/static/kvx-worker.mjs")[0] == 200 and b"page" in raw_get(url, "/")[1]
        for target in TRAVERSALS:
            status, body = raw_get(url, target.format(tmp=str(layout).strip("/")))
            assert status in (400, 404) and b"TOPSECRET" not in body, (target, status, body[:200])


def test_static_files_refuse_traversal_in_the_asgi_path_itself(layout, run_async):
    """What a proxy or server might pass on already decoded: the path, not only the raw target."""
    app = create_app(Settings(site_dir=layout / "site"))

    async def get(path: str) -> tuple[int, bytes]:
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
                 "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
                 "server": ("testserver", 80), "client": ("127.0.0.1", 1)}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    for path in ["/../secret.txt", "/static/../../secret.txt", str(layout / "secret.txt"), "/..\\secret.txt",
                 "/../site-other/x.txt", "/link.txt"]:
        status, body = run_async(get(path))
        assert status in (400, 404) and b"TOPSECRET" not in body, (path, status)


# ---- bodies are bounded --------------------------------------------------------------------------------------
def test_bodies_over_the_limit_are_413_with_or_without_a_length(tmp_path, serve):
    import httpx
    app = create_app(Settings(site_dir=tmp_path, max_body_bytes=1000))
    big = b'{"context": 4000' + b" " * 2000 + b"}"

    def chunked(data: bytes, size: int = 300):
        for i in range(0, len(data), size):
            yield data[i:i + size]

    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        url_ = "/api/v1/explainers/cache-renting"
        r = client.post(url_, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "at most 1000 bytes; got 2017" in r.json()["detail"]
        r = client.post(url_, content=chunked(big), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
        assert r.status_code == 413 and "at most 1000 bytes" in r.json()["detail"]
        small = client.post(url_, content=chunked(b'{"context": 4000}', 5),
                            headers={"content-type": "application/json"})
        assert small.status_code == 200 and small.json()["params"]["context"] == 4000
        assert client.get("/api/v1/health").status_code == 200


def test_a_content_length_that_is_not_a_number_is_400(tmp_path, run_async):
    app = create_app(Settings(site_dir=tmp_path))
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/api/v1/explainers/cache-renting", "raw_path": b"/api/v1/explainers/cache-renting",
             "root_path": "", "query_string": b"", "server": ("testserver", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"content-length", b"12abc"), (b"content-type", b"application/json")]}
    run_async(app(scope, receive, send))
    assert sent[0]["status"] == 400 and b"Content-Length must be a whole number" in sent[1]["body"]


# ---- CORS ------------------------------------------------------------------------------------------------
def preflight(client, origin: str):
    return client.options("/api/v1/kernels/decode", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})


def test_cors_preflight_only_for_listed_origins(tmp_path):
    client = TestClient(create_app(Settings(site_dir=tmp_path, cors_origins=["https://docs.example.org"])))
    ok = preflight(client, "https://docs.example.org")
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://docs.example.org"
    assert "POST" in ok.headers["access-control-allow-methods"]
    for other in ("https://evil.example", "https://docs.example.org.evil.example", "null", "http://docs.example.org"):
        r = preflight(client, other)
        assert "access-control-allow-origin" not in r.headers, other
    plain = client.post("/api/v1/explainers/cache-renting", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in plain.headers


def test_no_cors_at_all_unless_configured(tmp_path):
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    assert "access-control-allow-origin" not in preflight(client, "https://docs.example.org").headers
    plain = client.get("/api/v1/health", headers={"Origin": "https://x.org"})
    assert "access-control-allow-origin" not in plain.headers


# ---- Content-Security-Policy and nosniff -----------------------------------------------------------------
def directives(policy: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in policy.split(";")) if d}


def test_pages_carry_a_policy_that_allows_their_own_inline_scripts_and_no_other_host(layout):
    client = TestClient(create_app(Settings(site_dir=layout / "site")))
    r = client.get("/")
    policy = directives(r.headers["content-security-policy"])
    assert r.headers["x-content-type-options"] == "nosniff"
    scripts = policy["script-src"]
    want = ["'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'" for body in
            ('document.documentElement.classList.add("x");', '\n  console.log("embed");\n')]
    assert [s for s in scripts if s.startswith("'sha256-")] == want        # the two inline scripts, not the JSON
    assert "'unsafe-inline'" not in scripts and "'wasm-unsafe-eval'" in scripts
    assert policy["default-src"] == ["'self'"] and policy["object-src"] == ["'none'"]
    assert policy["worker-src"] == ["'self'"] and policy["connect-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["*"]                               # ?embed=1 pages go in iframes
    every = [v for name, values in policy.items() if name != "frame-ancestors" for v in values]
    assert not [v for v in every if "://" in v or v in ("*", "http:", "https:")]   # nothing from any other host
    assert r.headers["content-length"] == str(len(PAGE.encode()))          # the page itself is untouched
    assert r.text == PAGE


def test_the_worker_script_gets_the_policy_too(layout):
    """A module worker's policy is the one its own script is served with (wasm needs 'wasm-unsafe-eval')."""
    r = TestClient(create_app(Settings(site_dir=layout / "site"))).get("/static/kvx-worker.mjs")
    assert r.headers["content-security-policy"] == SCRIPT_CSP and "'unsafe-eval'" not in SCRIPT_CSP
    assert "'wasm-unsafe-eval'" in SCRIPT_CSP
    assert r.headers["content-type"].startswith("text/javascript") and r.headers["x-content-type-options"] == "nosniff"


def test_the_api_is_json_with_nosniff_and_no_page_policy(tmp_path):
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    for r in (client.get("/api/v1/health"), client.post("/api/v1/explainers/cache-renting", json={"context": 0}),
              client.get("/api/v1/nope")):
        assert r.headers["x-content-type-options"] == "nosniff" and "content-security-policy" not in r.headers



@pytest.mark.parametrize("page,assets", [("/docs", ["swagger-ui-bundle.js", "swagger-ui.css"]),
                                         ("/redoc", ["redoc.standalone.js"])])
def test_docs_load_nothing_from_another_host(tmp_path, page, assets):
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    r = client.get(page)
    policy = directives(r.headers["content-security-policy"])
    assert [v for values in policy.values() for v in values if "://" in v] == []
    assert "://" not in r.text.replace("http://www.w3.org", "")     # no CDN, no Google Fonts (an SVG namespace is fine)
    for name in assets:
        assert f'"/docs-assets/{name}"' in r.text
        asset = client.get(f"/docs-assets/{name}")
        assert asset.status_code == 200 and len(asset.content) > 100_000
    assert [s for s in policy["script-src"] if s.startswith("'sha256-")] == inline_script_hashes(r.content)


def test_inline_script_hashes_skip_data_blocks_and_external_scripts():
    html = b'<script>a()</script><SCRIPT type="module">b()</SCRIPT><script type="application/json">{}</script>' \
           b'<script src="x.js"></script><script type=text/javascript>c()</script><script>a()</script>'
    assert inline_script_hashes(html) == ["'sha256-" + base64.b64encode(hashlib.sha256(s).digest()).decode() + "'"
                                          for s in (b"a()", b"b()", b"c()")]
    assert "'sha256-" not in csp_for_html(b"<p>no scripts</p>")


def test_headers_file_for_static_hosts_gives_each_path_one_policy(layout):
    text = headers_file(layout / "site")
    rules: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith(" "):
            rules[line] = []
        else:
            rules[list(rules)[-1]].append(line.strip())
    assert rules["/*"] == ["X-Content-Type-Options: nosniff"]
    assert rules["/index.html"] == rules["/"] == [f"Content-Security-Policy: {csp_for_html(PAGE.encode())}"]
    assert rules["/static/*"] == [f"Content-Security-Policy: {SCRIPT_CSP}"]
    assert json.dumps(rules).count("Content-Security-Policy") == len(rules) - 1


# ---- the HTTP layer: framing, smuggling, slow clients, the connection cap (kvx serve's own configuration) ----
@contextlib.contextmanager
def guarded(app, **config):
    """The app as `kvx serve` runs it (serving.server_config: header deadline, connection cap, JSON 400s)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(app, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def exchange(port: int, data: bytes, wait_s: float = 5.0) -> tuple[bytes, bool]:
    """Send raw bytes; everything the server answers until it closes (or `wait_s`), and whether it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass      # the server answered and closed while we were still sending (a body over the limit): read it
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except socket.timeout:
            return got, False
        except ConnectionResetError:      # closed with our unread bytes still queued: a reset, not a FIN
            return got, True
        return got, True


def answers(raw: bytes) -> list[tuple[int, dict, bytes]]:
    out = []
    while raw.startswith(b"HTTP/1.1"):
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict((k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
        n = int(headers.get("content-length", 0))
        out.append((int(lines[0].split()[1]), headers, rest[:n]))
        raw = rest[n:]
    return out


def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(tmp_path):
    """RFC 9112 section 6.3: both framings at once is how a request is smuggled past a proxy."""
    app = create_app(Settings(site_dir=tmp_path, max_body_bytes=64 * 1024))
    body = b'{"context": 4000' + b" " * (2 * 2 ** 20) + b"}"              # 2 MB, framed by its chunks
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 60000]), body[i:i + 60000])
                       for i in range(0, len(body), 60000)) + b"0\r\n\r\n"
    smuggled = b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
    with guarded(app) as port:
        raw, closed = exchange(port, b"POST /api/v1/explainers/cache-renting HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Type: application/json\r\nContent-Length: 20\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n" + chunked + smuggled)
        (status, headers, detail), = answers(raw)                      # one answer: the smuggled GET is not
        assert status == 400 and closed and headers["connection"] == "close"
        assert "Content-Length and Transfer-Encoding" in json.loads(detail)["detail"]
        assert headers["content-type"] == "application/json" and headers["x-content-type-options"] == "nosniff"
        # the same 2 MB chunked body without a Content-Length: counted as it arrives, refused at the limit
        raw, closed = exchange(port, b"POST /api/v1/explainers/cache-renting HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        (status, headers, detail), = answers(raw)
        assert status == 413 and closed and "at most 65536 bytes" in json.loads(detail)["detail"]


@pytest.mark.parametrize("framing", [b"Content-Length: 40\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_a_body_that_does_not_arrive_in_time_is_a_json_408(tmp_path, framing):
    """A body trickled, or promised and never sent, holds its connection only until the body deadline."""
    app = create_app(Settings(site_dir=tmp_path, body_timeout_s=0.5))
    start = b"POST /api/v1/explainers/cache-renting HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing
    with guarded(app) as port:
        t0 = time.monotonic()
        raw, _ = exchange(port, start + b"\r\n" + (b"5\r\n{\"con" if b"chunked" in framing else b'{"con'), wait_s=5)
        took = time.monotonic() - t0
        (status, headers, detail), = answers(raw)
        assert status == 408 and 0.5 <= took < 4 and headers["content-type"] == "application/json"
        assert headers["x-content-type-options"] == "nosniff" and "within 0.5 s" in json.loads(detail)["detail"]
        # a whole body in time, and a request with no body at all, are answered as usual
        body = b'{"context": 4000}'
        raw, _ = exchange(port, b"POST /api/v1/explainers/cache-renting HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert answers(raw)[0][0] == 200
        raw, _ = exchange(port, b"POST /api/v1/explainers/cache-renting HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answers(raw)[0][0] == 200                          # no body: the model's defaults


@pytest.mark.parametrize("request_bytes", [
    b"POST /api/v1/explainers/cache-renting HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
    b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
])
def test_the_http_layers_own_400s_are_json_with_nosniff(tmp_path, request_bytes):
    with guarded(create_app(Settings(site_dir=tmp_path))) as port:
        raw, closed = exchange(port, request_bytes)
    (status, headers, detail), = answers(raw)
    assert status == 400 and closed and headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff" and "not valid HTTP/1.1" in json.loads(detail)["detail"]


@pytest.mark.parametrize("request_bytes", [
    b"GET /api/v1/health?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n" + b"X-Many: b\r\n" * 2000 + b"\r\n",
])
def test_a_huge_query_or_header_is_a_json_431(tmp_path, request_bytes):
    """h11 refuses headers over 16 KiB only while they arrive in pieces; whole ones are checked here."""
    with guarded(create_app(Settings(site_dir=tmp_path))) as port:
        raw, closed = exchange(port, request_bytes)
    (status, headers, detail), = answers(raw)
    assert status == 431 and closed and headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff" and "at most 16384 bytes" in json.loads(detail)["detail"]


def test_a_client_that_trickles_its_headers_is_closed_at_the_deadline(tmp_path):
    with guarded(create_app(Settings(site_dir=tmp_path)), header_timeout_s=0.5) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            t0 = time.monotonic()
            closed_after = None
            for _ in range(30):                  # a byte every 0.1 s: uvicorn's keep-alive timer never fires
                try:
                    s.sendall(b"G")
                    if s.recv(1, socket.MSG_DONTWAIT) == b"":
                        closed_after = time.monotonic() - t0
                        break
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    closed_after = time.monotonic() - t0
                    break
                time.sleep(0.1)
        assert closed_after is not None and 0.4 < closed_after < 1.5, closed_after
        raw, _ = exchange(port, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answers(raw)[0][0] == 200


def test_at_the_connection_cap_slow_connections_make_room_for_new_ones(tmp_path):
    with guarded(create_app(Settings(site_dir=tmp_path)), max_connections=8, header_timeout_s=30) as port:
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]   # open, never a request
        for s in slow:
            s.sendall(b"GET /api/v1/hea")
        try:
            for _ in range(5):                   # each newcomer evicts the longest-waiting slow connection
                raw, _ = exchange(port, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert answers(raw)[0][0] == 200
        finally:
            for s in slow:
                s.close()


def test_at_the_cap_the_longest_waiting_connection_goes_first(tmp_path):
    """The one evicted is the one that has waited longest for its headers, whatever else is open: a connection
    that sent a whole request and is being answered, or came later, stays."""
    def closed(s: socket.socket) -> bool:
        s.settimeout(2)
        try:
            return s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    with guarded(create_app(Settings(site_dir=tmp_path)), max_connections=4, header_timeout_s=30) as port:
        slow = []
        for _ in range(4):                          # four waiting, oldest first
            slow.append(socket.create_connection(("127.0.0.1", port)))
            slow[-1].sendall(b"GET /api/v1/hea")
            time.sleep(0.05)
        try:
            newcomer = socket.create_connection(("127.0.0.1", port))     # the fifth: the oldest must go
            assert closed(slow[0]) and not any(closed(s) for s in slow[1:])
            newcomer.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")       # kept alive
            assert newcomer.recv(4096).startswith(b"HTTP/1.1 200 ")
            # Answered, the newcomer waits for its next request from now: the back of the queue. The next
            # connection over the cap evicts the oldest slow one, not it.
            another = socket.create_connection(("127.0.0.1", port))
            assert closed(slow[1]) and not any(closed(s) for s in slow[2:]) and not closed(newcomer)
            another.close()
            newcomer.close()
        finally:
            for s in slow:
                s.close()


def test_head_carries_the_same_headers_as_get(layout):
    client = TestClient(create_app(Settings(site_dir=layout / "site")))
    for path in ("/", "/index.html", "/static/kvx-worker.mjs"):
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code == 200 and head.content == b""
        for name in ("content-security-policy", "content-type", "content-length", "x-content-type-options"):
            assert head.headers[name] == get.headers[name], (path, name)
    assert "'sha256-" in client.head("/").headers["content-security-policy"]


@pytest.mark.parametrize("body,field", [({"context": "2"}, "context"), ({"context": True}, "context"),
                                        ({"batch": "1"}, "batch"), ({"repeats": False}, "repeats")])
def test_kernel_fields_are_strict_numbers(tmp_path, body, field):
    r = TestClient(create_app(Settings(site_dir=tmp_path))).post("/api/v1/kernels/paged", json=body)
    assert r.status_code == 422
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", field] and "must be a whole number (a JSON number" in detail["msg"]


def test_errors_quote_a_short_prefix_of_a_bad_value_and_a_few_of_many_problems(tmp_path):
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    r = client.post("/api/v1/kernels/eviction", json={"model": "x" * 60_000})
    assert r.status_code == 422 and len(r.content) < 1000 and "xxxx… (60002 characters)" in r.text
    r = client.post("/api/v1/explainers/cache-renting", json={"context": "y" * 60_000})
    assert r.status_code == 422 and len(r.content) < 1500
    many = {f"unknown_{i}": 1 for i in range(6000)}                        # about 100 KB: under the limit below
    r = TestClient(create_app(Settings(site_dir=tmp_path, max_body_bytes=200_000))).post(
        "/api/v1/explainers/cache-renting", json=many)
    detail = r.json()["detail"]
    assert r.status_code == 422 and len(detail) == 11 and len(r.content) < 3000
    assert detail[-1]["msg"] == "And 5990 more problems with the body, not listed."
