"""A small async client for Herald's /v2 API, bound to a base URL and an API key.

Every call answers ``(status, headers, json)`` so tests can assert on all three
at once; the body is ``None`` when the response has none or is not JSON.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from tests.support.daemon import Herald

Headers = CIMultiDictProxy[str]
Reply = tuple[int, Headers, Any]

TIMEOUT = aiohttp.ClientTimeout(total=30)
_UNSET: Any = object()


class Api:
    """``async with Api(base_url, key) as api: status, headers, body = await api.get(...)``.

    ``key=None`` sends no Authorization header. ``json=`` sends a JSON body;
    ``data=`` sends raw bytes or text as-is (with ``content_type``, default JSON).
    """

    def __init__(self, base_url: str, key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        self._session = aiohttp.ClientSession(timeout=TIMEOUT)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def with_key(self, key: str | None) -> Api:
        """Another client on this base URL with another key (open it with ``async with``)."""
        return Api(self.base_url, key)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = _UNSET,
        data: bytes | str | None = None,
        content_type: str = "application/json",
        params: Mapping[str, str | int] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        if self._session is None:
            raise RuntimeError("use 'async with Api(...)' first")
        sent: dict[str, str] = {}
        if self.key is not None:
            sent["Authorization"] = f"Bearer {self.key}"
        body: bytes | None = None
        if json is not _UNSET:
            body = _dumps(json)
            sent["Content-Type"] = "application/json"
        elif data is not None:
            body = data.encode() if isinstance(data, str) else data
            sent["Content-Type"] = content_type
        sent.update(headers or {})
        url = path if path.startswith("http") else self.base_url + path
        payload: bytes | io.BytesIO | None = body
        if body is not None and len(body) > 512 * 1024:
            payload = io.BytesIO(body)  # aiohttp warns about large raw bytes bodies
        async with self._session.request(
            method,
            url,
            data=payload,
            params={k: str(v) for k, v in (params or {}).items()},
            headers=sent,
            allow_redirects=False,
        ) as resp:
            raw = await resp.read()
            parsed: Any = None
            if raw:
                try:
                    parsed = _loads(raw)
                except ValueError:
                    parsed = None
            return resp.status, resp.headers, parsed

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("POST", path, **kwargs)

    async def put(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("PUT", path, **kwargs)

    async def patch(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("PATCH", path, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("DELETE", path, **kwargs)

    async def raw(self, method: str, path: str, **kwargs: Any) -> tuple[int, Headers, bytes]:
        """The response body as bytes, for comparisons that must be byte-exact."""
        if self._session is None:
            raise RuntimeError("use 'async with Api(...)' first")
        headers = dict(kwargs.pop("headers", {}) or {})
        if self.key is not None:
            headers.setdefault("Authorization", f"Bearer {self.key}")
        async with self._session.request(
            method, self.base_url + path, headers=headers, allow_redirects=False, **kwargs
        ) as resp:
            return resp.status, resp.headers, await resp.read()

    async def pages(
        self, path: str, params: Mapping[str, str | int] | None = None, *, max_pages: int = 1000
    ) -> list[dict[str, Any]]:
        """Follow ``next_cursor`` to the end; every record, each page's shape checked."""
        out: list[dict[str, Any]] = []
        query: dict[str, str | int] = dict(params or {})
        for _ in range(max_pages):
            status, _, body = await self.get(path, params=query)
            assert status == 200, body
            assert body["object"] == "list"
            out.extend(body["data"])
            if not body["has_more"]:
                assert body["next_cursor"] is None
                return out
            assert isinstance(body["next_cursor"], str)
            query["cursor"] = body["next_cursor"]
        raise AssertionError(f"more than {max_pages} pages at {path}")


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def _loads(raw: bytes) -> Any:
    return json.loads(raw)


def error_of(body: Any) -> dict[str, Any]:
    """The single error item of an error body, after checking the body's shape."""
    assert isinstance(body, dict), body
    assert set(body) == {"errors", "request_id"}, body
    assert body["request_id"].startswith("req_"), body
    errors = body["errors"]
    assert isinstance(errors, list), body
    assert len(errors) >= 1, body
    item = errors[0]
    assert isinstance(item, dict), body
    assert (
        {"type", "code", "message", "resolution"}
        <= set(item)
        <= {
            "type",
            "code",
            "message",
            "resolution",
            "field",
        }
    ), body
    for key in ("type", "code", "message", "resolution"):
        assert isinstance(item[key], str), body
        assert item[key], body
    return item


def base_url(h: Herald) -> str:
    return f"http://127.0.0.1:{h.port}"


async def create_key(h: Herald, tenant: str) -> str:
    """A new ``sk_live_`` key for ``tenant``, made as an operator does: ``herald keys create``."""
    key = (await h.acli("keys", "create", "--tenant", tenant)).stdout.strip()
    assert key.startswith("sk_live_"), key
    return key


@asynccontextmanager
async def open_api(h: Herald, tenant: str = "default") -> AsyncIterator[Api]:
    """An :class:`Api` for a new key of ``tenant`` on daemon ``h``."""
    async with Api(base_url(h), await create_key(h, tenant)) as client:
        yield client


async def eventually(
    probe: Callable[[], Awaitable[bool]], *, timeout: float = 15.0, what: str = "condition"
) -> None:
    """Poll ``probe`` every 50 ms until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_status(api: Api, dest_id: str, status: str, *, timeout: float = 15.0) -> None:
    """Wait until GET of the destination shows ``status``."""

    async def probe() -> bool:
        code, _, body = await api.get(f"/v2/event-destinations/{dest_id}")
        assert code == 200, body
        return bool(body["status"] == status)

    await eventually(probe, timeout=timeout, what=f"{dest_id} to be {status}")


async def fresh_rate_window(window: float, *, need: float) -> None:
    """Wait, if need be, until at least ``need`` seconds are left in the current rate-limit
    window. On PostgreSQL the windows are aligned on the clock (every instance counts in
    the same one), so a test that counts to the limit must not straddle two of them."""
    left = window - time.time() % window
    if left < need:
        await asyncio.sleep(left + 0.05)
