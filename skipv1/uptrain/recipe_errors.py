"""A pydantic ValidationError of the recipe as one line that names the key and the fix.

pydantic reports every problem with its location and kind; the user needs the first one, in
the recipe's words: the dotted key, what it is, and what is allowed (keys, choices or range,
read back from the schema so they are never restated by hand)."""

import typing

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

TYPE_NAMES = {
    "string_type": "str",
    "int_type": "int",
    "float_type": "float",
    "bool_type": "bool",
    "list_type": "list",
}
BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def one_line_error(schema: type[BaseModel], err: ValidationError) -> str:
    e = err.errors(include_url=False)[0]
    loc, kind, value = e["loc"], e["type"], e["input"]
    key = dotted(loc)
    if kind == "value_error":  # a model validator's message: already names its keys
        return str(e["ctx"]["error"])
    if kind == "extra_forbidden":
        section = dotted(loc[:-1])
        where = f" in `{section}`" if section else ""
        allowed = ", ".join(_model_at(schema, loc[:-1]).model_fields)
        return f"unknown recipe key `{key}`: allowed keys{where} are {allowed}"
    if kind in ("model_type", "dict_type"):
        return f"`{key or 'recipe'}` must be a mapping of keys"
    if kind in TYPE_NAMES:
        return (
            f"recipe key `{key}` must be {TYPE_NAMES[kind]}, got {type(value).__name__} {value!r}"
        )
    field = _field_at(schema, loc)
    if kind == "literal_error":
        choices = ", ".join(str(c) for c in typing.get_args(field.annotation))
        return f"recipe key `{key}` is {value!r}: allowed values are {choices}"
    if kind == "finite_number":
        return f"`{key}` is {value}: it must be a finite number"
    if kind in BOUNDS:
        return f"`{key}` is {value}: it must be {allowed_range(field)}"
    return f"recipe key `{key}`: {e['msg']}"


def dotted(loc: tuple) -> str:
    """('optim', 'betas', 0) -> optim.betas[0]"""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out


def allowed_range(field: FieldInfo) -> str:
    """The field's Field(gt=, ge=, lt=, le=) bounds in words: positive, >= 0, in [0, 1), ..."""
    b = {
        k: getattr(m, k) for m in field.metadata for k in ("gt", "ge", "lt", "le") if hasattr(m, k)
    }
    low = f"({b['gt']}" if "gt" in b else f"[{b['ge']}" if "ge" in b else ""
    high = f"{b['lt']})" if "lt" in b else f"{b['le']}]" if "le" in b else ""
    if low and high:
        return f"in {low}, {high}"
    if "gt" in b:
        return "positive" if b["gt"] == 0 else f"> {b['gt']}"
    if "ge" in b:
        return f">= {b['ge']}"
    return f"< {b['lt']}" if "lt" in b else f"<= {b['le']}"


def _model_at(schema: type[BaseModel], loc: tuple) -> type[BaseModel]:
    for part in loc:
        schema = schema.model_fields[part].annotation
    return schema


def _field_at(schema: type[BaseModel], loc: tuple) -> FieldInfo:
    names = [part for part in loc if isinstance(part, str)]
    return _model_at(schema, names[:-1]).model_fields[names[-1]]
