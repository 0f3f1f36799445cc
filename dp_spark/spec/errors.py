"""Validation errors of every spec file as ours: one :class:`~dp_spark.errors.ConfigError`
naming the file and every problem, one line each with its field path and what to fix, never a
value of the file (pydantic's ``input_value=`` and its URLs are never rendered). Pure."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any, Callable, Mapping, Optional

from pydantic import BaseModel, ValidationError

from dp_spark.errors import ConfigError

__all__ = ["error_path", "describe_error", "model_errors", "raise_errors", "allowed_fields", "did_you_mean"]


def did_you_mean(name: object, choices, *, names_are_case_sensitive: bool = False) -> str:
    """`` (did you mean 'x'?)`` when ``name`` is close to one of ``choices`` (names of fields,
    budgets, columns, kinds: never data values), else ``""``. Closeness is difflib's ratio,
    case-insensitive; a match differing only in case says that names are case-sensitive when
    ``names_are_case_sensitive``."""
    if not isinstance(name, str) or not name:
        return ""
    by_lower = {str(c).lower(): str(c) for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    if not hits or by_lower[hits[0]] == name:
        return ""
    hit = by_lower[hits[0]]
    if names_are_case_sensitive and hit.lower() == name.lower():
        return f" (did you mean '{hit}'? names are case-sensitive)"
    return f" (did you mean '{hit}'?)"

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


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models_in(a)]


def allowed_fields(model: type[BaseModel], loc: tuple) -> Optional[list[str]]:
    """The fields of the model that holds the field at ``loc`` (an unknown field's location),
    or None when it cannot be told."""
    current: list[type[BaseModel]] = [model]
    for part in loc[:-1]:
        if isinstance(part, int) or not current:
            continue  # a list entry: the same candidates
        by_tag = [m for m in current if "kind" in m.model_fields
                  and part in typing.get_args(m.model_fields["kind"].annotation)]
        if by_tag:  # a discriminated union's tag picks its member
            current = by_tag
            continue
        fields = [m.model_fields[part] for m in current if part in m.model_fields]
        if fields:
            current = [m for f in fields for m in _models_in(f.annotation)]
        # else: a mapping's key (principals.<name>): the same candidates
    return sorted(current[0].model_fields) if len(current) == 1 else None


def describe_error(err: Mapping[str, Any], path: str, *, doc: str = "docs/config.md",
                   unknown_field: Optional[Callable[[str], Optional[str]]] = None,
                   unknown_tag: Optional[Callable[[Any], str]] = None,
                   model: Optional[type[BaseModel]] = None) -> tuple[str, str]:
    """(field path, problem) of one pydantic error: our words, never the input value.
    ``unknown_field(path)``: a better reason for an unknown field (None: the default, which
    lists the fields allowed there when ``model``, the validated model, tells them);
    ``unknown_tag(tag)``: why a discriminated union's tag is refused."""
    t = err["type"]
    if t == "dp_spark":
        msg = err["msg"]
    elif t == "missing":
        msg = "is required"
    elif t == "extra_forbidden":
        allowed = allowed_fields(model, tuple(err["loc"])) if model is not None else None
        hint = did_you_mean(err["loc"][-1], allowed) if allowed else ""
        msg = (unknown_field and unknown_field(path)) or (
            f"unknown field{hint} (allowed: {allowed})" if allowed else f"unknown field ({doc} lists the fields)")
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
