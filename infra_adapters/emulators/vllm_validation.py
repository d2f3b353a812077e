"""vLLM's refusals of a request body, worded and shaped as vLLM 0.33 words and shapes them.

A body that fails its pydantic model is a FastAPI `RequestValidationError`, which vLLM's
`validation_exception_handler` (vllm/entrypoints/serve/exception_handling/handlers/validation.py)
answers `400 {"error": {"message": "N validation error(s):\\n  {...}", "type": "Bad Request",
"param": "body.<loc>", "code": 400}}`: one line per pydantic error (at most ten), each the `str()`
of the error dict with its `input` summarised and its `loc` cleaned into a dotted path, the
`param` being the first error's cleaned `loc`. A `VLLMValidationError` raised by a model's
`mode="before"` validator is no pydantic error: it escapes validation and
`create_error_response` (.../exception_handling/error_response.py) answers it as a
`BadRequestError` with its `parameter` as `param` and `str(exc)` (its message, then
`(parameter=..., value=...)`) as the message. Every message goes through `sanitize_message`
(.../exception_handling/utils.py).

The schemas below mirror the pydantic-core behaviour those models rely on (lax `str`, `int`
and `dict`, strict `StrictStr`/`StrictBool`, smart unions, `type`-discriminated unions,
`extra="forbid"` models, length constraints and model validators), closely enough that the
emulator's error list for a request is the one pydantic gives for it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from .recording import json_response

__all__ = [
    "AnyS",
    "BoolS",
    "DictS",
    "FloatS",
    "IntS",
    "LaxBoolS",
    "ListS",
    "LiteralS",
    "ModelS",
    "NullableS",
    "ParamError",
    "RequestInvalid",
    "StrS",
    "StructuredDecisionError",
    "TaggedUnionS",
    "UnionS",
    "check_cache_salt",
    "clean_loc_for_param",
    "lax_bool",
    "parse_body",
    "sanitize_message",
]

Loc = tuple[Any, ...]
Errors = list[dict[str, Any]]

# vllm/entrypoints/serve/exception_handling/handlers/validation.py
_BRACKETED_INTERNAL_RE = re.compile(r"[\[\]{}()]")
_INTERNAL_LOC_MARKERS = frozenset({
    "function-wrap", "function-after", "function-before", "function-plain", "json-or-python",
    "lax-or-strict", "chain", "default", "nullable", "tagged-union", "union", "call", "arguments",
    "is-instance", "is-subclass", "callable", "str", "int", "float", "bool", "bytes", "bytearray",
    "list", "tuple", "dict", "set", "frozenset", "complex", "none", "nonetype",
})
_MAX_REPORTED_ERRORS = 10
_MAX_ERROR_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000


def sanitize_message(message: str) -> str:
    """vllm/entrypoints/serve/exception_handling/utils.py `sanitize_message`."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def _is_internal_loc_segment(segment: str) -> bool:
    return bool(_BRACKETED_INTERNAL_RE.search(segment)) or segment.lower() in _INTERNAL_LOC_MARKERS


def clean_loc_for_param(loc: Sequence[Any]) -> str:
    """validation.py `clean_loc_for_param`: ('body', 'list[X]', 0, 'role') -> "body.0.role"."""
    parts = [str(p) for p in loc if not _is_internal_loc_segment(str(p))]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _summarize_error_input(value: object) -> object:
    """validation.py `_summarize_error_input`."""
    if isinstance(value, str):
        return value[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]" if len(value) > _MAX_ERROR_INPUT_CHARS else value
    if isinstance(value, bytes | bytearray):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 -- as vLLM: an int past sys.get_int_max_str_digits()
        return f"<{type(value).__name__}>"
    return text[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]" if len(text) > _MAX_ERROR_INPUT_CHARS else text


def _format_error(err: dict[str, Any]) -> str:
    """validation.py `_format_error`."""
    err = dict(err)
    if "input" in err:
        err["input"] = _summarize_error_input(err["input"])
    if isinstance(err.get("loc"), tuple | list):
        err["loc"] = clean_loc_for_param(tuple(err["loc"]))
    text = str(err)
    return text[:_MAX_ERROR_CHARS] + "...[truncated]" if len(text) > _MAX_ERROR_CHARS else text


