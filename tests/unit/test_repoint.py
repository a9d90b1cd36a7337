"""Issue 31's low items: format characters in names and ids, RFC 9110 header values, and
the re-point rule's declarations kept true to docs/security.md."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest

from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.adapters.webhook import check_custom_headers, header_problem
from herald.cli.output import print_json, visible
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.fields import name_field
from herald.ingest import CONTROL, FORMAT_CHARACTERS, control_problem, event_id_problem

ROOT = Path(__file__).resolve().parents[2]
SPOOF = "bidi\u202egnp.exe"
"""Shows as ``bidiexe.png``."""


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))


# --- format characters ---------------------------------------------------------------
def test_the_format_characters_are_every_cf_zl_and_zp_character() -> None:
    """The hand-kept list against this Python's Unicode database: every format character
    and separator is in it, and nothing else that is assigned."""
    pattern = re.compile(f"[{FORMAT_CHARACTERS}]")
    for code in range(0x110000):
        char = chr(code)
        category = unicodedata.category(char)
        if category in ("Cf", "Zl", "Zp"):
            assert pattern.fullmatch(char), f"U+{code:04X} ({category}) is not listed"
        elif pattern.fullmatch(char):
            assert category == "Cn", f"U+{code:04X} ({category}) is listed"


@pytest.mark.parametrize(
    "text", [SPOOF, "a\u2066b\u2069", "zero\u200bwidth", "\ufeffbom", "tag\U000e0041", "l\u2028s"]
)
def test_names_and_ids_with_a_format_character_are_refused(text: str) -> None:
    found = CONTROL.search(text)
    assert found is not None
    assert control_problem(text, "name") == (
        f"name contains a format character ({found.group()!r} at {found.start()})"
    )
    with pytest.raises(ValidationError) as info:
        name_field({"name": text})
    assert (info.value.field, info.value.code) == ("name", "name_invalid")
    assert event_id_problem(f"evt_{text}") is not None


@pytest.mark.parametrize("text", ["café", "名前", "Ωmega – dash", "emoji 🚀", "a b"])
def test_other_letters_and_symbols_are_names(text: str) -> None:
    assert control_problem(text, "name") is None
    assert name_field({"name": text}) == text


def test_the_cli_escapes_format_characters(capsys: pytest.CaptureFixture[str]) -> None:
    assert visible(SPOOF) == "bidi\\u202egnp.exe"
    assert visible("tag\U000e0041 x\u200by") == "tag\\U000e0041 x\\u200by"
    value = {"name": SPOOF, "tag": "t\U000e0041", "ctl": "\x9b"}
    print_json(value)
    out = capsys.readouterr().out
    assert out.isascii()
    assert "\\u202e" in out
    assert "\\udb40\\udc41" in out  # beyond the BMP: a surrogate pair
    assert json.loads(out) == value


# --- custom headers ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-A", "a\x01b"),
        ("X-A", "a\x00"),
        ("X-A", "del\x7f"),
        ("X-A", "c1\x85"),
        ("X-A", "esc\x1b[2J"),
        ("X-A", " secret-1"),
        ("X-A", "secret-2\t"),
        ("Expect", "100-continue"),
        ("TE", "trailers"),
        ("Content-Encoding", "gzip"),
        ("Proxy-Authorization", "Basic eA=="),
        ("proxy-anything", "secret-3"),
    ],
)
def test_a_header_that_can_never_be_sent_as_given_is_refused(name: str, value: str) -> None:
    problem = header_problem(name, value)
    assert problem is not None
    assert value.strip() not in problem  # never the value (it may be a credential)
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        check_custom_headers(json.dumps({name: value}))


@pytest.mark.parametrize(
    "value", ["", "Bearer abc.def", "a\tb", "a  b", "café", "x=1; y=2", "~!@#$%^&*()"]
)
def test_field_values_of_rfc_9110_are_accepted(value: str) -> None:
    assert header_problem("X-Custom", value) is None


def test_the_header_rules_hold_a_change_not_a_stored_config(registry: Registry) -> None:
    raw = {"url": "https://example.com/hook", "custom_headers": json.dumps({"TE": "trailers"})}
    with pytest.raises(ValidationError) as info:
        registry.parse_config("webhook", raw, submitted=True)
    assert info.value.field == "webhook.custom_headers"
    # Stored before the rule: still read (and sent as before), never made unreadable.
    assert registry.parse_config("webhook", raw).target() == (None, raw["url"], None)


# --- the re-point rule's declarations ------------------------------------------------
def _table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/security.md's table: type → (target fields, credentials), as backticked."""
    text = (ROOT / "docs" / "security.md").read_text()
    start = text.index("| type | the target")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [set(re.findall(r"`([a-z0-9_]+)`", c)) for c in cells]
        rows[names[0].pop()] = (names[1], names[2])
    return rows


def test_the_security_docs_name_each_types_target_and_credentials(registry: Registry) -> None:
    table = _table()
    assert set(table) == {a.type_id for a in registry}
    for adapter in registry:
        model = adapter.config_model
        target, credentials = table[adapter.type_id]
        assert target == set(model.marked("target")), adapter.type_id
        assert credentials - {"server_url"} == set(model.sensitive_fields()), adapter.type_id
        assert not model.marked("target") & model.sensitive_fields(), adapter.type_id
        assert set(model.renewed) <= model.sensitive_fields()
