"""Pagination cursors: signed, bound to an endpoint and its filters, and handed out
in the scope they are taken back in (``Pages``)."""

from __future__ import annotations

import pytest

from herald.api.cursor import CursorCodec
from herald.errors import BadRequest

SCOPE = {"tenant": "acme", "status": "failure"}


def test_the_first_page_starts_nowhere_and_its_cursor_leads_to_the_next() -> None:
    codec = CursorCodec(b"k" * 32)
    first = codec.pages(None, endpoint="deliveries:evtd_1", filters=SCOPE)
    assert first.after is None
    cursor = first.cursor("dlv_0042")
    second = codec.pages(cursor, endpoint="deliveries:evtd_1", filters=dict(SCOPE))
    assert second.after == "dlv_0042"


@pytest.mark.parametrize(
    ("endpoint", "filters"),
    [
        ("deliveries:evtd_2", SCOPE),  # another destination's list
        ("deliveries:evtd_1", {**SCOPE, "status": "success"}),  # other filters
        ("deliveries:evtd_1", {**SCOPE, "tenant": "globex"}),  # another tenant
    ],
)
def test_a_cursor_is_refused_outside_its_scope(endpoint: str, filters: dict[str, str]) -> None:
    codec = CursorCodec(b"k" * 32)
    cursor = codec.pages(None, endpoint="deliveries:evtd_1", filters=SCOPE).cursor("dlv_0042")
    with pytest.raises(BadRequest) as caught:
        codec.pages(cursor, endpoint=endpoint, filters=filters)
    assert caught.value.code == "cursor_invalid"


def test_a_tampered_or_foreign_cursor_is_refused() -> None:
    codec = CursorCodec(b"k" * 32)
    cursor = codec.pages(None, endpoint="replays", filters={"tenant": "acme"}).cursor("rpl_1")
    other = CursorCodec(b"o" * 32)  # another instance's key
    for bad in (cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1], "%%%", ""):
        with pytest.raises(BadRequest):
            codec.pages(bad, endpoint="replays", filters={"tenant": "acme"})
    with pytest.raises(BadRequest):
        other.pages(cursor, endpoint="replays", filters={"tenant": "acme"})
