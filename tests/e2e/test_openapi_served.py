"""``/v2/openapi.json`` is served from bytes built once, with an ETag, and counted
against the per-address limit of requests without a key (issue 31, item 4): it is
96 KB that needs no key, and rebuilding it for every request let a few clients
take the CPU the deliveries need."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.conftest import HeraldFactory
from tests.e2e.test_api import DOCS_OPENAPI
from tests.support.api import Api, base_url, error_of

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

PATH = "/v2/openapi.json"


async def test_the_document_has_a_stable_etag_and_a_match_is_304(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(start=False)
    await h.astart()
    async with Api(base_url(h), None) as anonymous:
        status, headers, served = await anonymous.get(PATH)
        assert status == 200
        assert served == json.loads(DOCS_OPENAPI.read_text())
        etag = headers["ETag"]
        assert re.fullmatch(r'"[0-9a-f]{16,}"', etag), etag  # a strong validator
        status, again, _ = await anonymous.get(PATH)
        assert (status, again["ETag"]) == (200, etag)

        for asked in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            status, headers, body = await anonymous.get(PATH, headers={"If-None-Match": asked})
            assert (status, body) == (304, None), asked
            assert headers["ETag"] == etag
        status, _, body = await anonymous.get(PATH, headers={"If-None-Match": '"other"'})
        assert status == 200
        assert body == served


async def test_the_document_counts_against_the_address_s_limit_without_a_key(
    herald_factory: HeraldFactory,
) -> None:
    """Like any /v2 request without a valid key: past the address's budget, 429 with
    Retry-After, a revalidation (304) included; a 401 counts against the same budget."""
    h = herald_factory(
        {"api": {"unauthenticated_rate_limit_requests": 3, "rate_limit_window_seconds": 30}},
        start=False,
    )
    await h.astart()  # the per-address count is in memory: a window starts at its first
    async with Api(base_url(h), None) as anonymous:
        status, headers, _ = await anonymous.get(PATH)
        assert status == 200
        status, _, _ = await anonymous.get(PATH, headers={"If-None-Match": headers["ETag"]})
        assert status == 304
        assert (await anonymous.get("/v2/event-destinations"))[0] == 401
        status, headers, body = await anonymous.get(PATH)
        assert status == 429, body
        assert error_of(body)["code"] == "rate_limit_exceeded"
        assert 1 <= int(headers["Retry-After"]) <= 30