def _body(message: str, err_type: str, param: str | None, status: int) -> web.Response:
    body = {"error": {"message": sanitize_message(message), "type": err_type, "param": param, "code": status}}
    return json_response(body, status=status, content_type="application/json")


class RequestInvalid(Exception):
    """A FastAPI `RequestValidationError`: pydantic's errors for the body, locs under "body"."""

    def __init__(self, errors: Errors) -> None:
        super().__init__(f"{len(errors)} validation errors")
        self.errors = errors

    def response(self) -> web.Response:
        """validation.py `validation_exception_handler`."""
        errors = self.errors
        param = clean_loc_for_param(errors[0]["loc"]) if errors and errors[0].get("loc") else None
        if errors:
            count = len(errors)
            label = "error" if count == 1 else "errors"
            reported = errors[:_MAX_REPORTED_ERRORS]
            message = f"{count} validation {label}:\n" + "".join(f"  {_format_error(e)}\n" for e in reported)
            if count > len(reported):
                message += f"  ...and {count - len(reported)} more {label}\n"
            message = message.rstrip()
        else:
            message = "Validation error"
        return _body(message, "Bad Request", param, 400)


class ParamError(Exception):
    """vllm.exceptions.VLLMValidationError: `str()` is the message then `(parameter=..., value=...)`;
    `create_error_response` answers it as a 400 `BadRequestError` with `param` the parameter."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.message, self.parameter, self.value = message, parameter, value

    def __str__(self) -> str:
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{self.message} ({', '.join(extras)})" if extras else self.message

    def response(self) -> web.Response:
        return _body(str(self), "BadRequestError", self.parameter, 400)


class StructuredDecisionError(ValueError):
    """vllm/entrypoints/openai/decisions/question_types.py StructuredDecisionError: the serving
    layer answers it with `create_error_response`, a ValueError being a 400 BadRequestError with
    no param."""

    def response(self) -> web.Response:
        return _body(str(self), "BadRequestError", None, 400)


def check_cache_salt(payload: Any) -> None:
    """vllm/entrypoints/generate/base/protocol.py `validate_cache_salt`, a `mode="before"` validator
    of the request models: its VLLMValidationError escapes pydantic, so it wins over every field error."""
    if not isinstance(payload, dict) or payload.get("cache_salt") is None:
        return
    salt = payload["cache_salt"]
    if not isinstance(salt, str) or not salt:
        raise ParamError("Parameter 'cache_salt' must be a non-empty string if provided.", parameter="cache_salt")
    if len(salt) > 128 or any(ch in "@/\\\x00" for ch in salt):
        raise ParamError("Parameter 'cache_salt' must be at most 128 characters and must not contain "
                         "'@', '/', '\\\\', or NUL.", parameter="cache_salt")


def parse_body(raw: bytes) -> Any:
    """The JSON body as FastAPI reads it: `RequestInvalid` for an empty, `null` or broken body."""
    if not raw:
        raise RequestInvalid([_err("missing", ("body",), "Field required", None)])
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:  # fastapi/routing.py: json_invalid at the error's position
        raise RequestInvalid([_err("json_invalid", ("body", exc.pos), "JSON decode error", {},
                                   {"error": exc.msg})]) from None
    except UnicodeDecodeError:
        raise RequestInvalid([_err("json_invalid", ("body", 0), "JSON decode error", {},
                                   {"error": "Invalid UTF-8"})]) from None
    if value is None:
        raise RequestInvalid([_err("missing", ("body",), "Field required", None)])
    return value


def _err(kind: str, loc: Loc, msg: str, value: Any, ctx: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        err["ctx"] = ctx
    return err


def _value_error(loc: Loc, value: Any, exc: ValueError) -> dict[str, Any]:
    return _err("value_error", loc, f"Value error, {exc}", value, {"error": exc})


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# -- schemas: each appends pydantic's errors for a value at a loc ------------------------


class Schema:
    label = "any"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        raise NotImplementedError


class AnyS(Schema):
    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        return None


class StrS(Schema):
    """`str` (lax: only str comes from JSON) or `StrictStr`, with length bounds."""

    def __init__(self, *, min_length: int | None = None, max_length: int | None = None) -> None:
        self.min_length, self.max_length = min_length, max_length
        self.label = "constrained-str" if min_length is not None or max_length is not None else "str"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if not isinstance(value, str):
            errors.append(_err("string_type", loc, "Input should be a valid string", value))
        elif self.min_length is not None and len(value) < self.min_length:
            errors.append(_err("string_too_short", loc,
                               f"String should have at least {_plural(self.min_length, 'character')}", value,
                               {"min_length": self.min_length}))
        elif self.max_length is not None and len(value) > self.max_length:
            errors.append(_err("string_too_long", loc,
                               f"String should have at most {_plural(self.max_length, 'character')}", value,
                               {"max_length": self.max_length}))


class BoolS(Schema):
    """`StrictBool`: only true and false."""

    label = "bool"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if not isinstance(value, bool):
            errors.append(_err("bool_type", loc, "Input should be a valid boolean", value))


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_bool(value: Any) -> bool | None:
    """What pydantic's lax `bool` makes of a value (None where it refuses it)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    return None


