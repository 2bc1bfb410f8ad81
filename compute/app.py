"""The kvx compute server: the API under /api/v1, OpenAPI at /docs, and the built site at /."""
from __future__ import annotations

import mimetypes
import typing

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from kvx.compute import VERSION
from kvx.compute.routers import explainers, health
from kvx.compute.settings import Settings

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
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    field = loc[0] if loc else "body"        # the parameter, not the union member that failed
    got = error.get("input")
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return field, f"{field} is not a parameter here; see the OpenAPI docs at /docs for the parameters."
    if field == "body":
        return field, f"The request body must be a JSON object of parameters; {error.get('msg', 'it was not')}."
    if kind == "value_error":                # a cross-field check: its own message is the sentence
        return field, str(error.get("msg", "")).removeprefix("Value error, ")
    if kind == "literal_error":
        return field, f"{field} must be one of {error.get('ctx', {}).get('expected', '')}; got {got!r}."
    lo, hi, whole = _bounds(model, field)
    if lo is not None and hi is not None:
        what = "a whole number" if whole else "a number"
        return field, f"{field} must be {what} between {lo} and {hi}; got {got!r}."
    return field, f"{field} must be a number or a name; got {got!r}."


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
    app.state.jobs = JobRunner(settings.kernel_workers, settings.kernel_queue,
                               time_limit_s=settings.kernel_time_limit_s)
    app.include_router(kernels.router, prefix="/api/v1")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(title="kvx compute server", version=VERSION,
                  description="Evaluates the kvx explainer models and, where present, runs the real kernels.")
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type"])

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return JSONResponse(status_code=413, content={"detail": f"The request body may be at most "
                                                                   f"{settings.max_body_bytes} bytes; got {length}."})
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def validation_sentences(request: Request, exc: RequestValidationError):
        detail = {}
        model = _body_model(request)
        for error in exc.errors():
            field, msg = _sentence(error, model)
            detail.setdefault(field, {"loc": ["body", field], "msg": msg, "type": error.get("type", "value_error")})
        return JSONResponse(status_code=422, content={"detail": list(detail.values())})

    app.include_router(health.router, prefix="/api/v1")
    app.include_router(explainers.router, prefix="/api/v1")
    _include_kernels(app, settings)

    if settings.site_dir.is_dir():
        app.mount("/", StaticFiles(directory=settings.site_dir, html=True), name="site")
    else:
        @app.get("/", include_in_schema=False)
        def no_site() -> HTMLResponse:
            return HTMLResponse(f"<p>No site at {settings.site_dir}. Build it with <code>kvx build</code>; "
                                f"the API is at <a href='/docs'>/docs</a>.</p>", status_code=404)
    return app
