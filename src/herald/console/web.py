"""The web UI on the API listener: the operators' console under ``/console/`` and the
tenants' portal under ``/portal/``.

One UI, mounted once per face (``herald.console.scope.Face``); every route of every
face is registered here, in ``_routes``. The pieces:

- ``guard.py``: the middleware (headers, CSRF, the session through the face's door,
  rate limits, error pages, the access line);
- ``signin.py``: the console's door (operator keys); ``portal.py`` the portal's
  (session tokens);
- ``pages.py``: what every handler shares; ``destinations.py``, ``deliveries.py``,
  ``replays.py`` and ``eventtypes.py`` (the catalog) the pages themselves, which call
  the same service layer as the API and the CLI (``filters.py`` reads the deliveries'
  filter for the deliveries and replays).

Every change writes one audit line naming who asked (``by=console:<key id>`` or
``by=portal:<tenant>``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from herald.access import Access
from herald.config import Settings
from herald.console.deliveries import DeliveryPages
from herald.console.destinations import DestinationPages
from herald.console.eventtypes import EventTypePages
from herald.console.guard import Door, Guard
from herald.console.pages import base, path_segment, redirect, when
from herald.console.portal import PortalDoor, portal_face
from herald.console.replays import ReplayPages
from herald.console.scope import FACE, Face
from herald.console.session import SESSION_COOKIE
from herald.console.signin import OperatorDoor
from herald.replayer import Replayer
from herald.service import Operations

CONSOLE = Face(name="console", prefix="/console", every_tenant=True, cookie=SESSION_COOKIE)


class Console:
    """The UI's handlers and faces, bound to one service."""

    def __init__(
        self,
        service: Operations,
        *,
        access: Access,
        settings: Settings,
        replayer: Replayer | None = None,
        sources: Callable[[], list[dict[str, object]]] | None = None,
    ) -> None:
        self.service = service
        self.settings = settings
        # The API's very budgets: the same per operator key as per tenant, the same per
        # address for failed sign-ins as for requests without a valid key.
        self.limiter, self.anonymous = access.limiter, access.anonymous
        self.operators = OperatorDoor(access.sessions, settings.console, anonymous=self.anonymous)
        self.tenants = PortalDoor(access.tokens, settings.console, anonymous=self.anonymous)
        self.destinations = DestinationPages(service)
        self.deliveries = DeliveryPages(service)
        if sources is not None:
            self.deliveries.sources = sources
        self.event_types = EventTypePages(service)
        # The daemon's, which it stops; without a daemon (tests), one of its own.
        self.replays = ReplayPages(service, replayer=replayer or Replayer(service.replays))

    def application(self, face: Face, door: Door) -> web.Application:
        """The sub-application of one face."""
        guard = Guard(
            face,
            door,
            limiter=self.limiter,
            anonymous=self.anonymous,
            body_timeout=self.settings.api.body_timeout_seconds,
        )
        app = web.Application(
            middlewares=[guard.middleware], client_max_size=self.settings.api.max_body_bytes
        )
        app[FACE] = face
        filters: dict[str, Callable[..., str]] = {"path": path_segment, "when": when}
        aiohttp_jinja2.setup(
            app,
            loader=jinja2.PackageLoader("herald.console", "templates"),
            autoescape=True,
            filters=filters,
        )
        self._routes(app.router, face, door)
        static = Path(str(resources.files("herald.console") / "static"))
        app.router.add_static("/static", static)
        return app

    def _routes(self, r: web.UrlDispatcher, face: Face, door: Door) -> None:
        """Every page of the UI, the same paths under every face (the rejected outbox
        rows for operators only)."""
        dest, dlv = self.destinations, self.deliveries
        r.add_get("/", dlv.overview)
        r.add_get("/login", door.login_page)
        if door is self.operators:
            r.add_post("/login", self.operators.login)
        r.add_post("/logout", door.logout)
        r.add_get("/deliveries", dlv.list)
        r.add_get("/deliveries/{id}", dlv.show)
        r.add_post("/deliveries/{id}/retry", dlv.retry)
        r.add_get("/replays", self.replays.list)
        r.add_post("/replays", self.replays.start)
        r.add_get("/replays/new", self.replays.preview)
        r.add_get("/replays/{id}", self.replays.show)
        r.add_get("/destinations", dest.list)
        r.add_post("/destinations", dest.create)
        r.add_get("/destinations/new", dest.new)
        r.add_get("/destinations/{id}", dest.show)
        r.add_post("/destinations/{id}/edit", dest.edit)
        r.add_post("/destinations/{id}/pause", dest.pause)
        r.add_post("/destinations/{id}/resume", dest.resume)
        r.add_post("/destinations/{id}/test", dest.send_test)
        r.add_post("/destinations/{id}/verify", dest.verify)
        r.add_post("/destinations/{id}/rotate-secret", dest.rotate_secret)
        r.add_get("/destinations/{id}/delete", dest.delete_page)
        r.add_get("/destinations/{id}/filter", self.event_types.filter_test)
        r.add_post("/destinations/{id}/delete", dest.delete)
        r.add_get("/event-types", self.event_types.list)
        r.add_get("/events", dlv.events)
        # A producer's event id may hold any visible character, '/' included.
        r.add_get("/events/{id:.+}", dlv.event)
        if face.every_tenant:
            r.add_get("/outbox/rejected", dlv.rejected)
        # An action's address opened later (a bookmark, a reload after the redirect, a
        # link shared) leads to the page the action is on, not to a bare 405.
        r.add_get("/logout", to_page("/"))
        r.add_get("/deliveries/{id}/retry", to_page("/deliveries/{id}"))
        for action in ("edit", "pause", "resume", "test", "verify", "rotate-secret"):
            r.add_get(f"/destinations/{{id}}/{action}", to_page("/destinations/{id}"))


def to_page(path: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A GET handler sending to ``path`` under the face (``{id}``: the request's, quoted)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        ident = request.match_info.get("id", "")
        return redirect(f"{base(request)}{path.replace('{id}', path_segment(ident))}")

    return handler


def _mount(app: web.Application, sub: web.Application, prefix: str) -> None:
    async def to_index(request: web.Request) -> web.StreamResponse:
        return redirect(f"{prefix}/")

    app.router.add_get(prefix, to_index)
    app.add_subapp(prefix, sub)


def setup(
    app: web.Application,
    service: Operations,
    *,
    access: Access,
    settings: Settings,
    replayer: Replayer | None = None,
    sources: Callable[[], list[dict[str, object]]] | None = None,
) -> Console | None:
    """Mount the console under ``/console/`` and the portal under ``/portal/`` (neither
    when ``console.enabled`` is false)."""
    if not settings.console.enabled:
        return None
    console = Console(
        service,
        access=access,
        settings=settings,
        replayer=replayer,
        sources=sources,
    )
    _mount(app, console.application(CONSOLE, console.operators), CONSOLE.prefix)
    portal = portal_face(settings.console)
    _mount(app, console.application(portal, console.tenants), portal.prefix)
    return console
