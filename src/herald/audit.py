"""The audit trail: one line per change a person asked for, alike from the CLI, the
API and the console (logger ``herald.audit``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from herald.logs import ALWAYS

audit_log = structlog.get_logger("herald.audit")


def audit(action: str, *, by: str, tenant_id: str, **fields: object) -> None:
    """The one audit line of a change a person asked for, written alike by the CLI,
    the API, the console and the portal: ``by`` names who (``cli:<OS user>``,
    ``api:<tenant>``, ``console:<key id>``, ``portal:<tenant>``), ``fields`` the
    objects (ids, never a body or a secret)."""
    # Kept by a quiet CLI too: a change made at a shell leaves its line.
    audit_log.info(action, by=by, tenant_id=tenant_id, **fields, **{ALWAYS: True})


def update_fields(body: Mapping[str, Any]) -> dict[str, object]:
    """What an update's audit line says it changed: the fields' names, and the status
    it set (pause and resume are updates of the status)."""
    out: dict[str, object] = {"changed": sorted(body)}
    if isinstance(body.get("status"), str):
        out["status"] = body["status"]
    return out
