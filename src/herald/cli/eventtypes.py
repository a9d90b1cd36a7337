"""``herald event-types …``: the tenant's event-type catalog (list, show, put, delete)."""

from __future__ import annotations

import argparse

from herald.cli.common import EXIT_OK, json_object, os_user, read_body
from herald.cli.output import print_json, table
from herald.config import Settings
from herald.views import event_type_view, list_view


async def cmd_event_types(settings: Settings, args: argparse.Namespace) -> int:
    from herald.audit import audit
    from herald.wiring import components

    async with components(settings) as comp:
        catalog = comp.service.event_types
        if args.action == "list":
            items, more = await catalog.list(args.tenant, limit=args.limit)
            views = [event_type_view(e) for e in items]
            if args.json:
                print_json(list_view(views, has_more=more, next_cursor=None, request_id="cli"))
            else:
                rows = [
                    (
                        v["type"],
                        "yes" if v["schema"] is not None else "no",
                        "herald" if v["builtin"] else "",
                        v["description"][:60],
                    )
                    for v in views
                ]
                table(rows, ("type", "schema", "own", "description"))
            return EXIT_OK
        if args.action == "show":
            entry = await catalog.get(args.tenant, args.type)
        elif args.action == "put":
            entry = await catalog.put(args.tenant, args.type, json_object(read_body(args.data)))
            audit(
                "event_type_put", by=f"cli:{os_user()}", tenant_id=args.tenant, event_type=args.type
            )
        else:
            entry = await catalog.delete(args.tenant, args.type)
            audit(
                "event_type_deleted",
                by=f"cli:{os_user()}",
                tenant_id=args.tenant,
                event_type=args.type,
            )
    view = event_type_view(entry)
    if args.json or args.action == "show":
        print_json(view)
    else:
        print(f"{'deleted' if args.action == 'delete' else 'stored'} {entry.type}")
    return EXIT_OK
