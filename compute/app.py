"""The kvx compute server: the API under /api/v1, OpenAPI at /docs, and the built site at /."""
from __future__ import annotations

import mimetypes

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


def _sentence(error: dict) -> tuple[str, str]:
    """A pydantic error as (field, one sentence naming the field)."""
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    field = loc[0] if loc else "body"        # the parameter, not the union member that failed
    if error.get("type") == "extra_forbidden":
        return field, f"{field} is not a parameter of this explainer; see GET /api/v1/explainers for the parameters."
    if field == "body":
        return field, f"The request body must be a JSON object of parameters; {error.get('msg', 'it was not')}."
    return field, f"{field} must be a number or a name; got {error.get('input')!r}."


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
        for error in exc.errors():
            field, msg = _sentence(error)
            detail.setdefault(field, {"loc": ["body", field], "msg": msg, "type": error.get("type", "value_error")})
        return JSONResponse(status_code=422, content={"detail": list(detail.values())})

    app.include_router(health.router, prefix="/api/v1")
    app.include_router(explainers.router, prefix="/api/v1")

    if settings.site_dir.is_dir():
        app.mount("/", StaticFiles(directory=settings.site_dir, html=True), name="site")
    else:
        @app.get("/", include_in_schema=False)
        def no_site() -> HTMLResponse:
            return HTMLResponse(f"<p>No site at {settings.site_dir}. Build it with <code>kvx build</code>; "
                                f"the API is at <a href='/docs'>/docs</a>.</p>", status_code=404)
    return app
