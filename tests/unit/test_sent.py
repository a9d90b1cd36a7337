"""What an attempt's record keeps of its HTTP exchange, and the delivery page's curl."""

from __future__ import annotations

import shlex

from herald.adapters.base import MASK, note_exchange, noting_exchange
from herald.adapters.httpdelivery import KEPT_HEADER_CHARS, KEPT_VALUE_CHARS, kept_headers
from herald.console.sent import curl_command
from herald.model import Attempt, AttemptRecord, DeliveryStatus, Exchange, Outcome
from herald.store.rows import attempt_from_row, attempt_to_row
from herald.wire import decode_record, encode_record


def test_credentials_are_masked_and_values_cut() -> None:
    kept, omitted = kept_headers(
        [("Authorization", "Bearer x"), ("X-Long", "v" * 1000), ("webhook-id", "evt_1")],
        {"authorization"},
    )
    assert kept[0] == ("Authorization", MASK)
    assert len(kept[1][1]) == KEPT_VALUE_CHARS
    assert kept[1][1].endswith("…")
    assert kept[2] == ("webhook-id", "evt_1")
    assert omitted == 0


def test_a_long_credential_name_is_masked_before_it_is_cut() -> None:
    long = "X-" + "a" * 100
    kept, _ = kept_headers([(long, "secret")], {long.lower()})
    assert kept == ((long[:64], MASK),)


def test_response_headers_are_bounded_in_count_and_size() -> None:
    many = [(f"X-H{i}", "v") for i in range(100)]
    kept, omitted = kept_headers(many, set(), limit=32)
    assert len(kept) == 32
    assert omitted == 68
    big = [(f"X-H{i}", "v" * KEPT_VALUE_CHARS) for i in range(30)]
    kept, omitted = kept_headers(big, set(), limit=32)
    assert sum(len(n) + len(v) for n, v in kept) <= KEPT_HEADER_CHARS
    assert len(kept) + omitted == 30
    assert omitted > 0


def test_an_exchange_is_noted_only_inside_an_attempt() -> None:
    ex = Exchange("POST", "https://r.example/h", (("a", "b"),))
    note_exchange(ex)  # outside: nothing to note into, no error
    with noting_exchange() as noted:
        note_exchange(ex)
        note_exchange(Exchange("POST", "https://r.example/h", (), (("c", "d"),)))
    assert len(noted) == 1
    assert noted[0].response_headers == (("c", "d"),)


def test_an_attempt_round_trips_with_its_exchange() -> None:
    ex = Exchange("POST", "https://r.example/h", (("a", "b"),), None, 0)
    a = Attempt("att_1", "dlv_1", 1, 1.0, 2.0, Outcome.TIMEOUT, exchange=ex)
    assert attempt_from_row(attempt_to_row(a)) == a
    without = Attempt("att_2", "dlv_1", 2, 1.0, 2.0, Outcome.SUCCESS, 204)
    assert attempt_from_row(attempt_to_row(without)) == without


def test_curl_quotes_every_part_and_keeps_the_body_byte_for_byte() -> None:
    body = b'{"data":{"s":"it\'s $HOME `x`"}}'
    text = curl_command(
        "POST",
        "https://r.example/h?a=1&b=2",
        [("Host", "r.example"), ("Content-Length", "9"), ("webhook-id", "evt_1")],
        body,
    )
    words = shlex.split(text.replace("\\\n", ""))
    assert words[:4] == ["curl", "-X", "POST", "https://r.example/h?a=1&b=2"]
    assert words[4:6] == ["-H", "webhook-id: evt_1"]  # Host and Content-Length: curl's own
    assert words[6:] == ["--data-binary", body.decode()]


def test_an_exchange_crosses_the_worker_pipe() -> None:
    """Attempt processes send records back over a pipe: what was sent goes with them."""
    ex = Exchange("POST", "https://r.example/h", (("webhook-id", "evt_1"),), (("a", "b"),), 2)
    a = Attempt("att_1", "dlv_1", 1, 1.0, 2.0, Outcome.SUCCESS, 200, exchange=ex)
    record = AttemptRecord(a, DeliveryStatus.SUCCESS, None)
    _, back, _ = decode_record(encode_record(record, "webhook"))
    # It crosses as the column's text and is written as it came, never parsed on the way.
    assert back.attempt.exchange == ex.to_json()
    assert back.attempt.exchange_parsed() == ex
    assert attempt_to_row(back.attempt) == attempt_to_row(a)
    assert attempt_from_row(attempt_to_row(back.attempt)) == a
