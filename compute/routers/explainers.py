"""Evaluate any registered explainer model on the server, with the same validation as everywhere else.

Each explainer gets its own POST route and request model, so /docs shows its parameters with units
and bounds. The bounds are enforced by the explainer's own parameter dataclass, so the message for
a bad value is the same sentence the CLI and the page show. A model is a pure function of its
parameters, so answers are cached by them: the defaults every page load asks for cost nothing.
"""

import collections
import hashlib
import json
import threading
from typing import Optional, Union

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictStr, create_model

from kvx.explainers.core.params import ParamError
from kvx.explainers.registry import REGISTRY, Explainer, run

router = APIRouter(prefix="/explainers", tags=["explainers"])


def request_model(e: Explainer) -> type[BaseModel]:
    fields = {}
    for spec in e.params.describe():
        extra = {key: spec[k] for k, key in (("unit", "unit"), ("min", "minimum"), ("max", "maximum"))
                 if spec[k] not in (None, "")}
        if spec["choices"]:
            extra["examples"] = spec["choices"][:3]
        # Strict: JSON true/false is not a number here (pydantic would quietly read it as 1 or 0).
        fields[spec["name"]] = (Optional[Union[StrictFloat, StrictStr]],
                                Field(default=None, description=spec["help"], json_schema_extra=extra))
    name = "".join(part.capitalize() for part in e.slug.split("-")) + "Request"
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


class Answers:
    """The latest answers, by explainer and parameters as sent (a bounded LRU, shared by the server's threads)."""

    def __init__(self, size: int = 1024):
        self.size, self.lock = size, threading.Lock()
        self.items: collections.OrderedDict[str, dict] = collections.OrderedDict()

    def get(self, key: str) -> dict | None:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key: str, answer: dict) -> None:
        with self.lock:
            self.items[key] = answer
            while len(self.items) > self.size:
                self.items.popitem(last=False)


def answers(request: Request) -> Answers:
    """This app's cache (one per app, so tests and apps with other settings never share answers)."""
    state = request.app.state
    if getattr(state, "answers", None) is None:
        state.answers = Answers()
    return state.answers


def unprocessable(field: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", field], "msg": message,
                                                              "type": "value_error"}]})


@router.get("", summary="Every explainer with its parameters (name, default, bounds, unit, help)")
def list_explainers() -> list[dict]:
    return [e.describe() for e in REGISTRY.values()]


def _add_route(e: Explainer) -> None:
    Body = request_model(e)

    async def evaluate(request: Request, body: Body = None) -> dict:  # type: ignore[valid-type]
        values = body.model_dump(exclude_none=True) if body is not None else {}
        key = e.slug + ":" + hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
        cache = answers(request)
        answer = cache.get(key)                  # a cached answer costs no thread hop
        if answer is None:
            try:                                 # a model may simulate for a while: off the event loop
                answer = await run_in_threadpool(run, e.slug, values)
            except ParamError as err:
                return unprocessable(err.field, str(err))
            cache.put(key, answer)
        return answer

    router.add_api_route(f"/{e.slug}", evaluate, methods=["POST"], summary=e.title,
                         description=f"{e.claim}\n\nReturns the model's named results.", name=f"evaluate-{e.slug}",
                         responses={413: {"description": "The request body is over the server's limit."}})


for _explainer in REGISTRY.values():
    _add_route(_explainer)


@router.post("/{slug}", include_in_schema=False)
def unknown(slug: str):
    raise HTTPException(status_code=404, detail=f"There is no explainer {slug!r}; the explainers are "
                                                f"{', '.join(REGISTRY)}.")
