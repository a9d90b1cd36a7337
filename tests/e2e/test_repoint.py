"""A destination re-pointed at a new target, through the API, the console and the
portal, against `herald run`: its stored credentials never reach the new target
(docs/security.md, "A new target gets no old credential"). Receivers record the
headers of the verification ping that reaches them."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from standardwebhooks.webhooks import Webhook

from tests.e2e.conftest import SECRET
from tests.support.api import Api, base_url, eventually, wait_status
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DESTS = "/v2/event-destinations"
MASK = "********"
TOKEN = "Bearer for-the-old-target-only"
HEADERS = json.dumps({"Authorization": TOKEN})


async def webhook(api: Api, url: str) -> dict[str, Any]:
    """An active webhook with a signing secret and an ``Authorization`` header."""
    body = {
        "name": "hook",
        "type": "webhook",
        "events": ["*"],
        "webhook": {"url": url, "secret": SECRET, "custom_headers": HEADERS},
    }
    status, _, dest = await api.post(DESTS, json=body)
    assert status == 201, dest
    await wait_status(api, dest["id"], "active")
    return dest  # type: ignore[no-any-return]


async def ping(rx: Receiver) -> dict[str, str]:
    """The headers of the verification ping ``rx`` got, once it got one."""

    async def arrived() -> bool:
        return any(r.type == "destination.verification" for r in rx.received)

    await eventually(arrived, what="the verification ping at the new target")
    [got] = [r for r in rx.received if r.type == "destination.verification"]
    assert not got.verified  # no signature the old secret makes
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(SECRET).verify(got.body, got.headers)
    return got.headers


async def test_a_patch_of_the_url_alone_is_refused_and_the_ping_carries_no_old_credential(
    api: Api,
) -> None:
    old = await Receiver(secrets=[SECRET]).start()
    new = await Receiver(secrets=[SECRET]).start()
    try:
        dest = await webhook(api, old.url)
        path = f"{DESTS}/{dest['id']}"
        for sent in ({"url": new.url}, {"url": new.url, "custom_headers": MASK}):
            status, _, body = await api.patch(path, json={"webhook": sent})
            assert status == 422, body
            assert body["errors"] == [
                {
                    "type": body["errors"][0]["type"],
                    "code": "credentials_required",
                    "field": "webhook.custom_headers",
                    "message": body["errors"][0]["message"],
                    "resolution": body["errors"][0]["resolution"],
                }
            ]
        status, _, same = await api.get(path)
        assert (same["webhook"]["url"], same["status"]) == (old.url, "active")

        status, _, moved = await api.patch(
            path, json={"webhook": {"url": new.url, "custom_headers": None}}
        )
        assert status == 200, moved
        assert moved["status"] == "pending_verification"
        assert moved["webhook"] == {"url": new.url, "secret": MASK}  # a fresh one
        headers = await ping(new)
        assert "authorization" not in headers
        assert TOKEN not in json.dumps(headers)
    finally:
        await old.stop()
        await new.stop()


async def test_every_credential_of_a_new_target_is_named_in_one_answer(api: Api) -> None:
    body = {
        "name": "queue",
        "type": "aws_sqs",
        "events": ["*"],
        "aws_sqs": {
            "queue_url": "https://sqs.eu-west-1.amazonaws.com/000000000000/orders",
            "key": "AKIAOLD",
            "secret": "old-secret",
            "session": "old-session",
        },
    }
    status, _, dest = await api.post(DESTS, json=body)
    assert status == 201, dest
    moved = {"queue_url": "https://sqs.eu-west-1.amazonaws.com/000000000000/elsewhere"}
    status, _, answer = await api.patch(f"{DESTS}/{dest['id']}", json={"aws_sqs": moved})
    assert status == 422, answer
    assert [(e["code"], e["field"]) for e in answer["errors"]] == [
        ("credentials_required", "aws_sqs.key"),
        ("credentials_required", "aws_sqs.secret"),
        ("credentials_required", "aws_sqs.session"),
    ]


async def test_an_empty_patch_changes_nothing_not_even_updated_at(api: Api) -> None:
    status, _, dest = await api.post(
        DESTS,
        json={
            "name": "n",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": "http://127.0.0.1:9/hook"},
        },
    )
    assert status == 201, dest
    bodies: list[dict[str, Any]] = [{}, {"name": "n"}, {"webhook": {}}]
    for body in bodies:
        status, _, same = await api.patch(f"{DESTS}/{dest['id']}", json=body)
        assert status == 200, same
        assert same["updated_at"] == dest["updated_at"], body


# --- the console's and the portal's edit form ----------------------------------------
@asynccontextmanager
async def browser_less(herald: Herald) -> AsyncIterator[aiohttp.ClientSession]:
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1
    async with aiohttp.ClientSession(base_url(herald), cookie_jar=jar) as session:
        yield session


@asynccontextmanager
async def operator(herald: Herald) -> AsyncIterator[aiohttp.ClientSession]:
    """A console session of a new operator key."""
    key = (await herald.acli("keys", "create", "--operator")).stdout.strip()
    async with browser_less(herald) as session:
        async with session.get("/console/login") as resp:
            login = {"csrf_token": csrf(await resp.text()), "key": key}
        async with session.post("/console/login", data=login, allow_redirects=False) as resp:
            assert resp.status == 303
        yield session


def csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


async def edit(
    session: aiohttp.ClientSession, page_path: str, fields: dict[str, str]
) -> tuple[int, str]:
    """Post the destination page's edit form with ``fields`` (the others as shown)."""
    async with session.get(page_path) as resp:
        assert resp.status == 200
        page = await resp.text()
    form = {"csrf_token": csrf(page), "name": "hook", "events": "*", **fields}
    async with session.post(f"{page_path}/edit", data=form, allow_redirects=False) as resp:
        return resp.status, await resp.text()


