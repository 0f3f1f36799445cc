"""Field types and error helpers shared by the spec models (pure: pydantic, no pyspark).

Every type checks its input itself (a :class:`~pydantic.PlainValidator`) so that its error
is ours: a field path and a problem, never the value (pydantic's ``input_value=`` is never
rendered), and declares its JSON Schema. Numbers come out as exact :class:`~fractions.Fraction`
values read by :func:`dp_spark.core.budget.to_fraction`: an integer, a float (by its shortest repr)
or a string such as ``"1e-8"`` or ``"1/3"``.
"""

from __future__ import annotations

import re
from datetime import date
from fractions import Fraction
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import Annotated

from dp_spark.core.budget import to_fraction
from dp_spark.errors import DpSparkError

__all__ = ["SpecModel", "fail", "fail_at", "Identifier", "Column", "PositiveInt", "int_type", "number_type",
           "Number", "PositiveNumber", "FixedDate", "DateBound", "KeyValue", "FreeText", "RELATIVE_DAYS",
           "NAME_PATTERN", "COLUMN_PATTERN"]

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NUMBER_STRING_PATTERN = r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?(/\d+)?\s*$"
#: relative day names of a date key set -> days before the job's date
RELATIVE_DAYS = {"today": 0, "yesterday": 1}


class SpecModel(BaseModel):
    """Base of every spec model: frozen, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def fail(message: str) -> PydanticCustomError:
    """An error of the field being validated: our message, no input value, no pydantic URL."""
    return PydanticCustomError("dp_spark", message.replace("{", "(").replace("}", ")"))


def fail_at(errors: list[tuple[tuple, str]]) -> ValidationError:
    """From a model validator: errors of its fields, each ``(location below the model, message)``."""
    return ValidationError.from_exception_data("spec", [
        InitErrorDetails(type=fail(msg), loc=tuple(loc), input=None) for loc, msg in errors])


def _pattern_type(pattern: str, problem: str, description: str):
    rx = re.compile(pattern)

    def check(v: Any) -> Any:
        if not isinstance(v, str) or not rx.match(v):
            raise fail(problem)
        return v

    return Annotated[str, PlainValidator(check),
                     WithJsonSchema({"type": "string", "pattern": pattern, "description": description})]


Identifier = _pattern_type(NAME_PATTERN, "must be an identifier of letters, digits and '_' (max 64)",
                           "an identifier: a letter, then letters, digits and '_' (at most 64)")
Column = _pattern_type(COLUMN_PATTERN, "must be a plain column name", "a plain column name")


def int_type(minimum: int = 1, maximum: Optional[int] = None):
    def check(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise fail("must be an integer")
        if v < minimum:
            raise fail(f"must be >= {minimum}")
        if maximum is not None and v > maximum:
            raise fail(f"must be <= {maximum}")
        return v

    schema: dict[str, Any] = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return Annotated[int, PlainValidator(check), WithJsonSchema(schema)]


PositiveInt = int_type(1)


def number_type(*, gt: Any = None, ge: Any = None, lt: Any = None, le: Any = None,
                what: str = "", strings: bool = True):
    """An exact number (:func:`dp_spark.core.budget.to_fraction`; ``strings=False``: an int or a
    float only) within the given bounds, as a Fraction."""

    def check(v: Any) -> Fraction:
        if not strings and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise fail("must be a number")
        try:
            f = to_fraction(v, "value")
        except DpSparkError:
            raise fail("must be a finite number") from None
        if ((gt is not None and not f > Fraction(str(gt))) or (ge is not None and not f >= Fraction(str(ge)))
                or (lt is not None and not f < Fraction(str(lt))) or (le is not None and not f <= Fraction(str(le)))):
            raise fail(f"must be {what}")
        return f

    num: dict[str, Any] = {"type": "number"}
    for key, bound in (("exclusiveMinimum", gt), ("minimum", ge), ("exclusiveMaximum", lt), ("maximum", le)):
        if bound is not None:
            num[key] = bound
    schema = num if not strings else {"anyOf": [num, {"type": "string", "pattern": NUMBER_STRING_PATTERN}]}
    return Annotated[Fraction, PlainValidator(check), WithJsonSchema(schema)]


Number = number_type()
PositiveNumber = number_type(gt=0, what="> 0")


def _date_check(*, fixed: bool) -> Callable[[Any], Any]:
    """An ISO date (a date, or its text), or (unless ``fixed``) ``today`` / ``yesterday``,
    kept as the lower-case name: resolved against the job's date when the keys are built."""

    def check(v: Any) -> Any:
        if isinstance(v, date):
            return v
        text = str(v).strip().lower()
        if text in RELATIVE_DAYS:
            if fixed and isinstance(v, str):
                raise fail("must be a fixed ISO date")
            return text
        try:
            return date.fromisoformat(text)
        except ValueError:
            raise fail("must be an ISO date, 'today' or 'yesterday'" if not fixed
                       else "must be a fixed ISO date") from None

    return check


FixedDate = Annotated[Any, PlainValidator(_date_check(fixed=True)),
                      WithJsonSchema({"type": "string", "format": "date",
                                      "description": "an ISO date (YYYY-MM-DD)"})]
DateBound = Annotated[Any, PlainValidator(_date_check(fixed=False)),
                      WithJsonSchema({"anyOf": [{"type": "string", "format": "date"},
                                                {"enum": list(RELATIVE_DAYS)}],
                                      "description": "an ISO date, or today / yesterday: relative to the "
                                                     "job's date (--date), never to the data"})]


def _key_value(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise fail("entries must be strings or integers")
    return v


KeyValue = Annotated[Any, PlainValidator(_key_value), WithJsonSchema({"type": ["string", "integer"]})]
# free text: any scalar is kept as its str(); the schema asks for text
FreeText = Annotated[str, PlainValidator(lambda v: str(v)), WithJsonSchema({"type": "string"})]
