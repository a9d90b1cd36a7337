"""Configuration: a TOML file, overridden by ``HERALD_…`` environment variables.

Every key is documented in ``config.example.toml``. Loading never half-works:
an invalid file or value raises :class:`~herald.errors.ConfigError` with one
message that names each offending key.

The rooms: :mod:`~herald.config.checks` (the field types' checks),
:mod:`~herald.config.sections` (one class a TOML table),
:mod:`~herald.config.sources` (``[outbox]``'s producers' databases),
:mod:`~herald.config.settings` (the whole, and loading it),
:mod:`~herald.config.masks` (a secret in text) and
:mod:`~herald.config.redaction` (what of the settings is secret). Everything public
is re-exported here: ``from herald.config import Settings``.
"""

from herald.config.checks import (
    LOGO_DATA,
    MAX_LOGO_CHARS,
    AccentColor,
    EncryptionKey,
    IpAddresses,
    LogoUrl,
    Networks,
    Origins,
    ProxyUrl,
    TenantName,
)
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
    "LOGO_DATA",
    "MASK",
    "MAX_LOGO_CHARS",
    "SOURCE_COLUMNS",
    "SOURCE_DIALECTS",
    "SOURCE_OPTIONAL_COLUMNS",
    "AccentColor",
    "ApiSettings",
    "CatalogSettings",
    "ConsoleSettings",
    "DatabaseSettings",
    "DeliverySettings",
    "EncryptionKey",
    "IpAddresses",
    "LogSettings",
    "LogoUrl",
    "MetricsSettings",
    "Networks",
    "Origins",
    "OutboxSettings",
    "ProxyUrl",
    "Redactor",
    "RelaySettings",
    "RetentionSettings",
    "SecuritySettings",
    "Settings",
    "SignalsSettings",
    "SourceSettings",
    "TenantName",
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
