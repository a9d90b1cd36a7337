"""Payload filters: a destination's ``filter`` compiled once into a predicate.

The syntax is Outpost's: a JSON object matched against the event
``{"id", "type", "created_at", "tenant_id", "data"}``. A key that does not start
with ``$`` names a field of the value at hand and its filter must match that field
(a nested object matches by equality, field by field; a scalar by equality); a key
starting with ``$`` is an operator on the value at hand: ``$eq $neq $gt $gte $lt
$lte $in $nin $startsWith $endsWith $exist $regex $and $or $not``. Several keys
in one object must all hold. An array matches when the array itself or one of its
elements matches (the negations ``$neq $nin $not`` negate that). Numbers compare
as numbers (``1 == 1.0``; a boolean is not a number), strings as strings, and the
top-level ``created_at`` as a time (RFC 3339 operands). ``$regex`` runs on RE2, a
linear-time engine, never on Python's backtracking ``re``: the pattern is the
tenant's.

:func:`compile_filter` validates a filter (size, depth, each operator's operand) and
raises :class:`~herald.errors.ValidationError` naming the path inside it, such as
``filter.data.amount.$gte``; the :class:`Filter` it returns is pure and reusable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import re2

from herald.errors import ValidationError
from herald.model import Event
from herald.timeutil import parse_timestamp

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "OPERATORS",
    "Filter",
    "compile_filter",
    "document_of",
    "event_document",
]

MAX_DEPTH: Final = 12
"""Nesting of objects and operator lists in one filter."""
MAX_NODES: Final = 256
"""Keys, list items and values in one filter, counted together."""
MAX_STRING: Final = 1024
"""Length of one key, string operand or pattern."""
MAX_LIST: Final = 100
"""Items of one ``$in``/``$nin``/``$and``/``$or`` list."""

_TIME_FIELD: Final = "created_at"

Value = Any
Predicate = Callable[[Value], bool]


def _invalid(message: str, *, field: str) -> ValidationError:
    return ValidationError(message, field=field, code="filter_invalid")


class _Missing:
    """The value of a field the document does not have."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


