"""The replay pages: the replays (newest first, with their outcome) and the form to
start one, its dry run (the count and a sample of what it would re-queue) with the
``Replay`` button, and one replay's page, which follows its progress and then its
outcome, refreshing itself until nothing of it is pending.

Starting a replay only stores it and hands it to the daemon's
:class:`~herald.replayer.Replayer`: the request answers at once, however many
deliveries it re-queues. The service logs the audit line (``replay``, ``by=…``) as
it does for the CLI and the API."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from herald.console import forms
from herald.console.filters import FILTER_FIELDS, RANGES, delivery_filter, query_of
from herald.console.pages import PAGE_SIZE, Pages, base, redirect, render
from herald.console.scope import FORM
from herald.errors import HeraldError
from herald.model import DeliveryStatus, Replay
from herald.replayer import Replayer
from herald.service import Operations
from herald.views import replay_view

SAMPLE_SIZE = 10
"""The dry run shows this many of the deliveries a replay would re-queue."""
REFRESH_SECONDS = 2
"""A replay's page reloads itself this often while anything of it is pending."""


def made_by(by: str, tenant_id: str | None) -> str:
    """Who made a replay, as a page of ``tenant_id``'s portal says it: the tenant's own
    portal session or API key, or else "the operator" (never ``cli:<user>`` nor
    ``console:<key id>``: no operator identity is shown to a tenant). An operator
    (``tenant_id`` None) reads the audit actor itself."""
    if tenant_id is None:
        return by
    if by == f"portal:{tenant_id}":
        return "you, in this portal"
    if by == f"api:{tenant_id}":
        return "your API key"
    return "the operator"


def progress_view(replay: Replay, *, running: bool, tenant_id: str | None) -> dict[str, Any]:
    """A replay as its pages show it: the API's view, with where it stands in words
    (``re-queuing``, ``cut short``, ``interrupted``, ``delivering``, ``done``), how far
    its re-queue got, in percent, and who made it as ``tenant_id``'s scope may read."""
    view = replay_view(replay)
    view["by"] = made_by(replay.by, tenant_id)
    if replay.finished_at is None:
        # Not finished and not running here: its process died, or (PostgreSQL) another
        # instance runs it.
        state = "re-queuing" if running else "interrupted"
    elif replay.cut_short:
        state = "cut short"
    elif replay.outcome.pending:
        state = "delivering"
    else:
        state = "done"
    percent = 100 if not replay.matched else min(100, 100 * replay.requeued // replay.matched)
    return {**view, "state": state, "percent": percent, "running": running}


class ReplayPages(Pages):
    """``/replays``, ``/replays/new`` (the dry run) and ``/replays/{id}``."""

    def __init__(
        self,
        service: Operations,
        *,
        replayer: Replayer,
    ) -> None:
        super().__init__(service)
        self.replayer = replayer

    def _form_context(self) -> dict[str, Any]:
        return {"statuses": [s.value for s in DeliveryStatus], "ranges": list(RANGES)}

    async def list(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        scope = self.scope(request)
        # The replay form starts empty but for what a link carried; the list is the
        # scope's replays (an operator's: every tenant's, or the tenant asked for).
        filters = {k: q.get(k, "").strip() for k in FILTER_FIELDS}
        found, more = await self.service.replays.page(
            scope.tenant(filters["tenant"]), before_id=q.get("cursor") or None, limit=PAGE_SIZE
        )
        running = set(self.replayer.running)
        items = [
            progress_view(r, running=r.id in running, tenant_id=scope.tenant_id) for r in found
        ]
        names = await self._filter_names(scope.tenant_id, found)
        return self.list_page(
            request,
            "replays",
            {"tenant": filters["tenant"]},
            {},
            items,
            more,
            form=filters,
            names=names,
            **self._form_context(),
        )

    async def preview(self, request: web.Request) -> web.StreamResponse:
        """The dry run of the filters asked: how many, a sample, and the confirmation."""
        return await self._preview(request, dict(request.query))

    async def _preview(
        self, request: web.Request, given: dict[str, str], *, error: str | None = None
    ) -> web.Response:
        filters, errors, flt = delivery_filter(given, self.scope(request))
        matched: int | None = None
        sample: list[dict[str, Any]] = []
        if flt is not None:
            try:
                result = await self.service.replays.run(
                    flt, dry_run=True, by=self.scope(request).by, sample_size=SAMPLE_SIZE
                )
            except HeraldError as exc:
                errors[forms.form_field_of(exc.field, "") or "event_type"] = exc.message
            else:
                matched = result.matched
                names = await self.destination_names(
                    flt.tenant_id, [d.destination_id for d in result.sample]
                )
                sample = [self.delivery_item(d, names) for d in result.sample]
        return render(
            "replay_new.html",
            request,
            {
                "form": filters,
                "errors": errors,
                "error": error,
                "matched": matched,
                "sample": sample,
                "deliveries_url": f"{base(request)}/deliveries?{query_of(filters)}",
                **self._form_context(),
            },
            status=400 if errors or error else 200,
        )

    async def start(self, request: web.Request) -> web.StreamResponse:
        """The ``Replay`` button: store the replay, start it, and show its page."""
        given = {k: v for k, v in request[FORM].items() if k in FILTER_FIELDS}
        _, errors, flt = delivery_filter(given, self.scope(request))
        if flt is None or errors:
            return await self._preview(request, given)
        try:
            replay = await self.replayer.start(flt, by=self.scope(request).by)
        except HeraldError as exc:
            return await self._preview(request, given, error=exc.message)
        return redirect(f"{base(request)}/replays/{replay.id}")

    async def show(self, request: web.Request) -> web.StreamResponse:
        tenant = self.scope(request).tenant_id
        replay = await self.service.replays.get(tenant, request.match_info["id"])
        view = progress_view(replay, running=replay.id in self.replayer.running, tenant_id=tenant)
        refresh = view["state"] in ("re-queuing", "delivering")
        names = await self._filter_names(self.scope(request).tenant_id, [replay])
        return render(
            "replay.html",
            request,
            {"r": view, "refresh": REFRESH_SECONDS if refresh else None, "names": names},
        )

    async def _filter_names(
        self, tenant_id: str | None, replays: Iterable[Replay]
    ) -> dict[str, str]:
        """The names of the destinations the replays' filters name."""
        ids = [str(r.filter["destination_id"]) for r in replays if r.filter.get("destination_id")]
        return await self.destination_names(tenant_id, ids)
