"""The console's pure parts of the overview and the events list: relative times, the
time format of every page, a chart's time axis and values, the events list's filter
and page cursor."""

from __future__ import annotations

import jinja2
import pytest

from herald.console import charts
from herald.console.filters import event_filter, events_cursor
from herald.console.pages import relative, when
from herald.console.scope import Scope
from herald.store.recent import EventsPage, EventSummary

NOW = 1_795_831_200.0


@pytest.mark.parametrize(
    ("offset", "text"),
    [
        (0.4, "just now"),
        (25, "in 25 s"),
        (-25, "25 s ago"),
        (-180, "3 min ago"),
        (300, "in 5 min"),
        (-7200, "2 h ago"),
        (-7500, "2 h 5 min ago"),
        (-86_400, "2026-11-27 02:00 UTC"),
    ],
)
def test_near_times_read_relative_and_far_ones_absolute(offset: float, text: str) -> None:
    assert relative(NOW + offset, NOW) == text


def test_every_time_is_one_time_element_with_its_exact_utc_time_on_hover() -> None:
    env = jinja2.Environment(autoescape=True)
    env.filters["when"] = when
    template = env.from_string("{{ t|when }}")
    shown = template.render(t="2026-11-28T01:59:00Z", now=NOW)
    assert shown == (
        '<time datetime="2026-11-28T01:59:00.000000Z" title="2026-11-28T01:59:00.000000Z">'
        "1 min ago</time>"
    )
    assert template.render(t=NOW + 25, now=NOW).endswith(">in 25 s</time>")
    assert template.render(t=None, now=NOW) == "–"
    # Not a time (a raw field): shown as text, escaped.
    assert template.render(t="<b>soon</b>", now=NOW) == "&lt;b&gt;soon&lt;/b&gt;"


def test_a_chart_has_a_time_axis_and_its_values_as_text() -> None:
    now = 600 * 60 + 30
    counts = [("success", 600, 3), ("failure", 600, 1), ("failure", 590, 2)]
    chart = charts.bar_chart(counts, now=now, bucket_seconds=60, buckets=60, label="x")
    assert chart.ticks == ["1 h ago", "45 min ago", "30 min ago", "15 min ago", "now"]
    assert chart.rows == [("this bucket", 3, 1), ("10 min ago", 0, 2)]
    day = charts.bar_chart([], now=now, bucket_seconds=3600, buckets=24, label="x")
    assert day.ticks == ["24 h ago", "18 h ago", "12 h ago", "6 h ago", "now"]
    assert day.rows == []


OPERATOR = Scope(tenant_id=None, by="console:k", who="k", csrf="", session="")
TENANT = Scope(tenant_id="acme", by="portal:acme", who="acme", csrf="", session="")


def test_the_events_filter_reads_type_tenant_time_and_cursor() -> None:
    last = EventSummary("evt_/ünï", "acme", "a.b", "2026-11-27T22:39:00Z", NOW + 0.5)
    given = {
        "type": " a.b ",
        "tenant": "globex",
        "range": "1h",
        "until": "2026-11-28T00:00:00Z",
        "cursor": events_cursor(last),
    }
    filters, errors, flt = event_filter(given, OPERATOR, now=NOW)
    assert errors == {}
    assert flt is not None
    assert (flt.tenant_id, flt.type, flt.since) == ("globex", "a.b", NOW - 3600)
    assert flt.until is not None
    assert flt.after == EventsPage(NOW + 0.5, "evt_/ünï", "acme")
    assert filters["type"] == "a.b"
    # A portal session's tenant is its own, whatever the query asks.
    _, _, flt = event_filter({"tenant": "globex"}, TENANT, now=NOW)
    assert flt is not None
    assert flt.tenant_id == "acme"


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"cursor": "not base64 json"}, "cursor"),
        ({"cursor": events_cursor(EventSummary("e", "t", "a.b", "", 1.0))[:-3]}, "cursor"),
        ({"since": "yesterday"}, "since"),
        ({"range": "3w"}, "range"),
    ],
)
def test_a_bad_events_filter_names_its_field(given: dict[str, str], field: str) -> None:
    _, errors, flt = event_filter(given, OPERATOR, now=NOW)
    assert flt is None
    assert list(errors) == [field]