def _is_number(v: Value) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _same(a: Value, b: Value) -> bool:
    """JSON equality: numbers by value, booleans only equal booleans, containers deep."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _any_element(pred: Predicate) -> Predicate:
    """``pred`` on the value, or on any element when the value is an array."""

    def match(v: Value) -> bool:
        return pred(v) or (isinstance(v, list) and any(pred(e) for e in v))

    return match


def _time(v: Value) -> float | None:
    return _epoch(v) if isinstance(v, str) else None


@functools.lru_cache(maxsize=4096)  # an event's created_at is asked once per filter
def _epoch(text: str) -> float | None:
    try:
        return parse_timestamp(text).epoch
    except ValueError:
        return None


_ORDER: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}

OPERATORS: Final = (
    "$eq",
    "$neq",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$in",
    "$nin",
    "$startsWith",
    "$endsWith",
    "$exist",
    "$regex",
    "$and",
    "$or",
    "$not",
)


@dataclass(frozen=True, slots=True)
class Filter:
    """A compiled filter: call :meth:`matches` with the event document."""

    source: Mapping[str, Any]
    _predicate: Predicate

    def matches(self, document: Mapping[str, Any]) -> bool:
        return self._predicate(document)


def event_document(
    *, id: str, type: str, created_at: str, tenant_id: str, data: bytes | Value
) -> dict[str, Any]:
    """What a filter is matched against; ``data`` as stored JSON bytes or parsed."""
    parsed = orjson.loads(data) if isinstance(data, bytes | bytearray | memoryview) else data
    return {
        "id": id,
        "type": type,
        "created_at": created_at,
        "tenant_id": tenant_id,
        "data": parsed,
    }


def document_of(event: Event) -> dict[str, Any]:
    """:func:`event_document` of a stored event."""
    return event_document(
        id=event.id,
        type=event.type,
        created_at=event.created_at,
        tenant_id=event.tenant_id,
        data=event.data,
    )


def compile_filter(spec: Value, *, field: str = "filter") -> Filter:
    """Validate ``spec`` and compile it; raises ValidationError naming the path."""
    if not isinstance(spec, dict):
        raise _invalid("a filter is a JSON object", field=field)
    compiler = _Compiler()
    predicate = compiler.node(spec, field, depth=1, time=False, top=True)
    return Filter(spec, predicate)


class _Compiler:
    def __init__(self) -> None:
        self.nodes = 0

    def count(self, path: str) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _invalid(f"a filter has at most {MAX_NODES} keys and values", field=path)

    def node(
        self, spec: Value, path: str, *, depth: int, time: bool, top: bool = False
    ) -> Predicate:
        """A filter on the value at hand: an object of fields and operators, or a
        value it must equal."""
        self.count(path)
        if depth > MAX_DEPTH:
            raise _invalid(f"a filter nests at most {MAX_DEPTH} levels", field=path)
        if not isinstance(spec, dict):
            return self.equals(spec, path, depth=depth, time=time)
        preds: list[Predicate] = []
        for key, sub in spec.items():
            if len(key) > MAX_STRING:
                raise _invalid(f"a key is at most {MAX_STRING} characters", field=path)
            sub_path = f"{path}.{key}"
            if key.startswith("$"):
                preds.append(self.operator(key, sub, sub_path, depth=depth, time=time))
            else:
                inner = self.node(sub, sub_path, depth=depth + 1, time=top and key == _TIME_FIELD)
                preds.append(_field(key, inner))
        if len(preds) == 1:
            return preds[0]
        return lambda v: all(p(v) for p in preds)

    def equals(self, operand: Value, path: str, *, depth: int, time: bool) -> Predicate:
        self.value(operand, path, depth=depth)
        if time:
            at = self.instant(operand, path)
            return _any_element(lambda v: _time(v) == at)
        return _any_element(lambda v: v is not MISSING and _same(v, operand))

    def value(self, operand: Value, path: str, *, depth: int) -> None:
        """Count and bound a literal JSON value inside the filter."""
        if depth > MAX_DEPTH:
            raise _invalid(f"a filter nests at most {MAX_DEPTH} levels", field=path)
        if isinstance(operand, str) and len(operand) > MAX_STRING:
            raise _invalid(f"a string is at most {MAX_STRING} characters", field=path)
        if isinstance(operand, dict):
            for k, v in operand.items():
                self.count(path)
                self.value(v, f"{path}.{k}", depth=depth + 1)
        elif isinstance(operand, list):
            for i, v in enumerate(operand):
                self.count(path)
                self.value(v, f"{path}[{i}]", depth=depth + 1)
        elif not (operand is None or isinstance(operand, bool | int | float | str)):
            raise _invalid("not a JSON value", field=path)

    def instant(self, operand: Value, path: str) -> float:
        if not isinstance(operand, str):
            raise _invalid("created_at compares with an RFC 3339 time", field=path)
        try:
            return parse_timestamp(operand).epoch
        except ValueError as exc:
            raise _invalid(f"created_at: {exc}", field=path) from None

    def operator(self, op: str, operand: Value, path: str, *, depth: int, time: bool) -> Predicate:
        if op in ("$eq", "$neq"):
            eq = self.equals(operand, path, depth=depth + 1, time=time)
            return eq if op == "$eq" else (lambda v: not eq(v))
        if op in _ORDER:
            return self.order(op, operand, path, time=time)
        if op in ("$in", "$nin"):
            options = self.each(op, operand, path, self.equals, "values", depth=depth, time=time)
            if op == "$in":
                return lambda v: any(o(v) for o in options)
            return lambda v: not any(o(v) for o in options)
        if op in ("$startsWith", "$endsWith"):
            text = self.text(op, operand, path)
            if op == "$startsWith":
                return _any_element(lambda v: isinstance(v, str) and v.startswith(text))
            return _any_element(lambda v: isinstance(v, str) and v.endswith(text))
        if op == "$exist":
            if not isinstance(operand, bool):
                raise _invalid("$exist takes true or false", field=path)
            return (lambda v: v is not MISSING) if operand else (lambda v: v is MISSING)
        if op == "$regex":
            return self.regex(operand, path)
        if op in ("$and", "$or"):
            subs = self.each(
                op, operand, path, self.logical, "filters", depth=depth, time=time, empty=False
            )
            if op == "$and":
                return lambda v: all(s(v) for s in subs)
            return lambda v: any(s(v) for s in subs)
        if op == "$not":
            sub = self.logical(operand, path, depth=depth + 1, time=time)
            return lambda v: not sub(v)
        raise _invalid(
            f"unknown operator {op[:64]!r}; the operators are {', '.join(OPERATORS)}", field=path
        )

    def each(
        self,
        op: str,
        operand: Value,
        path: str,
        item: Callable[..., Predicate],
        what: str,
        *,
        depth: int,
        time: bool,
        empty: bool = True,
    ) -> list[Predicate]:
        """The predicates of an array operand's items, ``$in``'s values or ``$and``'s
        filters (``what``), at most :data:`MAX_LIST` of them, each compiled by ``item``."""
        if not isinstance(operand, list) or not (empty or operand):
            array = "an array" if empty else f"a non-empty array of {what}"
            raise _invalid(f"{op} takes {array}", field=path)
        if len(operand) > MAX_LIST:
            raise _invalid(f"{op} takes at most {MAX_LIST} {what}", field=path)
        return [item(o, f"{path}[{i}]", depth=depth + 1, time=time) for i, o in enumerate(operand)]

    def logical(self, operand: Value, path: str, *, depth: int, time: bool) -> Predicate:
        if not isinstance(operand, dict):
            raise _invalid("a filter object is expected here", field=path)
        return self.node(operand, path, depth=depth, time=time)

    def text(self, op: str, operand: Value, path: str) -> str:
        self.count(path)
        if not isinstance(operand, str):
            raise _invalid(f"{op} takes a string", field=path)
        if len(operand) > MAX_STRING:
            raise _invalid(f"{op} takes at most {MAX_STRING} characters", field=path)
        return operand

    def order(self, op: str, operand: Value, path: str, *, time: bool) -> Predicate:
        self.count(path)
        cmp = _ORDER[op]
        if time:
            at = self.instant(operand, path)

            def at_time(v: Value) -> bool:
                t = _time(v)
                return t is not None and cmp(t, at)

            return _any_element(at_time)
        if _is_number(operand):
            return _any_element(lambda v: _is_number(v) and cmp(v, operand))
        if isinstance(operand, str):
            if len(operand) > MAX_STRING:
                raise _invalid(f"{op} takes at most {MAX_STRING} characters", field=path)
            return _any_element(lambda v: isinstance(v, str) and cmp(v, operand))
        raise _invalid(f"{op} compares with a number or a string", field=path)

    def regex(self, operand: Value, path: str) -> Predicate:
        pattern = self.text("$regex", operand, path)
        options = re2.Options()
        options.max_mem = 1 << 20  # a pattern whose automaton needs more is refused
        options.log_errors = False
        try:
            compiled = re2.compile(pattern, options)
        except re2.error as exc:
            raise _invalid(f"$regex is not a valid RE2 pattern: {exc}", field=path) from None
        search = compiled.search
        return _any_element(lambda v: isinstance(v, str) and search(v) is not None)


def _field(key: str, inner: Predicate) -> Predicate:
    """``inner`` on ``key`` of an object (MISSING where absent); on an array of objects,
    on any element's."""

    def get(v: Value) -> Value:
        return v.get(key, MISSING) if isinstance(v, dict) else MISSING

    def match(v: Value) -> bool:
        if isinstance(v, list):
            return inner(MISSING) if not v else any(match(e) for e in v)
        return inner(get(v))

    return match
