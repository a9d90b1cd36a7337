"""Tests for herald.ids."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from herald import ids
from herald.ids import ALPHABET, id_timestamp, is_valid_id, new_id

CROCKFORD_UPPER = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def reference_encode(value: int) -> str:
    """Independent, slow base32 encoding of a 128-bit value into 26 characters."""
    chars = []
    for _ in range(26):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    assert value == 0
    return "".join(reversed(chars))


def reference_decode(body: str) -> int:
    value = 0
    for ch in body:
        value = value * 32 + ALPHABET.index(ch)
    return value


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget earlier ids so a test can control the clock from scratch."""
    monkeypatch.setattr(ids, "_last_ms", -1)
    monkeypatch.setattr(ids, "_last_rand", 0)
    monkeypatch.setattr(ids, "_last_time_text", "")


def fake_clock(monkeypatch: pytest.MonkeyPatch, millis: list[int]) -> None:
    """Make new_id see the given sequence of millisecond readings."""
    readings: Iterator[int] = iter(millis)
    monkeypatch.setattr(ids, "time", SimpleNamespace(time_ns=lambda: next(readings) * 1_000_000))


def fake_random(monkeypatch: pytest.MonkeyPatch, chunks: list[bytes]) -> None:
    """Make each read of randomness give the next chunk (of 10 bytes: one id's)."""
    supply = iter(chunks)

    def urandom(n: int) -> bytes:
        return next(supply)

    monkeypatch.setattr(ids, "os", SimpleNamespace(urandom=urandom))
    monkeypatch.setattr(ids, "_pool", b"")
    monkeypatch.setattr(ids, "_pool_at", 0)


def test_alphabet_is_lowercase_crockford() -> None:
    assert CROCKFORD_UPPER.lower() == ALPHABET
    assert len(set(ALPHABET)) == 32
    assert not set("ilou") & set(ALPHABET)


def test_shape_and_prefix() -> None:
    value = new_id("evt_")
    assert value.startswith("evt_")
    assert len(value) == 4 + 26
    assert set(value[4:]) <= set(ALPHABET)
    assert is_valid_id(value, "evt_")
    assert new_id("")[0] <= "7"


def test_timestamp_roundtrip_against_wall_clock() -> None:
    before = time.time()
    value = new_id("sub_")
    after = time.time()
    ts = id_timestamp(value, "sub_")
    # Millisecond truncation may put the id up to 1 ms before `before`.
    assert before - 0.001 <= ts <= after


@pytest.mark.usefixtures("fresh_state")
def test_layout_matches_reference_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    ms = 1_795_307_518_028
    rand = bytes(range(1, 11))
    fake_clock(monkeypatch, [ms])
    fake_random(monkeypatch, [rand])
    value = new_id("x_")
    expected = reference_encode(ms << 80 | int.from_bytes(rand, "big"))
    assert value == "x_" + expected
    assert id_timestamp(value, "x_") == ms / 1000


@pytest.mark.usefixtures("fresh_state")
@pytest.mark.parametrize(
    ("ms", "rand"),
    [
        (0, bytes(10)),
        ((1 << 48) - 1, b"\xff" * 9 + b"\xfe"),
        (1, b"\x80" + bytes(9)),
        (0x7FFF_FFFF_FFFF, b"\x00\xff" * 5),
    ],
)
def test_layout_extremes(monkeypatch: pytest.MonkeyPatch, ms: int, rand: bytes) -> None:
    fake_clock(monkeypatch, [ms])
    fake_random(monkeypatch, [rand])
    value = new_id("")
    assert value == reference_encode(ms << 80 | int.from_bytes(rand, "big"))
    assert is_valid_id(value, "")
    assert id_timestamp(value, "") == ms / 1000


def test_many_ids_sort_in_creation_order() -> None:
    values = [new_id("evt_") for _ in range(20_000)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)


@pytest.mark.usefixtures("fresh_state")
def test_same_millisecond_increments_random_part(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, [5_000, 5_000, 5_000])
    fake_random(monkeypatch, [b"\x00" * 9 + b"\x10"])
    a, b, c = (new_id("e_") for _ in range(3))
    assert a < b < c
    ra, rb, rc = (reference_decode(v[2:]) & ((1 << 80) - 1) for v in (a, b, c))
    assert (rb - ra, rc - rb) == (1, 1)
    assert {id_timestamp(v, "e_") for v in (a, b, c)} == {5.0}