async def repoint_through_the_form(
    session: aiohttp.ClientSession, page_path: str, old: Receiver, new: Receiver
) -> None:
    # The form as shown: the header's row with its value masked, the secret masked.
    shown = {
        "config.custom_headers.0.name": "Authorization",
        "config.custom_headers.0.value": MASK,
        "config.secret": MASK,
    }
    status, page = await edit(session, page_path, {"config.url": new.url, **shown})
    assert status == 422, page
    # Beside its rows, whose value is emptied for the credential to be typed again.
    assert re.search(r'name="config.custom_headers.0.value" value=""', page), page
    assert 'aria-errormessage="e-config-custom-headers-error"' in page
    assert "must be given again" in page
    assert old.url in page  # nothing changed: the stored URL is still shown above the form

    # Its row emptied: the header dropped.
    dropped = {"config.custom_headers.0.name": "", "config.custom_headers.0.value": ""}
    status, _ = await edit(session, page_path, {"config.url": new.url, **dropped})
    assert status == 303
    headers = await ping(new)
    assert "authorization" not in headers


async def test_the_consoles_edit_form_re_points_without_the_old_credentials(
    herald: Herald, api: Api
) -> None:
    old = await Receiver(secrets=[SECRET]).start()
    new = await Receiver(secrets=[SECRET]).start()
    try:
        dest = await webhook(api, old.url)
        async with operator(herald) as session:
            await repoint_through_the_form(session, f"/console/destinations/{dest['id']}", old, new)
    finally:
        await old.stop()
        await new.stop()


async def test_the_portals_edit_form_re_points_without_the_old_credentials(
    herald: Herald, api: Api
) -> None:
    old = await Receiver(secrets=[SECRET]).start()
    new = await Receiver(secrets=[SECRET]).start()
    try:
        dest = await webhook(api, old.url)  # the api fixture's tenant: acme
        token = await asyncio.to_thread(herald.portal_token, "acme")
        async with browser_less(herald) as session:
            async with session.get(f"/portal/?token={token}", allow_redirects=False) as resp:
                assert resp.status == 303
            await repoint_through_the_form(session, f"/portal/destinations/{dest['id']}", old, new)
    finally:
        await old.stop()
        await new.stop()


async def test_a_spoofing_name_is_refused_and_a_spoofing_id_is_rejected_and_isolated(
    herald: Herald, api: Api
) -> None:
    """``bidi\u202egnp.exe`` shows as ``bidiexe.png``: refused as a name, rejected as an
    event id, and shown isolated (``<bdi>``) on the console's rejected rows."""
    spoof = "bidi\u202egnp.exe"
    body = {"name": spoof, "type": "webhook", "events": ["*"], "webhook": {"url": "http://x"}}
    status, _, answer = await api.post(DESTS, json=body)
    assert status == 422, answer
    assert (answer["errors"][0]["code"], answer["errors"][0]["field"]) == ("name_invalid", "name")

    await asyncio.to_thread(herald.insert_events, [(f"evt_{spoof}", "acme", "a.b", "{}")])

    async def rejected() -> bool:
        rows = await asyncio.to_thread(herald.query, "SELECT id FROM herald_outbox_rejected")
        return rows == [(f"evt_{spoof}",)]

    await eventually(rejected, what="the row's rejection")
    async with operator(herald) as session, session.get("/console/outbox/rejected") as resp:
        page = await resp.text()
    assert f"<bdi>evt_{spoof}</bdi>" in page
    assert "format character" in page
