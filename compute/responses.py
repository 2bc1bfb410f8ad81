"""JSON answers that never fail to serialize: a result that is not a finite number is sent as null.

Starlette refuses NaN and infinity (they are not JSON), which would turn a model's "never" (infinity) or a
kernel's NaN error into a 500 for the whole answer. JSON has no such numbers, so null says "no finite
value", as JavaScript's JSON.stringify does.
"""
from __future__ import annotations

import math
from typing import Any

from fastapi.responses import JSONResponse


def finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(value) for value in data]
    return data


class FiniteJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:                 # NaN or infinity somewhere in it (not JSON)
            return super().render(finite(content))
