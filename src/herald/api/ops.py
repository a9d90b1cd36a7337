"""Ops endpoints without auth: ``/healthz`` (alive), ``/readyz`` (able to work), ``/metrics``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from herald.errors import HeraldError
from herald.metrics import CONTENT_TYPE, Metrics

ReadinessCheck = Callable[[], Awaitable[dict[str, str]]]
"""Returns the components that are not ready, each with why; empty when ready."""


def add_routes(
    app: web.Application, *, readiness: ReadinessCheck, metrics: Metrics, scrape: bool = True
) -> None:
    """/healthz, /readyz and, unless ``scrape`` is False (metrics.listen serves it
    elsewhere), /metrics."""

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        try:
            problems = await readiness()
        except HeraldError as exc:
            problems = {"herald": exc.message}
        if problems:
            return web.json_response({"status": "unready", "problems": problems}, status=503)
        return web.json_response({"status": "ready"})

    async def exposition(request: web.Request) -> web.Response:
        response = web.Response(body=metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if scrape:
        app.router.add_get("/metrics", exposition)
