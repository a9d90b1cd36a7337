"""Configuration: a TOML file, overridden by ``HERALD_…`` environment variables.

Every key is documented in ``config.example.toml``. Loading never half-works:
an invalid file or value raises :class:`~herald.errors.ConfigError` with one
message that names each offending key.

The rooms: :mod:`~herald.config.checks` (the field types' checks, used by the sections),
:mod:`~herald.config.sections` (one class a TOML table),
:mod:`~herald.config.sources` (``[outbox]``'s producers' databases),
:mod:`~herald.config.settings` (the whole, and loading it),
:mod:`~herald.config.masks` (a secret in text) and
:mod:`~herald.config.redaction` (what of the settings is secret). Everything public
is re-exported here: ``from herald.config import Settings``.
"""

from herald.config.masks import MASK, mask_secrets, redact
from herald.config.redaction import Redactor, masked, operator_secrets
from herald.config.sections import (
    AUTO_WORKERS_MAX,
    ApiSettings,
    CatalogSettings,
    ConsoleSettings,
    DatabaseSettings,
    DeliverySettings,
    LogSettings,
    MetricsSettings,
    RelaySettings,
    RetentionSettings,
    SecuritySettings,
    SignalsSettings,
    TracingSettings,
    auto_worker_processes,
    cgroup_cpu_limit,
)
from herald.config.settings import (
    ENV_PREFIX,
    Settings,
    env_name,
    load_settings,
    mistyped_variables,
    risky_settings,
)
from herald.config.sources import (
    BUILTIN_SOURCE,
    SOURCE_COLUMNS,
    SOURCE_DIALECTS,
    SOURCE_OPTIONAL_COLUMNS,
    OutboxSettings,
    SourceSettings,
)

__all__ = [
    "AUTO_WORKERS_MAX",
    "BUILTIN_SOURCE",
    "ENV_PREFIX",
    "MASK",
    "SOURCE_COLUMNS",
    "SOURCE_DIALECTS",
    "SOURCE_OPTIONAL_COLUMNS",
    "ApiSettings",
    "CatalogSettings",
    "ConsoleSettings",
    "DatabaseSettings",
    "DeliverySettings",
    "LogSettings",
    "MetricsSettings",
    "OutboxSettings",
    "Redactor",
    "RelaySettings",
    "RetentionSettings",
    "SecuritySettings",
    "Settings",
    "SignalsSettings",
    "SourceSettings",
    "TracingSettings",
    "auto_worker_processes",
    "cgroup_cpu_limit",
    "env_name",
    "load_settings",
    "mask_secrets",
    "masked",
    "mistyped_variables",
    "operator_secrets",
    "redact",
    "risky_settings",
]
