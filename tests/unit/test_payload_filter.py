"""Payload filters: every operator, the validation paths, RE2, and a property test
against a plain reference evaluator."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.examples import examples

from herald.errors import ValidationError
from herald.payload_filter import MAX_DEPTH, MAX_NODES, compile_filter, event_document

EVENT = event_document(
    id="evt_1",
    type="order.created",
    created_at="2026-03-01T12:00:00Z",
    tenant_id="acme",
    data=b'{"amount":150,"currency":"EUR","customer":{"tier":"gold","id":"cus_9"},'
    b'"tags":["new","vip"],"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],'
    b'"note":null,"ok":true,"ratio":0.5}',
)


def passes(spec: dict[str, Any], doc: dict[str, Any] = EVENT) -> bool:
    return compile_filter(spec).matches(doc)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, True),
        ({"type": "order.created"}, True),
        ({"type": "order.updated"}, False),
        ({"data": {"currency": "EUR", "customer": {"tier": "gold"}}}, True),
        ({"data": {"customer": {"tier": "silver"}}}, False),
        ({"data": {"amount": 150.0}}, True),  # numbers as numbers
        ({"data": {"ok": 1}}, False),  # a boolean is not a number
        ({"data": {"note": None}}, True),
        ({"data": {"missing": None}}, False),
        ({"data": {"tags": "vip"}}, True),  # an array matches when an element does
        ({"data": {"tags": ["new", "vip"]}}, True),  # or as a whole
        ({"data": {"items": {"sku": "B-7"}}}, True),  # fields of an array's objects
        ({"data": {"items": {"sku": "C-0"}}}, False),
        # $eq / $neq
        ({"data": {"amount": {"$eq": 150}}}, True),
        ({"data": {"amount": {"$neq": 150}}}, False),
        ({"data": {"currency": {"$neq": "USD"}}}, True),
        ({"data": {"absent": {"$neq": "x"}}}, True),
        ({"data": {"customer": {"$eq": {"tier": "gold", "id": "cus_9"}}}}, True),
        ({"data": {"customer": {"$eq": {"tier": "gold"}}}}, False),  # $eq is whole
        # order
        ({"data": {"amount": {"$gt": 100}}}, True),
        ({"data": {"amount": {"$gt": 150}}}, False),
        ({"data": {"amount": {"$gte": 150}}}, True),
        ({"data": {"amount": {"$lt": 150}}}, False),
        ({"data": {"amount": {"$lte": 150}}}, True),
        ({"data": {"amount": {"$gt": 100, "$lt": 200}}}, True),
        ({"data": {"currency": {"$gt": 100}}}, False),  # a string is not a number
        ({"data": {"currency": {"$gte": "EUR", "$lt": "USD"}}}, True),
        ({"data": {"items": {"qty": {"$gte": 2}}}}, True),
        ({"data": {"ratio": {"$lt": 1}}}, True),
        # created_at as a time, whatever the offset or precision
        ({"created_at": {"$gte": "2026-03-01T13:00:00+01:00"}}, True),
        ({"created_at": {"$gt": "2026-03-01T12:00:00.000001Z"}}, False),
        ({"created_at": {"$lt": "2026-03-02"}}, False),  # not a time: refused below
        ({"created_at": "2026-03-01T07:00:00-05:00"}, True),
        # $in / $nin
        ({"data": {"currency": {"$in": ["USD", "EUR"]}}}, True),
        ({"data": {"currency": {"$in": ["USD"]}}}, False),
        ({"data": {"currency": {"$nin": ["USD"]}}}, True),
        ({"data": {"tags": {"$in": ["vip"]}}}, True),
        ({"data": {"tags": {"$nin": ["vip"]}}}, False),
        ({"data": {"amount": {"$in": [150.0]}}}, True),
        # strings
        ({"data": {"customer": {"id": {"$startsWith": "cus_"}}}}, True),
        ({"data": {"customer": {"id": {"$endsWith": "_9"}}}}, True),
        ({"data": {"customer": {"id": {"$endsWith": "_8"}}}}, False),
        ({"data": {"amount": {"$startsWith": "1"}}}, False),
        ({"type": {"$startsWith": "order."}}, True),
        # $exist
        ({"data": {"note": {"$exist": True}}}, True),
        ({"data": {"absent": {"$exist": True}}}, False),
        ({"data": {"absent": {"$exist": False}}}, True),
        ({"data": {"amount": {"$exist": False}}}, False),
        # $regex (RE2, a search)
        ({"data": {"customer": {"id": {"$regex": "^cus_[0-9]+$"}}}}, True),
        ({"data": {"customer": {"id": {"$regex": "^CUS"}}}}, False),
        ({"data": {"customer": {"id": {"$regex": "(?i)^CUS"}}}}, True),
        ({"data": {"tags": {"$regex": "^v"}}}, True),
        ({"data": {"amount": {"$regex": "1"}}}, False),
        # logic
        ({"$and": [{"type": "order.created"}, {"data": {"amount": {"$gt": 100}}}]}, True),
        ({"$and": [{"type": "order.created"}, {"data": {"amount": {"$gt": 200}}}]}, False),
        ({"$or": [{"type": "x"}, {"data": {"currency": "EUR"}}]}, True),
        ({"$or": [{"type": "x"}, {"data": {"currency": "USD"}}]}, False),
        ({"$not": {"type": "x"}}, True),
        ({"data": {"amount": {"$not": {"$gt": 100}}}}, False),
        ({"data": {"$or": [{"amount": 1}, {"currency": "EUR"}]}}, True),
    ],
)
def test_operators(spec: dict[str, Any], expected: bool) -> None:
    if spec == {"created_at": {"$lt": "2026-03-02"}}:
        with pytest.raises(ValidationError) as info:
            compile_filter(spec)
        assert info.value.field == "filter.created_at.$lt"
        return
    assert passes(spec) is expected


def test_data_not_an_object_never_matches_a_field() -> None:
    doc = event_document(
        id="e", type="t", created_at="2026-01-01T00:00:00Z", tenant_id="t", data=[1]
    )
    assert passes({"data": {"a": 1}}, doc) is False
    assert passes({"data": 1}, doc) is True


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ([], "filter"),
        ({"data": {"amount": {"$gte": "ten", "$bad": 1}}}, "filter.data.amount.$bad"),
        ({"data": {"amount": {"$gte": None}}}, "filter.data.amount.$gte"),
        ({"data": {"amount": {"$gte": [1]}}}, "filter.data.amount.$gte"),
        ({"data": {"currency": {"$in": "EUR"}}}, "filter.data.currency.$in"),
        ({"data": {"currency": {"$nin": list(range(101))}}}, "filter.data.currency.$nin"),
        ({"data": {"id": {"$startsWith": 1}}}, "filter.data.id.$startsWith"),
        ({"data": {"id": {"$endsWith": None}}}, "filter.data.id.$endsWith"),
        ({"data": {"id": {"$exist": "yes"}}}, "filter.data.id.$exist"),
        ({"data": {"id": {"$regex": "(unclosed"}}}, "filter.data.id.$regex"),
        ({"data": {"id": {"$regex": "(a)\\1"}}}, "filter.data.id.$regex"),  # no backrefs
        ({"$and": []}, "filter.$and"),
        ({"$or": [{"type": "a"}, 3]}, "filter.$or[1]"),
        ({"$or": [{"type": {"$lt": True}}]}, "filter.$or[0].type.$lt"),
        ({"$not": "x"}, "filter.$not"),
        ({"created_at": {"$gte": "yesterday"}}, "filter.created_at.$gte"),
        ({"created_at": 5}, "filter.created_at"),
        ({"data": {"x": {"$regex": "a" * 2000}}}, "filter.data.x.$regex"),
    ],
)
def test_invalid_filters_name_the_path(spec: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        compile_filter(spec)
    assert info.value.field == field


def test_limits() -> None:
    deep: dict[str, Any] = {"v": 1}
    for _ in range(MAX_DEPTH + 1):
        deep = {"a": deep}
    with pytest.raises(ValidationError, match="nests"):
        compile_filter(deep)
    wide = {"data": {f"k{i}": i for i in range(MAX_NODES + 1)}}
    with pytest.raises(ValidationError, match="at most"):
        compile_filter(wide)
    huge = {"data": {"x": {"$eq": list(range(MAX_NODES + 1))}}}
    with pytest.raises(ValidationError, match="at most"):
        compile_filter(huge)


def test_regex_runs_in_linear_time() -> None:
    """The pattern and input Python's backtracking ``re`` takes seconds (and doubling
    per character) on: RE2 answers at once. Bounded by size, not by a clock."""
    doc = event_document(
        id="e", type="t", created_at="2026-01-01T00:00:00Z", tenant_id="t",
        data={"s": "a" * 40 + "!", "long": "a" * 100_000 + "!"},
    )  # fmt: skip
    assert passes({"data": {"s": {"$regex": "(a+)+$"}}}, doc) is False
    assert passes({"data": {"long": {"$regex": "^(a|aa)*$"}}}, doc) is False
    assert passes({"data": {"long": {"$regex": "(a+)+!$"}}}, doc) is True


# --- a reference evaluator, written for clarity, not speed -----------------------

_MISSING = object()


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _num(a) and _num(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _some(v: Any, test: Any) -> bool:
    return bool(test(v)) or (isinstance(v, list) and any(test(e) for e in v))


def ref(spec: Any, v: Any) -> bool:
    if not isinstance(spec, dict):
        return _some(v, lambda x: x is not _MISSING and _eq(x, spec))
    ok = True
    for key, sub in spec.items():
        if key == "$eq":
            ok &= ref(sub if not isinstance(sub, dict) else {"$__whole": sub}, v)
        elif key == "$__whole":
            ok &= _some(v, lambda x, s=sub: x is not _MISSING and _eq(x, s))
        elif key == "$neq":
            ok &= not ref({"$eq": sub}, v)
        elif key in ("$gt", "$gte", "$lt", "$lte"):
            ops = {
                "$gt": lambda a, b: a > b,
                "$gte": lambda a, b: a >= b,
                "$lt": lambda a, b: a < b,
                "$lte": lambda a, b: a <= b,
            }
            same = _num if _num(sub) else (lambda x: isinstance(x, str))
            ok &= _some(v, lambda x, s=sub, f=ops[key], same=same: same(x) and f(x, s))
        elif key == "$in":
            ok &= any(ref({"$eq": o}, v) for o in sub)
        elif key == "$nin":
            ok &= not any(ref({"$eq": o}, v) for o in sub)
        elif key == "$exist":
            ok &= (v is not _MISSING) == sub
        elif key == "$and":
            ok &= all(ref(s, v) for s in sub)
        elif key == "$or":
            ok &= any(ref(s, v) for s in sub)
        elif key == "$not":
            ok &= not ref(sub, v)
        else:

            def field(x: Any, key: str = key, sub: Any = sub) -> bool:
                if isinstance(x, list):
                    return ref(sub, _MISSING) if not x else any(field(e) for e in x)
                return ref(sub, x.get(key, _MISSING) if isinstance(x, dict) else _MISSING)

            ok &= field(v)
    return ok


_keys = st.sampled_from(["a", "b", "c"])
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0, -1.5]),
    st.sampled_from(["", "x", "xy", "y"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=8,
)


def _filters() -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        ops = st.one_of(
            st.builds(lambda v: {"$eq": v}, _scalars),
            st.builds(lambda v: {"$neq": v}, _scalars),
            st.builds(
                lambda op, v: {op: v},
                st.sampled_from(["$gt", "$gte", "$lt", "$lte"]),
                st.one_of(st.integers(-3, 3), st.sampled_from(["x", "xy"])),
            ),
            st.builds(lambda v: {"$in": v}, st.lists(_scalars, max_size=3)),
            st.builds(lambda v: {"$nin": v}, st.lists(_scalars, max_size=3)),
            st.builds(lambda v: {"$exist": v}, st.booleans()),
            st.builds(lambda v: {"$and": v}, st.lists(inner, min_size=1, max_size=2)),
            st.builds(lambda v: {"$or": v}, st.lists(inner, min_size=1, max_size=2)),
            st.builds(lambda v: {"$not": v}, inner),
        )
        fields = st.dictionaries(_keys, st.one_of(inner, _scalars), min_size=1, max_size=2)
        return st.one_of(ops, fields)

    return st.recursive(st.dictionaries(_keys, _scalars, max_size=2), extend, max_leaves=6)


@settings(max_examples=examples(400), deadline=None)
@given(spec=_filters(), value=st.dictionaries(_keys, _values, max_size=3))
def test_agrees_with_the_reference(spec: dict[str, Any], value: dict[str, Any]) -> None:
    assert compile_filter({"data": spec}).matches({"data": value}) == ref(spec, value)