@pytest.mark.usefixtures("fresh_state")
def test_increment_carries_across_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, [7, 7])
    fake_random(monkeypatch, [b"\x00" * 8 + b"\x03\xff"])
    a, b = new_id(""), new_id("")
    assert a.endswith("0zz")
    assert b.endswith("100")
    assert a < b


@pytest.mark.usefixtures("fresh_state")
def test_clock_going_backwards_keeps_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, [10_000, 9_000, 9_500, 10_001])
    fake_random(monkeypatch, [bytes(10), b"\x00" * 9 + b"\x05"])
    values = [new_id("e_") for _ in range(4)]
    assert values == sorted(values)
    assert len(set(values)) == 4
    # The stalled ids keep the last seen timestamp instead of going back in time.
    assert [id_timestamp(v, "e_") for v in values] == [10.0, 10.0, 10.0, 10.001]


@pytest.mark.usefixtures("fresh_state")
def test_random_overflow_moves_to_next_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, [42, 42, 42])
    fake_random(monkeypatch, [b"\xff" * 10, bytes(10)])
    a, b, c = (new_id("") for _ in range(3))
    assert a < b < c
    assert id_timestamp(a, "") == 0.042
    assert id_timestamp(b, "") == 0.043
    # The borrowed millisecond stays in use while the clock lags behind it.
    assert id_timestamp(c, "") == 0.043


@pytest.mark.usefixtures("fresh_state")
def test_timestamp_beyond_48_bits_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, [1 << 48])
    fake_random(monkeypatch, [bytes(10)])
    with pytest.raises(OverflowError):
        new_id("")


@pytest.mark.parametrize(
    ("value", "prefix", "valid"),
    [
        ("evt_01m80ape1p8n1dtdw2d1maaqkq", "evt_", True),
        ("evt_7zzzzzzzzzzzzzzzzzzzzzzzzz", "evt_", True),
        ("evt_00000000000000000000000000", "evt_", True),
        ("evt_8zzzzzzzzzzzzzzzzzzzzzzzzz", "evt_", False),
        ("evt_01M80APE1P8N1DTDW2D1MAAQKQ", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqk", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqkqq", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqki", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqkl", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqko", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqku", "evt_", False),
        ("evt_01m80ape1p8n1dtdw2d1maaqk-", "evt_", False),
        ("sub_01m80ape1p8n1dtdw2d1maaqkq", "evt_", False),
        ("evt01m80ape1p8n1dtdw2d1maaqkqx", "evt_", False),
        ("", "evt_", False),
        ("01m80ape1p8n1dtdw2d1maaqkq", "", True),
    ],
)
def test_is_valid_id(value: str, prefix: str, valid: bool) -> None:
    assert is_valid_id(value, prefix) is valid


@pytest.mark.parametrize("value", ["evt_", "evt_8zzzzzzzzzzzzzzzzzzzzzzzzz", "sub_" + "0" * 26])
def test_id_timestamp_rejects_malformed(value: str) -> None:
    with pytest.raises(ValueError, match="not a valid 'evt_' id"):
        id_timestamp(value, "evt_")


def test_id_timestamp_of_known_value() -> None:
    # 10 characters of time: "01m80ape1p" decoded by hand with the reference decoder.
    body = "01m80ape1p8n1dtdw2d1maaqkq"
    assert id_timestamp("evt_" + body, "evt_") == (reference_decode(body) >> 80) / 1000


def test_ids_from_several_threads_are_all_distinct_and_each_threads_increase() -> None:
    """The relay plans in SQLite's writer thread while the event loop makes ids too."""
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        for _ in range(5000):
            out.append(new_id("dlv_"))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every)
    for out in made:
        assert out == sorted(out)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_never_repeats_its_parents_ids() -> None:
    """Randomness is read ahead: a child must not take what its parent will."""
    new_id("x_")  # the parent has randomness read ahead, and a last id
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, " ".join(new_id("x_") for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    mine = {new_id("x_")[-16:] for _ in range(50)}
    with os.fdopen(read, "rb") as pipe:
        theirs = {i[-16:] for i in pipe.read().decode().split()}
    os.waitpid(pid, 0)
    assert len(theirs) == 50
    assert not mine & theirs
