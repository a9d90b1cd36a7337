"""herald.api.jsonbody: the strict parser every API request body goes through."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.examples import examples

from herald.api.jsonbody import MAX_DEPTH, parse_body
from herald.errors import BadRequest

# JSON values without NUL characters (which the parser refuses on purpose).
_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=20,
)


def code_of(raw: bytes) -> str:
    with pytest.raises(BadRequest) as info:
        parse_body(raw)
    return info.value.code


@settings(max_examples=examples(300), deadline=None)
@given(_json)
def test_any_json_without_duplicates_parses_as_orjson_does(value: Any) -> None:
    raw = orjson.dumps(value)
    assert parse_body(raw) == orjson.loads(raw)
    # Insignificant whitespace and escaped characters make no difference.
    assert parse_body(json.dumps(value, indent=1, ensure_ascii=True).encode()) == orjson.loads(raw)


@settings(max_examples=examples(200), deadline=None)
@given(st.dictionaries(_text, _json, min_size=1, max_size=5), st.data())
def test_a_repeated_key_anywhere_is_refused(obj: dict[str, Any], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    members = [json.dumps(k) + ":" + json.dumps(v) for k, v in obj.items()]
    members.append(json.dumps(key) + ":" + json.dumps(obj[key]))  # same value: still a repeat
    body = "{" + ",".join(members) + "}"
    nest = data.draw(st.integers(min_value=0, max_value=5))
    for _ in range(nest):
        body = '{"outer": [' + body + "]}"
    assert code_of(body.encode()) == "duplicate_key"


def test_keys_equal_after_unescaping_are_repeats() -> None:
    assert code_of(b'{"name": "a", "n\\u0061me": "b"}') == "duplicate_key"
    # Equal keys in different objects are not repeats.
    assert parse_body(b'{"a": {"k": 1}, "b": {"k": 2}}') == {"a": {"k": 1}, "b": {"k": 2}}


def _nested(depth: int, opener: str = "[") -> bytes:
    closer = "]" if opener == "[" else "}"
    inner = "1"
    for _ in range(depth):
        inner = f"{opener}{inner}{closer}" if opener == "[" else f'{{"k":{inner}}}'
    return inner.encode()


def test_depth_limit_is_exact() -> None:
    assert parse_body(_nested(MAX_DEPTH)) is not None
    assert parse_body(_nested(MAX_DEPTH, "{")) is not None
    assert code_of(_nested(MAX_DEPTH + 1)) == "json_too_deep"
    assert code_of(_nested(MAX_DEPTH + 1, "{")) == "json_too_deep"


@pytest.mark.parametrize("depth", [200, 1024, 1025, 100_000])
def test_far_too_deep_is_refused_without_recursion(depth: int) -> None:
    # Past orjson's own limit (1024) the refusal must still be json_too_deep, never a
    # RecursionError from the duplicate scan.
    assert code_of(b"[" * depth + b"]" * depth) == "json_too_deep"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\xff"}',
        b'{"a": "\xc0\xaf"}',  # overlong "/"
        b'{"a": "\xed\xa0\x80"}',  # a UTF-16 surrogate encoded as UTF-8 (CESU-8)
        b'{"a": "\xe2\x82"}',  # truncated sequence
        '{"a": 1}'.encode("utf-16"),
    ],
)
def test_invalid_utf8_is_invalid_encoding(raw: bytes) -> None:
    assert code_of(raw) == "invalid_encoding"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\\u0000"}',
        b'{"a\\u0000": 1}',
        b'{"a": ["x", {"b": "y\\u0000z"}]}',
    ],
)
def test_nul_characters_are_refused(raw: bytes) -> None:
    assert code_of(raw) == "invalid_character"


@pytest.mark.parametrize(
    "raw",
    [
        b"\xef\xbb\xbf{}",  # a byte order mark
        b'{"a": "\\ud800"}',  # a lone surrogate escape
        b'{"a": NaN}',
        b"{'a': 1}",
        b'{"a": 1,}',
        b'{"a": 1} {"b": 2}',
    ],
)
def test_other_malformed_bodies_are_invalid_json(raw: bytes) -> None:
    assert code_of(raw) == "invalid_json"