class LaxBoolS(Schema):
    """`bool`: true/false, 0/1 and their usual spellings as strings."""

    label = "bool"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if lax_bool(value) is None:
            if isinstance(value, str | int | float):
                errors.append(_err("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input",
                                   value))
            else:
                errors.append(_err("bool_type", loc, "Input should be a valid boolean", value))


class FloatS(Schema):
    """Lax `float`: numbers and numeric strings."""

    label = "float"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if isinstance(value, int | float):
            return
        if isinstance(value, str):
            try:
                float(value.strip())
            except ValueError:
                errors.append(_err("float_parsing", loc, "Input should be a valid number, unable to parse string as a "
                                   "number", value))
            return
        errors.append(_err("float_type", loc, "Input should be a valid number", value))


class IntS(Schema):
    """Lax `int` (bools, integral floats and integer strings pass), with `ge`/`le` bounds."""

    label = "int"

    def __init__(self, *, ge: int | None = None, le: int | None = None) -> None:
        self.ge, self.le = ge, le

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        number: int | None = None
        if isinstance(value, int):
            number = int(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                errors.append(_err("finite_number", loc, "Input should be a finite number", value))
                return
            if not value.is_integer():
                errors.append(_err("int_from_float", loc,
                                   "Input should be a valid integer, got a number with a fractional part", value))
                return
            number = int(value)
        elif isinstance(value, str):
            text = value.strip()
            try:
                number = int(text)
            except ValueError:
                try:
                    as_float = float(text)
                except ValueError:
                    as_float = 0.5
                if not as_float.is_integer() or "e" in text.lower():
                    errors.append(_err("int_parsing", loc,
                                       "Input should be a valid integer, unable to parse string as an integer", value))
                    return
                number = int(as_float)
        else:
            errors.append(_err("int_type", loc, "Input should be a valid integer", value))
            return
        if self.ge is not None and number < self.ge:
            errors.append(_err("greater_than_equal", loc, f"Input should be greater than or equal to {self.ge}",
                               value, {"ge": self.ge}))
        elif self.le is not None and number > self.le:
            errors.append(_err("less_than_equal", loc, f"Input should be less than or equal to {self.le}",
                               value, {"le": self.le}))


class LiteralS(Schema):
    def __init__(self, *values: str) -> None:
        self.values = values
        self.label = f"literal[{','.join(repr(v) for v in values)}]"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if isinstance(value, str) and value in self.values:
            return
        shown = [repr(v) for v in self.values]
        expected = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
        errors.append(_err("literal_error", loc, f"Input should be {expected}", value, {"expected": expected}))


class NullableS(Schema):
    """`X | None`: null passes, anything else is checked as X (at the same loc)."""

    def __init__(self, inner: Schema) -> None:
        self.inner = inner
        self.label = f"nullable[{inner.label}]"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if value is not None:
            self.inner.check(value, loc, errors)


class ListS(Schema):
    """`list[X]` with length bounds: too long is reported alone; too short only when every item passed."""

    def __init__(self, item: Schema, *, min_length: int | None = None, max_length: int | None = None) -> None:
        self.item, self.min_length, self.max_length = item, min_length, max_length
        self.label = f"list[{item.label}]"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if not isinstance(value, list):
            errors.append(_err("list_type", loc, "Input should be a valid list", value))
            return
        n = len(value)
        if self.max_length is not None and n > self.max_length:
            errors.append(_err("too_long", loc,
                               f"List should have at most {_plural(self.max_length, 'item')} after validation, "
                               f"not {n}", value,
                               {"field_type": "List", "max_length": self.max_length, "actual_length": n}))
            return
        before = len(errors)
        for i, item in enumerate(value):
            self.item.check(item, (*loc, i), errors)
        if len(errors) == before and self.min_length is not None and n < self.min_length:
            errors.append(_err("too_short", loc,
                               f"List should have at least {_plural(self.min_length, 'item')} after validation, "
                               f"not {n}", value,
                               {"field_type": "List", "min_length": self.min_length, "actual_length": n}))


class DictS(Schema):
    """`dict[str, X]` (JSON keys are strings)."""

    label = "dict"

    def __init__(self, value: Schema) -> None:
        self.value = value

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if not isinstance(value, dict):
            errors.append(_err("dict_type", loc, "Input should be a valid dictionary", value))
            return
        for key, item in value.items():
            self.value.check(item, (*loc, key), errors)


class UnionS(Schema):
    """A smart-mode union: passes if a branch passes, else every branch's errors under its label."""

    def __init__(self, *branches: Schema) -> None:
        self.branches = branches
        self.label = "union"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        found: Errors = []
        for branch in self.branches:
            mine: Errors = []
            branch.check(value, (*loc, branch.label), mine)
            if not mine:
                return
            found += mine
        errors.extend(found)


Field = tuple[str, Schema, bool]  # name, schema, required


class ModelS(Schema):
    """A pydantic model: `before` (a ValueError is a value_error), the fields in their order,
    then the unknown fields (`extra="forbid"`), then `after` (only when the fields passed)."""

    def __init__(self, name: str, fields: Sequence[Field], *, forbid_extra: bool,
                 before: Callable[[dict[str, Any]], None] | None = None,
                 after: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.name, self.fields, self.forbid_extra, self.before, self.after = name, fields, forbid_extra, before, after
        self.names = frozenset(f[0] for f in fields)
        self.label = name

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if not isinstance(value, dict):
            errors.append(_err("model_attributes_type", loc,
                               "Input should be a valid dictionary or object to extract fields from", value))
            return
        if self.before is not None:
            try:
                self.before(value)
            except ValueError as exc:
                errors.append(_value_error(loc, value, exc))
                return
        before = len(errors)
        for name, schema, required in self.fields:
            if name in value:
                schema.check(value[name], (*loc, name), errors)
            elif required:
                errors.append(_err("missing", (*loc, name), "Field required", value))
        if self.forbid_extra:
            for key, item in value.items():
                if key not in self.names:
                    errors.append(_err("extra_forbidden", (*loc, key), "Extra inputs are not permitted", item))
        if len(errors) == before and self.after is not None:
            try:
                self.after(value)
            except ValueError as exc:
                errors.append(_value_error(loc, value, exc))


class TaggedUnionS(Schema):
    """`Annotated[A | B | C, Field(discriminator="type")]`."""

    def __init__(self, tags: dict[str, ModelS], key: str = "type") -> None:
        self.tags, self.key = tags, key
        self.label = "tagged-union"

    def check(self, value: Any, loc: Loc, errors: Errors) -> None:
        if not isinstance(value, dict):
            errors.append(_err("model_attributes_type", loc,
                               "Input should be a valid dictionary or object to extract fields from", value))
            return
        expected = ", ".join(repr(t) for t in self.tags)
        if self.key not in value:
            errors.append(_err("union_tag_not_found", loc, f"Unable to extract tag using discriminator {self.key!r}",
                               value, {"discriminator": repr(self.key)}))
            return
        tag = value[self.key]
        if not isinstance(tag, str) or tag not in self.tags:
            errors.append(_err("union_tag_invalid", loc,
                               f"Input tag {str(tag)!r} found using {self.key!r} does not match any of the "
                               f"expected tags: {expected}", value,
                               {"discriminator": repr(self.key), "tag": str(tag), "expected_tags": expected}))
            return
        self.tags[tag].check(value, (*loc, tag), errors)


def validate(schema: Schema, value: Any) -> None:
    """Raise `RequestInvalid` with pydantic's errors for the body `value`, if any."""
    errors: Errors = []
    schema.check(value, ("body",), errors)
    if errors:
        raise RequestInvalid(errors)
