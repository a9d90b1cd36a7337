"""``[outbox]``: the producers' databases whose outbox tables Herald reads."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from herald.config.checks import Section, check_database_url

SOURCE_COLUMNS = (
    "seq",
    "id",
    "tenant_id",
    "type",
    "data",
    "created_at",
    "traceparent",
    "ordering_key",
)
"""The outbox columns a source's table has, by Herald's names (``columns`` renames them)."""
SOURCE_OPTIONAL_COLUMNS = frozenset({"tenant_id", "created_at", "traceparent", "ordering_key"})
"""Columns a source's table may lack (mapped to ``""``): every row is then the default
tenant's, created when Herald reads it, without a trace context or an ordering key."""
SOURCE_DIALECTS = {"postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql"}
_SOURCE_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
BUILTIN_SOURCE = "herald"
"""The name the built-in outbox (Herald's own ``herald_outbox``) goes by in labels."""


def _check_sql_name(value: str, *, dotted: bool = False) -> str:
    parts = value.split(".") if dotted else [value]
    if len(parts) > 2 or not all(_SQL_NAME.fullmatch(p) for p in parts):
        what = "[schema.]name" if dotted else "name"
        raise ValueError(
            f"{value!r} is not a plain SQL {what} (letters, digits and _, not starting"
            " with a digit, at most 63 characters)"
        )
    return value


class SourceSettings(Section):
    """One outbox source: a producer's own database Herald reads an outbox table of."""

    name: str
    """``[a-z0-9_-]{1,32}``: labels the source's metrics, log lines and rejected rows."""
    url: str
    """``postgresql://…``, ``mysql://…`` (MySQL 8.0+, MariaDB 10.6+) or ``sqlite:///path``."""
    table: str = "herald_outbox"
    columns: dict[str, str] = Field(default_factory=dict)
    """Herald's column name -> the table's, for a table with other names; ``""`` for an
    optional column the table lacks (``tenant_id``, ``created_at``, ``traceparent``,
    ``ordering_key``)."""
    poll_interval_seconds: float = Field(default=0.02, gt=0, le=60)
    """While rows arrive, a read of the source at most this often (counted from the
    last read's start); a query on the producer's database each time, so kept apart
    from the relay's own ``poll_interval_seconds`` (a look at a file's version)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SOURCE_NAME.fullmatch(value):
            raise ValueError("expected 1 to 32 of a-z, 0-9, _ and -")
        if value == BUILTIN_SOURCE:
            raise ValueError(f"{BUILTIN_SOURCE!r} is the built-in outbox's name")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_database_url(
            value, SOURCE_DIALECTS, what="source", use="postgresql, mysql or sqlite", addressed=True
        )

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return _check_sql_name(value, dotted=True)

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, str]) -> dict[str, str]:
        for key, column in value.items():
            if key not in SOURCE_COLUMNS:
                raise ValueError(f"{key!r} is not an outbox column ({', '.join(SOURCE_COLUMNS)})")
            if column == "" and key not in SOURCE_OPTIONAL_COLUMNS:
                raise ValueError(f"the {key} column cannot be left out")
            if column:
                _check_sql_name(column)
        return value

    @property
    def dialect(self) -> str:
        """``postgresql``, ``mysql`` or ``sqlite``."""
        scheme = urlsplit(self.url).scheme
        return SOURCE_DIALECTS.get(scheme, scheme)

    def column(self, name: str) -> str:
        """The table's column for Herald's ``name`` (``""``: the table has none)."""
        return self.columns.get(name, name)


class OutboxSettings(Section):
    sources: tuple[SourceSettings, ...] = ()
    """External outboxes, besides the built-in ``herald_outbox`` (always read)."""

    @field_validator("sources")
    @classmethod
    def _unique(cls, value: tuple[SourceSettings, ...]) -> tuple[SourceSettings, ...]:
        seen: set[str] = set()
        for source in value:
            if source.name in seen:
                raise ValueError(f"two sources are named {source.name!r}")
            seen.add(source.name)
        return value
