"""Parameters with units and bounds, declared once and used by every runtime.

An explainer's parameters are a frozen dataclass whose fields are declared with `number`, `integer`
or `choice`. Each carries its unit, bounds and help text, so the CLI (`kvx list`), the server's
OpenAPI schema, the page's controls and the validation message all come from the same place.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping

_SPEC = "kvx"


class ParamError(ValueError):
    """A bad parameter value. `field` names the parameter; str(self) is one readable sentence."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class Spec:
    kind: str                      # "number", "integer" or "choice"
    unit: str
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False         # None allowed (means "derive it")
    # For "choice" fields that also take free values (a dtype name or a bit-width):
    parse: Callable[[str], Any] | None = None


def number(default, *, unit: str, min: float, max: float, help: str, optional: bool = False):
    return dataclasses.field(default=default, metadata={_SPEC: Spec("number", unit, help, min, max, optional=optional)})


def integer(default: int | None, *, unit: str, min: int, max: int, help: str, optional: bool = False):
    return dataclasses.field(default=default, metadata={_SPEC: Spec("integer", unit, help, min, max,
                                                                     optional=optional)})


def choice(default: str, choices: Iterable[str], *, help: str, unit: str = "",
           parse: Callable[[str], Any] | None = None):
    return dataclasses.field(default=default, metadata={_SPEC: Spec("choice", unit, help, choices=tuple(choices),
                                                                     parse=parse)})


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,g}"


def _check(name: str, spec: Spec, value: Any) -> Any:
    """Return the value converted to its kind, or raise ParamError with one sentence."""
    if value is None and spec.optional:
        return None
    if spec.kind == "choice":
        text = str(value).strip()
        if text in spec.choices:
            return text
        if spec.parse is not None:
            try:
                spec.parse(text)
                return text
            except ValueError as err:
                raise ParamError(name, f"{name} must be one of {', '.join(spec.choices)}; {err}") from None
        raise ParamError(name, f"{name} must be one of {', '.join(spec.choices)}; got {text!r}.")
    rng = f"between {_fmt(spec.min)} and {_fmt(spec.max)}" + (f" {spec.unit}" if spec.unit else "")
    if isinstance(value, bool):
        raise ParamError(name, f"{name} must be a number {rng}; got {value!r}.")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ParamError(name, f"{name} must be a number {rng}; got {str(value)!r}.") from None
    if not math.isfinite(x) or not spec.min <= x <= spec.max:
        raise ParamError(name, f"{name} must be {rng}; got {_fmt(x) if math.isfinite(x) else value}.")
    if spec.kind == "integer":
        if not x.is_integer():
            raise ParamError(name, f"{name} must be a whole number {rng}; got {_fmt(x)}.")
        return int(x)
    return x


class Params:
    """Base for an explainer's frozen parameter dataclass: validates and converts every field."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            spec = f.metadata.get(_SPEC)
            if spec is not None:
                object.__setattr__(self, f.name, _check(f.name, spec, getattr(self, f.name)))

    @classmethod
    def specs(cls) -> dict[str, tuple[dataclasses.Field, Spec]]:
        return {f.name: (f, f.metadata[_SPEC]) for f in dataclasses.fields(cls) if _SPEC in f.metadata}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]):
        """Build from strings or numbers (CLI, HTTP, browser). Empty text means the default."""
        known = cls.specs()
        for key in values:
            if key not in known:
                raise ParamError(key, f"{key} is not a parameter; the parameters are {', '.join(known)}.")
        kwargs = {}
        for key, value in values.items():
            if isinstance(value, str) and value.strip() == "":
                continue
            if isinstance(value, str) and value.strip().lower() in ("none", "auto") and known[key][1].optional:
                value = None
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def describe(cls) -> list[dict]:
        """What `kvx list --json` and the OpenAPI schema say about each parameter."""
        out = []
        for name, (f, spec) in cls.specs().items():
            out.append({
                "name": name, "kind": spec.kind, "default": f.default, "min": spec.min, "max": spec.max,
                "unit": spec.unit, "help": spec.help, "choices": list(spec.choices), "optional": spec.optional,
            })
        return out

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.specs()}
