"""Evaluate any registered explainer model on the server, with the same validation as everywhere else.

Each explainer gets its own POST route and request model, so /docs shows its parameters with units
and bounds. The bounds are enforced by the explainer's own parameter dataclass, so the message for
a bad value is the same sentence the CLI and the page show.
"""

from typing import Optional, Union

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

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
        fields[spec["name"]] = (Optional[Union[float, str]],
                                Field(default=None, description=spec["help"], json_schema_extra=extra))
    name = "".join(part.capitalize() for part in e.slug.split("-")) + "Request"
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


def unprocessable(field: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", field], "msg": message,
                                                              "type": "value_error"}]})


@router.get("", summary="Every explainer with its parameters (name, default, bounds, unit, help)")
def list_explainers() -> list[dict]:
    return [e.describe() for e in REGISTRY.values()]


def _add_route(e: Explainer) -> None:
    Body = request_model(e)

    def evaluate(body: Body = None) -> dict:  # type: ignore[valid-type]
        values = body.model_dump(exclude_none=True) if body is not None else {}
        try:
            return run(e.slug, values)
        except ParamError as err:
            return unprocessable(err.field, str(err))

    router.add_api_route(f"/{e.slug}", evaluate, methods=["POST"], summary=e.title,
                         description=f"{e.claim}\n\nReturns the model's named results.", name=f"evaluate-{e.slug}")


for _explainer in REGISTRY.values():
    _add_route(_explainer)


@router.post("/{slug}", include_in_schema=False)
def unknown(slug: str):
    raise HTTPException(status_code=404, detail=f"There is no explainer {slug!r}; the explainers are "
                                                f"{', '.join(REGISTRY)}.")
