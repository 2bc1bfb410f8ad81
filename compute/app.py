"""The kvx compute server: the API under /api/v1, OpenAPI at /docs and /redoc (assets served here), the site at /."""
from __future__ import annotations

import mimetypes
import typing
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

from kvx.compute import VERSION
from kvx.compute.device import device_info
from kvx.compute.responses import FiniteJSONResponse
from kvx.compute.routers import explainers, health
from kvx.compute.security import BodyLimit, CatchAll, SecurityHeaders, short
from kvx.compute.settings import Settings
from kvx.compute.static_files import SiteFiles
from kvx.explainers.registry import REGISTRY

DOCS_ASSETS = "/docs-assets"
MAX_ERRORS = 10

# Pyodide hangs unless .wasm is application/wasm and .mjs is JavaScript; some systems know neither.
mimetypes.add_type("application/wasm", ".wasm")
mimetypes.add_type("text/javascript", ".mjs")


def _bounds(model, field: str) -> tuple[object, object, bool]:
    """(min, max, whole numbers only) of a body field, from its pydantic metadata."""
    info = getattr(model, "model_fields", {}).get(field)
    lo = hi = None
    for m in getattr(info, "metadata", ()):
        lo, hi = getattr(m, "ge", lo), getattr(m, "le", hi)
    return lo, hi, getattr(info, "annotation", None) is int


def _sentence(error: dict, model=None) -> tuple[str, str]:
    """A pydantic error as (field, one sentence naming the field, the allowed range and the value given)."""
    loc = list(error.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    kind = error.get("type", "")
    if kind == "json_invalid":               # loc is the character where the JSON broke, not a field
        where = f" at character {loc[0]}" if loc else ""
        reason = error.get("ctx", {}).get("error", "it does not parse")
        return "body", f"The request body is not valid JSON: {reason}{where}."
    field = str(loc[0]) if loc else "body"   # the parameter, not the union member that failed
    got = error.get("input")
    field = field if len(field) <= 40 else short(field)
    if kind == "extra_forbidden" and field == "device":
        return field, (f"device is not a parameter here: the server runs every kernel on its own device, which is "
                       f"{device_info()['device']} on this server (see /api/v1/health).")
    if kind == "extra_forbidden":
        return field, f"{field} is not a parameter here; see the OpenAPI docs at /docs for the parameters."
    if field == "body":
        return field, f"The request body must be a JSON object of parameters; {error.get('msg', 'it was not')}."
    if kind == "value_error":                # a cross-field check: its own message is the sentence
        return field, str(error.get("msg", "")).removeprefix("Value error, ")
    if kind == "literal_error":
        return field, f"{field} must be one of {error.get('ctx', {}).get('expected', '')}; got {short(got)}."
    lo, hi, whole = _bounds(model, field)
    what = "a whole number" if whole else "a number"
    within = f" between {lo} and {hi}" if lo is not None and hi is not None else ""
    annotation = getattr(getattr(model, "model_fields", {}).get(field), "annotation", None)
    if kind in ("int_type", "float_type") and annotation in (int, float):   # strict: "2" and true are not numbers
        return field, f"{field} must be {what} (a JSON number, not a string or true/false){within}; got {short(got)}."
    if within:
        return field, f"{field} must be {what}{within}; got {short(got)}."
    return field, f"{field} must be a number or a name; got {short(got)}."


def _docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from assets served by this server (the pinned fastapi-offline wheel ships
    them), with no fonts or scripts from any other host, so the pages' Content-Security-Policy holds there too."""
    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False)


def _quoted(path: str) -> str:
    """A path as sent, or a short prefix of one that is long."""
    return path if len(path) <= 80 else short(path, 80)


def _body_model(request: Request):
    """The pydantic model of the matched route's body (unwrapping Optional), for its bounds."""
    body = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(body, "field_info", None), "annotation", None)
    for candidate in (annotation, *typing.get_args(annotation)):
        if hasattr(candidate, "model_fields"):
            return candidate
    return None


