"""Commands on a tenant's objects: ``emit``, ``destinations …`` and ``deliveries …``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from herald.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    delivery_filter,
    json_object,
    os_user,
    read_body,
)
from herald.cli.output import (
    dest_rows,
    print_delivery,
    print_destination,
    print_health,
    print_json,
    print_verification,
    short_ts,
    table,
)
from herald.config import Settings
from herald.model import DeliveryStatus, Destination, DestinationStatus
from herald.views import (
    delivery_view,
    destination_view,
    event_view,
    filter_test_view,
    health_view,
    list_view,
    rate_text,
    verification_attempt_view,
)


async def cmd_emit(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    data = read_body(args.data)
    async with components(settings) as comp:
        event = await comp.service.publish(
            args.tenant,
            args.type,
            data,
            event_id=args.id,
            created_at=args.created_at,
            traceparent=args.traceparent,
            ordering_key=args.ordering_key,
        )
    if args.json:
        print_json(event_view(event))
    else:
        print(event.id)
    return EXIT_OK


def _audit(args: argparse.Namespace, action: str, **fields: object) -> None:
    from herald.audit import audit

    audit(action, by=f"cli:{os_user()}", tenant_id=args.tenant, **fields)


async def cmd_destinations(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        svc = comp.service

        def view(dest: Destination) -> dict[str, Any]:
            return destination_view(dest, comp.registry)

        action = args.action
        if action == "list":
            status = DestinationStatus(args.status) if args.status else None
            items, has_more = await svc.list_destinations(
                args.tenant, status=status, type=args.type, limit=args.limit
            )
            views = [view(d) for d in items]
            if args.json:
                print_json(list_view(views, has_more=has_more, next_cursor=None, request_id="cli"))
            else:
                dest_rows(views)
            return EXIT_OK
        if action == "create":
            dest = await svc.create(args.tenant, json_object(read_body(args.data)))
            _audit(args, "destination_created", destination_id=dest.id)
        elif action == "show":
            dest = await svc.get(args.tenant, args.id)
        elif action == "update":
            from herald.audit import update_fields

            body = json_object(read_body(args.data))
            dest = await svc.update(args.tenant, args.id, body)
            _audit(args, "destination_updated", destination_id=dest.id, **update_fields(body))
        elif action == "delete":
            dest = await svc.delete(args.tenant, args.id)
            _audit(args, "destination_deleted", destination_id=dest.id)
        elif action == "verify":
            dest = await svc.verify(args.tenant, args.id)
            _audit(args, "destination_verification_sent", destination_id=dest.id)
        elif action == "rotate-secret":
            dest, secret = await svc.rotate_secret(args.tenant, args.id, args.secret)
            _audit(args, "destination_secret_rotated", destination_id=dest.id)
            out = view(dest)
            out["secret"] = secret
            if args.json:
                print_json(out)
            else:
                print(secret)
                print(
                    "# New signing secret, shown once; the previous one signs for 24 h more.",
                    file=sys.stderr,
                )
            return EXIT_OK
        elif action == "test-filter":
            body = json_object(read_body(args.data)) if args.data else {}
            spec, results = await svc.test_filter(args.tenant, args.id, body)
            tried = filter_test_view(spec, results)
            if args.json:
                print_json(tried)
            else:
                table(
                    [
                        (e["id"], e["type"], e["created_at"], "pass" if e["passes"] else "-")
                        for e in tried["data"]
                    ],
                    ("event", "type", "created", "filter"),
                )
                print(f"{tried['passed']} of {tried['tested']} would pass")
            return EXIT_OK
        elif action == "test":
            delivery = await svc.test(args.tenant, args.id)
            _audit(
                args,
                "destination_tested",
                destination_id=delivery.destination_id,
                delivery_id=delivery.id,
                outcome=delivery.status.value,
            )
            if args.json:
                print_json(delivery_view(delivery, with_attempts=True))
            else:
                print_delivery(delivery_view(delivery, with_attempts=True))
            return EXIT_OK if delivery.status is DeliveryStatus.SUCCESS else EXIT_FAILED
        else:  # pragma: no cover - argparse restricts the choices
            raise UsageError(f"unknown action {action}")
        v = view(dest)
        health = (await svc.health([dest])).get(dest.id) if action == "show" else None
        if action == "show":
            v["health"] = health_view(health)  # as the API's GET shows it
            if v["verification"]["state"] != "verified":
                attempt = await svc.verification_attempt(dest)
                v["verification"]["last_attempt"] = verification_attempt_view(attempt)
        if args.json:
            print_json(v)
            return EXIT_OK
        if action == "show":
            print_destination(v)
            print_health(v["health"], rate_text(health))
            print_verification(v)
            return EXIT_OK
        dest_rows([v])
        print_verification(v)
        # Say what changed (stderr is the log's: JSON lines when log.format is json).
        said = {
            "create": f"created {dest.id}: pending_verification until its verification ping"
            " succeeds (herald deliveries list --destination " + dest.id + ")",
            "update": f"updated {dest.id}",
            "delete": f"deleted {dest.id}; its pending deliveries end as failure",
            "verify": f"queued a new verification ping for {dest.id}; it is active once the"
            " ping succeeds",
        }[action]
        print(said)
    return EXIT_OK


async def cmd_deliveries(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    tenant = None if args.all_tenants else args.tenant
    async with components(settings) as comp:
        if args.action == "show":
            delivery = await comp.service.get_delivery(tenant, args.id)
            if args.json:
                print_json(delivery_view(delivery, with_attempts=True))
                return EXIT_OK
            event = await comp.service.get_event(delivery.tenant_id, delivery.event_id)
            shown = delivery_view(delivery, with_attempts=True) | {"tenant_id": delivery.tenant_id}
            print_delivery(shown, event_view(event))
            return EXIT_OK
        items, has_more = await comp.service.list_deliveries(
            delivery_filter(args, tenant=tenant), limit=args.limit
        )
    views = [delivery_view(d) for d in items]
    if args.json:
        print_json(list_view(views, has_more=has_more, next_cursor=None, request_id="cli"))
        return EXIT_OK
    rows: list[tuple[Any, ...]] = [
        (
            v["id"],
            v["event_type"],
            v["destination_id"],
            v["status"] + (" (held)" if v["held"] and v["status"] == "pending" else ""),
            v["attempt_count"],
            (v["last_attempt"] or {}).get("response_status"),
            short_ts(v["next_attempt_at"]),
            short_ts(v["created_at"]),
        )
        for v in views
    ]
    headers: tuple[str, ...] = (
        "id",
        "event type",
        "destination",
        "status",
        "attempts",
        "last http",
        "next attempt",
        "created",
    )
    if tenant is None:  # every tenant's: say whose
        rows = [(d.tenant_id, *row) for d, row in zip(items, rows, strict=True)]
        headers = ("tenant", *headers)
    table(rows, headers)
    if has_more:
        print(f"(more than {args.limit}; use --limit)", file=sys.stderr)
    return EXIT_OK
