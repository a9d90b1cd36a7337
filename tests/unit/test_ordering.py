"""The bookkeeping of ordered delivery per key (herald.ordering), pure.

A model of the rule: deliveries enter ``pending`` (planned or re-queued) and end;
``heads`` decides which are claimable at entry, ending a head releases the next of its
key. Whatever the interleaving, at most one delivery of a key is claimable, and it is
always the earliest pending one of its key.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from herald.ingest import ordering_key_problem
from herald.ordering import Key, Requeued, heads, requeue_order, take


def test_heads_first_of_each_key_unless_busy() -> None:
    a, b = ("d1", "a"), ("d1", "b")
    assert heads([a, b, a, None, b, ("d2", "a")], busy={b}) == [
        True,
        False,
        False,
        True,
        False,
        True,
    ]


def test_take_numbers_only_ordered_ones_in_order() -> None:
    assert take(7, [("d", "a"), None, ("d", "b"), ("d", "a")]) == [7, None, 8, 9]


def test_requeue_order_keeps_the_first_order_and_leaves_pending_in_place() -> None:
    k = ("d", "k")
    rows = [
        Requeued("dlv_3", k, 30, False),
        Requeued("dlv_1", k, 10, False),
        Requeued("dlv_2", k, 20, True),  # still pending: keeps its place
        Requeued("dlv_0", k, None, False),  # planned unordered: after the ordered ones
        Requeued("dlv_9", None, 5, False),  # its destination is not ordered now
    ]
    assert [r.id for r in requeue_order(rows)] == ["dlv_1", "dlv_3", "dlv_0"]


def test_ordering_key_rules() -> None:
    assert ordering_key_problem("order-42") is None
    assert ordering_key_problem("k" * 255) is None
    assert ordering_key_problem("") is not None
    assert ordering_key_problem("k" * 256) is not None
    assert ordering_key_problem("a\nb") is not None
    assert ordering_key_problem("a\u202eb") is not None  # a format character


class Model:
    """The store's rule in memory: pending deliveries by key with their order_seq,
    which of them are claimable (held = 0), and the counter."""

    def __init__(self) -> None:
        self.next_seq = 1
        self.pending: dict[int, tuple[Key, int, bool]] = {}  # id -> (key, seq, claimable)
        self.ended: list[tuple[Key, int]] = []

    def busy(self) -> set[Key]:
        return {key for key, _, _ in self.pending.values()}

    def enter(self, ids: list[int], keys: list[Key]) -> None:
        seqs = take(self.next_seq, keys)
        self.next_seq += len(keys)
        for i, key, seq, head in zip(ids, keys, seqs, heads(keys, self.busy()), strict=True):
            assert seq is not None
            self.pending[i] = (key, seq, head)

    def end(self, i: int) -> None:
        key, seq, claimable = self.pending.pop(i)
        assert claimable, "only a claimable delivery is attempted and ends"
        self.ended.append((key, seq))
        rest = [(s, j) for j, (k, s, _) in self.pending.items() if k == key]
        if rest:
            _, nxt = min(rest)
            k, s, _ = self.pending[nxt]
            self.pending[nxt] = (k, s, True)

    def check(self) -> None:
        by_key: dict[Key, list[tuple[int, bool]]] = {}
        for key, seq, ok in self.pending.values():
            by_key.setdefault(key, []).append((seq, ok))
        for entries in by_key.values():
            claimable = [seq for seq, c in entries if c]
            assert len(claimable) == 1, entries
            assert claimable[0] == min(seq for seq, _ in entries)


keys_st = st.sampled_from([("d1", "a"), ("d1", "b"), ("d2", "a")])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("enter"), st.lists(keys_st, min_size=1, max_size=6)),
            st.tuples(st.just("end"), st.integers(min_value=0, max_value=50)),
        ),
        max_size=40,
    )
)
def test_one_claimable_per_key_and_it_is_the_earliest(ops: list[tuple[str, object]]) -> None:
    m = Model()
    next_id = 0
    for op, arg in ops:
        if op == "enter":
            assert isinstance(arg, list)
            ids = list(range(next_id, next_id + len(arg)))
            next_id += len(arg)
            m.enter(ids, arg)
        else:
            claimable = sorted(i for i, (_, _, c) in m.pending.items() if c)
            if claimable:
                assert isinstance(arg, int)
                m.end(claimable[arg % len(claimable)])
        m.check()
    # Ended deliveries of one key ended in their order.
    last: dict[Key, int] = {}
    for key, seq in m.ended:
        assert seq > last.get(key, 0)
        last[key] = seq