def _include_kernels(app: FastAPI, settings: Settings) -> None:
    """The real kernels need PyTorch (the `kernels` extra); without it they say so instead of failing."""
    try:
        from kvx.compute.jobs import JobRunner
        from kvx.compute.routers import kernels
    except ImportError as err:
        reason = str(err)            # `err` itself is gone once the except block ends

        @app.api_route("/api/v1/kernels/{name}", methods=["GET", "POST"], include_in_schema=False)
        def no_kernels(name: str):
            return JSONResponse(status_code=503, content={"detail": f"The kernels need PyTorch ({reason}); install "
                                                                    f"kvx[kernels] to run them on this server."})
        return
    # Kernels run in reused job processes: forked on the CPU, spawned on CUDA (a CUDA context does not survive a
    # fork). A spawned CUDA worker gets no address-space ceiling (CUDA reserves far more virtual memory than it
    # uses, and would fail to start); device memory is bounded by the admission estimate (kernel_specs).
    cuda = device_info()["device"] == "cuda"
    start = settings.job_start or ("spawn" if cuda else "fork")
    app.state.jobs = JobRunner(settings.kernel_workers, settings.kernel_queue,
                               time_limit_s=settings.kernel_time_limit_s, cache_bytes=settings.cache_bytes,
                               per_client=settings.kernel_per_client,
                               memory_bytes=None if cuda else settings.job_memory_bytes,
                               worker_fn=kernels.run_job, start=start)
    app.include_router(kernels.router, prefix="/api/v1")


def _api_fallback(app: FastAPI) -> None:
    """Any other /api/ path is a JSON 404, or a 405 listing the methods its route takes, never the site's 404."""
    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]

    @app.api_route("/api/{rest:path}", methods=methods, include_in_schema=False)
    def not_here(request: Request, rest: str) -> JSONResponse:
        path = request.url.path
        routes = [r for r in app.router.routes if getattr(r, "endpoint", None) is not not_here
                  and not isinstance(r, Mount)]          # the site's mount takes any path and any method
        allowed = [m for m in methods if any(r.matches({**request.scope, "method": m})[0] == Match.FULL
                                             for r in routes)]
        if allowed:
            return JSONResponse(status_code=405, headers={"Allow": ", ".join(allowed)},
                                content={"detail": f"{_quoted(path)} takes {' or '.join(allowed)}, not {request.method}."})
        return JSONResponse(status_code=404, content={"detail": f"There is no API endpoint {_quoted(path)}; the endpoints "
                                                                f"are listed at /docs."})


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(title="kvx compute server", version=VERSION, default_response_class=FiniteJSONResponse,
                  description="Evaluates the kvx explainer models and, where present, runs the real kernels.",
                  docs_url=None, redoc_url=None)
    app.state.settings = settings
    # Outermost last: any escaped exception as a JSON 500 (CatchAll), security headers on every answer (the
    # 413s too), CORS, then the body limit.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s,
                       larger={f"/api/v1/explainers/{e.slug}": settings.max_trace_body_bytes
                               for e in REGISTRY.values() if e.uploads})
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type"])
    app.add_middleware(SecurityHeaders)
    app.add_middleware(CatchAll)
    explainers.evaluations(app)                   # the explainer models' jobs and answers
    _docs(app)

    @app.exception_handler(StarletteHTTPException)
    async def http_errors(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # json.loads gave up
            return JSONResponse(status_code=422, content={"detail": [{
                "loc": ["body"], "type": "json_invalid",
                "msg": "The request body is not valid JSON: it is not UTF-8 text, or a number in it is too long."}]})
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_sentences(request: Request, exc: RequestValidationError):
        detail = {}
        model = _body_model(request)
        sent_json = "json" in request.headers.get("content-type", "")
        errors = exc.errors()
        for error in errors[:MAX_ERRORS]:             # 6,000 unknown keys are not 6,000 sentences
            field, msg = _sentence(error, model)
            if field == "body" and not sent_json and error.get("type") == "model_attributes_type":
                msg = "The request body must be a JSON object of parameters, sent as Content-Type: application/json."
            loc = ["body"] if field == "body" else ["body", field]
            detail.setdefault(field, {"loc": loc, "msg": msg, "type": error.get("type", "value_error")})
        if len(errors) > MAX_ERRORS:
            detail["..."] = {"loc": ["body"], "type": "too_many_errors",
                             "msg": f"And {len(errors) - MAX_ERRORS} more problems with the body, not listed."}
        return JSONResponse(status_code=422, content={"detail": list(detail.values())})

    app.include_router(health.router, prefix="/api/v1")
    app.include_router(explainers.router, prefix="/api/v1")
    _include_kernels(app, settings)
    _api_fallback(app)

    if settings.site_dir.is_dir():
        app.mount("/", SiteFiles(directory=settings.site_dir, html=True), name="site")   # cache headers, .br/.gz
    else:
        @app.get("/", include_in_schema=False)
        def no_site() -> HTMLResponse:
            return HTMLResponse(f"<p>No site at {settings.site_dir}. Build it with <code>kvx build</code>; "
                                f"the API is at <a href='/docs'>/docs</a>.</p>", status_code=404)
    return app
