"""The whole configuration, and loading it: a TOML file, overridden by ``HERALD_…``
environment variables, with one message that names each offending key."""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

import herald.config.sections as sections
from herald.config.masks import mask_secrets
from herald.config.sources import OutboxSettings
from herald.errors import ConfigError

ENV_PREFIX = "HERALD_"


class Settings(BaseSettings):
    """The whole configuration; sections mirror the TOML tables."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        case_sensitive=False,
    )

    database: sections.DatabaseSettings = sections.DatabaseSettings()
    api: sections.ApiSettings = sections.ApiSettings()
    delivery: sections.DeliverySettings = Field(default_factory=sections.DeliverySettings)
    relay: sections.RelaySettings = sections.RelaySettings()
    outbox: OutboxSettings = OutboxSettings()
    security: sections.SecuritySettings = sections.SecuritySettings()
    retention: sections.RetentionSettings = sections.RetentionSettings()
    signals: sections.SignalsSettings = sections.SignalsSettings()
    catalog: sections.CatalogSettings = sections.CatalogSettings()
    metrics: sections.MetricsSettings = sections.MetricsSettings()
    console: sections.ConsoleSettings = sections.ConsoleSettings()
    log: sections.LogSettings = sections.LogSettings()
    tracing: sections.TracingSettings = sections.TracingSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment overrides them.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _separate_listeners(self) -> Settings:
        if self.metrics.listen is not None and self.metrics.listen == self.api.listen:
            raise ValueError("metrics.listen must differ from api.listen (or be left unset)")
        return self

    def key_file(self) -> Path | None:
        """Where the generated encryption key lives when none is configured."""
        if self.security.encryption_key_file is not None:
            return self.security.encryption_key_file
        db = self.database.sqlite_path
        return None if db is None else db.with_name(db.name + ".key")


def env_name(key: str) -> str:
    """The environment variable of a dotted setting: ``delivery.max_retries`` is
    ``HERALD_DELIVERY__MAX_RETRIES``."""
    return ENV_PREFIX + key.replace(".", "__").upper()


def _keys() -> dict[str, list[str]]:
    """Every section's keys, by section."""
    out: dict[str, list[str]] = {}
    for name, field in Settings.model_fields.items():
        model = field.annotation
        out[name] = list(model.model_fields) if isinstance(model, type) else []
    return out


def _nearest(key: str) -> str | None:
    """The known dotted key closest to a mistyped one, if any is close."""
    sections = _keys()
    section, _, rest = key.partition(".")
    if section in sections:
        found = difflib.get_close_matches(rest, sections[section], n=1, cutoff=0.6)
        return f"{section}.{found[0]}" if found else None
    dotted = [f"{s}.{k}" for s, keys in sections.items() for k in keys]
    found = difflib.get_close_matches(key, [*sections, *dotted], n=1, cutoff=0.6)
    return found[0] if found else None


def _from_env(key: str) -> str | None:
    """The ``HERALD_…`` variable that set ``key``, if one did (the environment wins)."""
    name = env_name(key)
    return next((var for var in os.environ if var.upper() == name), None)


def mistyped_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``HERALD_…`` variables that look meant for a setting but name none, each with
    what it should be: pydantic-settings would ignore them without a word.

    Only variables that start with a section's name count (``HERALD_DELIVERY_…``,
    ``HERALD_API__…``): others (``HERALD_REQUIRE_SERVICES``) belong to someone else.
    """
    sections = _keys()
    problems = []
    for var in environ if environ is not None else os.environ:
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :].lower()
        section = next((s for s in sections if rest.startswith(s + "_")), None)
        if section is None:
            continue
        key = rest[len(section) :].lstrip("_")
        if rest.startswith(section + "__") and (key in sections[section] or not key):
            continue
        nearest = _nearest(f"{section}.{key}")
        hint = f"; did you mean {env_name(nearest)}?" if nearest else ""
        problems.append(f"{var} is not a setting (HERALD_<SECTION>__<KEY>){hint}")
    return problems


def _describe(errors: list[Any]) -> str:
    lines = []
    for err in errors:
        key = ".".join(str(part) for part in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
            if nearest := _nearest(key):
                msg += f"; did you mean {nearest}?"
        elif (
            "input" in err
            and not isinstance(err["input"], dict | list)
            and "encryption_key" not in key  # never echo a key, even a malformed one
        ):
            got = err["input"]
            msg = f"{msg} (got {mask_secrets(got) if isinstance(got, str) else got!r})"
        if (var := _from_env(key)) is not None:
            key = f"{var} ({key})"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


def load_settings(path: Path | None = None) -> Settings:
    """Read ``path`` (TOML, optional) and ``HERALD_…`` variables into validated settings."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from exc
    where = f"config {path}" if path else "config"
    # A top-level "_…" key would reach pydantic-settings as an option of its own
    # (``_env_file``, ``_secrets_dir``, ``_cli_parse_args``), not as a setting.
    if odd := sorted(key for key in data if key.startswith("_")):
        raise ConfigError(f"{where}: {odd[0]}: unknown key")
    if mistyped := mistyped_variables():
        raise ConfigError(f"environment: {'; '.join(mistyped)}")
    try:
        return Settings(**data)
    except pydantic.ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc.errors())}") from exc
    except SettingsError as exc:  # a HERALD_… variable of a section that is not JSON
        raise ConfigError(f"environment: {exc}") from exc


def risky_settings(settings: Settings) -> list[str]:
    """What ``check-config`` warns about: settings that run accepts but that widen what
    a tenant can do with the host's privileges."""
    found: list[str] = []
    tenants = settings.security.ambient_credentials_tenants
    if tenants:
        found.append(
            "security.ambient_credentials_tenants lets "
            + ", ".join(repr(t) for t in tenants)
            + " publish with this host's own cloud identity (its IAM role, workload"
            " identity, environment credentials): keyless AWS and GCP destinations of"
            " these tenants act as the host"
        )
    return found
