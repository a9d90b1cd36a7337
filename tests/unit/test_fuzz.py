"""Fuzzing the three parsers of outside input, for a bounded time in ``make test``.

Whatever a producer writes into the outbox, a client sends as a body, or an
operator puts in the config file or the environment, the parser answers with a
value or its own typed error (``Reject``, ``BadRequest``, ``ConfigError``): never
another exception, which would be a traceback instead of a reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.examples import examples

from herald.api.jsonbody import parse_body
from herald.config import Settings, load_settings
from herald.errors import BadRequest, ConfigError
from herald.ingest import CONTROL, Reject, parse_row
from herald.model import OutboxRow

# A few seconds each on a loaded 2-core machine; new examples every run.
FUZZ = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# --- the outbox row ----------------------------------------------------------------

TEXTS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["evt_1", "evt_x\r\nX-Injected: yes", "default", "a.b", "order.created"]),
    st.builds(lambda s: "evt_" + s, st.text(max_size=40)),
)
FIELD = st.one_of(
    st.none(),
    st.binary(max_size=60),
    TEXTS.map(lambda s: s.encode("utf-8", "surrogatepass")),
)
TIMESTAMPS = st.one_of(
    FIELD,
    st.sampled_from(
        [
            b"2026-11-22 10:00:00.123",
            b"2026-11-22T12:00:00.5+02:00",
            b"2026-02-30T00:00:00Z",
            b"infinity",
            b"0044-03-15 12:00:00+00 BC",
            b"10000-01-01T00:00:00Z",
            b"2026-11-22T10:00:00+99:99",
        ]
    ),
    st.datetimes().map(lambda d: d.isoformat().encode()),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)
DATA = st.one_of(
    FIELD,
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.text(max_size=5), JSON_VALUES).map(lambda v: json.dumps(v).encode()),
)


@FUZZ
@given(
    id_=FIELD,
    tenant=FIELD,
    type_=st.one_of(FIELD, st.sampled_from([b"order.created", b"a.b-c_d.e"])),
    data=DATA,
    created_at=TIMESTAMPS,
    limit=st.integers(min_value=0, max_value=4096),
)
def test_an_outbox_row_becomes_an_event_or_a_reject(
    id_: bytes | None,
    tenant: bytes | None,
    type_: bytes | None,
    data: bytes | None,
    created_at: bytes | None,
    limit: int,
) -> None:
    row = OutboxRow(seq=1, id=id_, tenant_id=tenant, type=type_, data=data, created_at=created_at)
    try:
        event = parse_row(row, max_payload_bytes=limit)
    except Reject:
        return
    assert CONTROL.search(event.id) is None
    assert CONTROL.search(event.tenant_id) is None
    assert CONTROL.search(event.type) is None
    assert isinstance(json.loads(event.data), dict)
    assert len(event.data) <= limit


# --- the API's JSON body -------------------------------------------------------------

BODIES = st.one_of(
    st.binary(max_size=200),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    # Valid JSON, then cut, spliced or given a hostile token.
    st.tuples(
        JSON_VALUES.map(json.dumps),
        st.integers(min_value=0, max_value=200),
        st.sampled_from(
            ["", "NaN", "\\u0000", "\\ud800", "1e999", "9" * 400, '"a":1,"a":2', "[" * 70, "\ufeff"]
        ),
    ).map(lambda t: (t[0][: t[1]] + t[2] + t[0][t[1] :]).encode("utf-8", "surrogatepass")),
    st.integers(min_value=1, max_value=200).map(lambda n: b"[" * n + b"]" * n),
    st.integers(min_value=0, max_value=5000).map(lambda n: b'{"n": ' + b"1" * n + b"}"),
)


@FUZZ
@given(raw=BODIES)
def test_a_request_body_parses_or_is_a_bad_request(raw: bytes) -> None:
    with suppress(BadRequest):
        parse_body(raw)


# --- the config: a TOML file and HERALD_ variables -----------------------------------

SECTIONS: dict[str, list[str]] = {
    name: sorted(field.annotation.model_fields)  # type: ignore[union-attr]
    for name, field in Settings.model_fields.items()
}
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        ["auto", "sqlite:///h.db", "postgresql://u:p@h/d", "http://p:3128", "127.0.0.1:80", "10/8"]
    ),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=5), SCALARS, max_size=2),
)


def _toml_key(key: str) -> str:
    return json.dumps(key)  # a quoted key is valid TOML for any string


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    return json.dumps(value, ensure_ascii=True)


@st.composite
def toml_documents(draw: st.DrawFn) -> str:
    lines: list[str] = []
    top = draw(st.dictionaries(st.text(max_size=12), VALUES, max_size=2))
    lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in top.items())
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "nope"]), max_size=3, unique=True)):
        lines.append(f"[{section}]")
        keys = st.sampled_from(SECTIONS.get(section, ["x"])) | st.text(max_size=8)
        for key, value in draw(st.dictionaries(keys, VALUES, max_size=4)).items():
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n"
    # Now and then, a document cut or broken.
    cut = draw(st.none() | st.integers(min_value=0, max_value=len(text)))
    return text if cut is None else text[:cut] + draw(st.sampled_from(["", "=", "[", '"', "\x00"]))


ENV_NAMES = st.one_of(
    st.sampled_from(
        [f"HERALD_{s.upper()}" for s in SECTIONS]
        + [f"HERALD_{s.upper()}__{k.upper()}" for s, keys in SECTIONS.items() for k in keys]
    ),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12).map(
        lambda s: "HERALD_" + s
    ),
)
ENV_VALUES = st.one_of(
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        max_size=30,
    ),
    VALUES.map(json.dumps),
)


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.upper().startswith("HERALD_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(values)
    try:
        yield
    finally:
        for key in values:
            os.environ.pop(key, None)
        os.environ.update(saved)


@pytest.fixture(scope="module")
def config_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FUZZ
@given(
    document=st.one_of(toml_documents(), st.text(max_size=200)),
    env=st.dictionaries(ENV_NAMES, ENV_VALUES, max_size=3),
)
def test_a_config_loads_or_is_a_config_error(
    config_dir: Path, document: str, env: dict[str, str]
) -> None:
    path = config_dir / "herald.toml"
    path.write_text(document, encoding="utf-8", errors="surrogatepass")
    with _environment(env), suppress(ConfigError):
        load_settings(path)
