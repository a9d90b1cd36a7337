"""Property-based API testing: schemathesis drives `herald run` from its own /v2/openapi.json.

Every operation of the served document is exercised with generated requests (a
bounded number of examples each, positive and negative) carrying a valid key. No
answer may be a 5xx, use an undocumented status code or content type, or break its
response schema, and every error carries the request id of its X-Request-Id header.

The operations are listed from the committed docs/openapi.json so each one is its
own test; the requests are generated from the document the daemon serves (the two
are asserted equal in test_api.py). GET and action requests on ``{id}`` paths
address real seeded objects, so real records are validated, not just 404 bodies.

schemathesis' ``from_fixture(...).parametrize()`` pytest integration does not run on
pytest 9 (it writes ``Function._nodeid``), so this uses its documented
``APIOperation.as_strategy()`` + ``Case.call_and_validate()`` API with Hypothesis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.daemon import Herald
from tests.support.databases import BACKENDS, create_postgres_database, drop_postgres_database

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES = 25


def _cases() -> list[tuple[str, GenerationMode]]:
    """Every operation in positive mode, and in negative mode when it takes a body or a query.

    (A lone string path parameter has no invalid value to generate.)
    """
    out = []
    for result in schemathesis.openapi.from_path(COMMITTED).get_all_operations():
        if not isinstance(result, Ok):
            raise result.err()  # the document itself is broken
        operation = result.ok()
        out.append((operation.label, GenerationMode.POSITIVE))
        if operation.body or operation.query:
            out.append((operation.label, GenerationMode.NEGATIVE))
    return out


@dataclass
class Seeded:
    herald: Herald
    base_url: str
    headers: dict[str, str]
    session: requests.Session
    ids: dict[str, str]
    document: dict[str, Any]


@pytest.fixture(scope="module", params=BACKENDS)
def seeded(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Seeded]:
    """One daemon per backend for the module; its fuzzing tenant owns a destination, an
    event, a delivery, a replay. On PostgreSQL the API answers from the other store: its errors,
    constraints and types must map to the same documented answers."""
    url = asyncio.run(create_postgres_database()) if request.param == "postgres" else None
    h = Herald(
        tmp_path_factory.mktemp("schemathesis"),
        {"api": {"rate_limit_requests": 1_000_000}},
        database_url=url,
    ).start()
    session = requests.Session()
    try:
        key = h.cli("keys", "create", "--tenant", "fuzz").stdout.strip()
        base = f"http://127.0.0.1:{h.port}"
        headers = {"Authorization": f"Bearer {key}"}
        # Nothing listens on the discard port, so the destination stays pending verification.
        dest = session.post(
            f"{base}/v2/event-destinations",
            headers=headers,
            json={
                "name": "fuzz target",
                "type": "webhook",
                "webhook": {"url": "http://127.0.0.1:9/hook"},
                "events": ["*"],
            },
            timeout=10,
        )
        assert dest.status_code == 201, dest.text
        event = session.post(
            f"{base}/v2/events",
            headers=headers,
            json={"type": "task_run.completed", "data": {"task_run_id": "trun_1"}},
            timeout=10,
        )
        assert event.status_code == 202, event.text
        dest_id = dest.json()["id"]
        deadline = time.monotonic() + 15
        while True:
            page = session.get(
                f"{base}/v2/event-destinations/{dest_id}/event-deliveries",
                headers=headers,
                params={"event_type": "task_run.completed"},
                timeout=10,
            ).json()
            if page["data"]:
                break
            assert time.monotonic() < deadline, "the published event was never fanned out"
            time.sleep(0.05)
        replay = session.post(
            f"{base}/v2/event-destinations/{dest_id}/replay", headers=headers, json={}, timeout=10
        )
        assert replay.status_code == 202, replay.text
        document = session.get(f"{base}/v2/openapi.json", timeout=10).json()
        ids = {
            "/v2/replays/{id}": replay.json()["id"],
            "/v2/event-destinations/{id}": dest_id,
            "/v2/event-deliveries/{id}": page["data"][0]["id"],
            "/v2/events/{id}": event.json()["id"],
        }
        yield Seeded(h, base, headers, session, ids, document)
    finally:
        session.close()
        if h.proc is not None and h.proc.poll() is None:
            h.kill()
        if url is not None:
            asyncio.run(drop_postgres_database(url))


def _real_id(seeded: Seeded, method: str, path: str) -> str | None:
    if method == "DELETE":
        return None  # deleting the seeded destination would turn the rest into 404s
    for prefix, real in seeded.ids.items():
        if path.startswith(prefix):
            return real
    return None


@pytest.mark.parametrize(("label", "mode"), _cases())
def test_operation_conforms_to_the_served_document(
    seeded: Seeded, label: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_dict(seeded.document)
    operation = schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is in docs/openapi.json but not served"
    method, path = label.split(" ", 1)
    real = _real_id(seeded, method, path)
    fixed = {"id": real} if real is not None and mode is GenerationMode.POSITIVE else None
    strategy = operation.as_strategy(
        generation_mode=mode, headers=dict(seeded.headers), path_parameters=fixed
    )

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=timedelta(seconds=10),
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case: Case[Any]) -> None:
        response = case.call_and_validate(
            base_url=seeded.base_url,
            session=seeded.session,
            headers=seeded.headers,
            checks=CHECKS,
            timeout=10,
        )
        request_id = response.headers.get("x-request-id", [""])[0]
        assert request_id.startswith("req_"), response.headers
        if response.status_code >= 400:
            assert response.json()["request_id"] == request_id

    check()
