"""Validation errors of every spec file as ours: one :class:`~dp_spark.errors.ConfigError`
naming the file and every problem, one line each with its field path and what to fix, never a
value of the file (pydantic's ``input_value=`` and its URLs are never rendered). Pure."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional

from pydantic import ValidationError

from dp_spark.errors import ConfigError

__all__ = ["error_path", "describe_error", "model_errors", "raise_errors"]

_INPUT_VALUE = re.compile(r",?\s*input_value=.*$", re.S)


def error_path(loc: tuple, tags: frozenset = frozenset()) -> str:
    """A pydantic error location as a field path: ``statistics[2].upper``; a discriminated
    union's tag (one of ``tags``, right after a list index) is left out."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in tags and i > 0 and isinstance(loc[i - 1], int):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def describe_error(err: Mapping[str, Any], path: str, *, doc: str = "docs/config.md",
                   unknown_field: Optional[Callable[[str], Optional[str]]] = None,
                   unknown_tag: Optional[Callable[[Any], str]] = None) -> tuple[str, str]:
    """(field path, problem) of one pydantic error: our words, never the input value.
    ``unknown_field(path)``: a better reason for an unknown field (None: the default);
    ``unknown_tag(tag)``: why a discriminated union's tag is refused."""
    t = err["type"]
    if t == "dp_spark":
        msg = err["msg"]
    elif t == "missing":
        msg = "is required"
    elif t == "extra_forbidden":
        msg = (unknown_field and unknown_field(path)) or f"unknown field ({doc} lists the fields)"
    elif t == "literal_error":
        msg = "must be one of " + err.get("ctx", {}).get("expected", "the documented values")
    elif t in ("model_type", "model_attributes_type", "dict_type"):
        msg = "must be a mapping"
    elif t == "list_type":
        msg = "must be a list"
    elif t == "too_short":
        msg = "must not be empty"
    elif t == "too_long":
        msg = "is too long"
    elif t in ("string_type", "string_too_short"):
        msg = "must be a non-empty string"
    elif t == "union_tag_invalid":
        path = f"{path}.kind"
        msg = unknown_tag(err.get("ctx", {}).get("tag")) if unknown_tag else "unknown kind"
    elif t == "union_tag_not_found":
        path, msg = f"{path}.kind", "is required"
    else:  # any other pydantic message, without the value it was given
        msg = _INPUT_VALUE.sub("", str(err.get("msg", "is invalid")))
    return path, msg


def model_errors(exc: ValidationError, *, prefix: tuple = (), tags: frozenset = frozenset(),
                 **describe: Any) -> list[tuple[str, str]]:
    """The (field path, problem) pairs of a ValidationError, each once, in the models' order."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False, include_input=False, include_context=True):
        item = describe_error(err, error_path((*prefix, *err["loc"]), tags), **describe)
        if item not in out:
            out.append(item)
    return out


def raise_errors(source: str, errors: list[tuple[str, str]], cls: type[ConfigError] = ConfigError) -> None:
    """Raise one ``cls`` naming the file and every problem (``field 'path': problem``)."""
    lines = [f"field '{p}': {m}" if p else m for p, m in errors]
    if len(lines) == 1:
        raise cls(f"{source}: {lines[0]}")
    raise cls(f"{source}: {len(lines)} errors:\n  " + "\n  ".join(lines))
