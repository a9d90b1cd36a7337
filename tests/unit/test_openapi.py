"""The OpenAPI document is valid OpenAPI 3.1, as generated and as committed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.api import schemas
from herald.api.openapi import Served, document
from herald.config import Settings
from herald.egress import EgressPolicy

DOCS_OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def generated() -> dict[str, Any]:
    registry = Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))
    return document(schemas.destination_models(registry))


def test_the_generated_document_passes_openapi_spec_validator() -> None:
    validate(generated())


def test_the_committed_document_passes_openapi_spec_validator() -> None:
    validate(json.loads(DOCS_OPENAPI.read_text()))


def test_a_nullable_enum_lists_its_values_on_the_string_branch_only() -> None:
    status = generated()["components"]["schemas"]["DestinationUpdate"]["properties"]["status"]
    assert "enum" not in status
    assert status["default"] is None
    assert {"type": "string", "enum": ["active", "inactive"]} in status["anyOf"]


def test_the_served_document_has_a_digest_etag_and_revalidates() -> None:
    models = schemas.destination_models(
        Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))
    )
    served = Served.build(models)
    assert json.loads(served.body) == generated()
    assert Served.build(models).etag == served.etag  # the same document, the same tag
    assert served.matches(served.etag)
    assert served.matches(f'"x", W/{served.etag}')
    assert served.matches("*")
    assert not served.matches('"x"')
    assert not served.matches("")


async def test_the_api_builds_the_document_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every later request is answered from the same bytes, a revalidation with 304."""
    from aiohttp.test_utils import make_mocked_request

    from herald.api import openapi
    from herald.api.v2 import Api

    built: list[int] = []
    real = openapi.document

    def counted(models: schemas.DestinationModels) -> dict[str, Any]:
        built.append(1)
        return real(models)

    monkeypatch.setattr(openapi, "document", counted)
    api = Api.__new__(Api)  # only the document's models: no service behind it
    api.models = schemas.destination_models(
        Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))
    )
    first = await api.openapi(make_mocked_request("GET", "/v2/openapi.json"))
    etag = first.headers["ETag"]
    again = await api.openapi(
        make_mocked_request("GET", "/v2/openapi.json", headers={"If-None-Match": etag})
    )
    assert (first.status, again.status, again.headers["ETag"]) == (200, 304, etag)
    assert built == [1]
