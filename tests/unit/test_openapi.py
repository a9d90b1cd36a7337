"""The OpenAPI document is valid OpenAPI 3.1, as generated and as committed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openapi_spec_validator import validate

from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.api import schemas
from herald.api.openapi import document
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
