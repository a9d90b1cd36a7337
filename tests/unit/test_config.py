from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from herald import config
from herald.config import (
    Redactor,
    Settings,
    load_settings,
    masked,
    operator_secrets,
    risky_settings,
)
from herald.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.upper().startswith("HERALD_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "herald.toml"
    path.write_text(text)
    return path


def test_defaults_match_the_design() -> None:
    s = load_settings()
    assert s.database.url == "sqlite:///./herald.db"
    assert s.api.listen == "127.0.0.1:8080"
    assert s.delivery.backoff_base_seconds == 30
    assert s.delivery.max_retries == 10
    assert s.delivery.webhook_timeout_seconds == 5
    assert s.security.allow_private_networks is False
    assert (s.log.level, s.log.format) == ("info", "auto")


def test_no_tenant_gets_the_hosts_cloud_identity_unless_listed_and_listing_is_warned() -> None:
    """Issue 31: the default tenant used to get the host's role by default."""
    assert Settings().security.ambient_credentials_tenants == ()
    assert risky_settings(Settings()) == []
    listed = Settings.model_validate({"security": {"ambient_credentials_tenants": ["default"]}})
    [warning] = risky_settings(listed)
    assert warning.startswith("security.ambient_credentials_tenants lets 'default' publish")
    assert "host's own cloud identity" in warning


def test_connection_caps_default_below_max_connections() -> None:
    api = Settings().api
    assert (api.max_connections, api.max_connections_per_address) == (1000, 100)
    assert api.max_headless_connections < api.max_connections


def test_example_config_documents_every_key_with_its_default() -> None:
    example = tomllib.loads((ROOT / "config.example.toml").read_text())
    defaults = Settings().model_dump(mode="json")
    for section, fields in defaults.items():
        for key, value in fields.items():
            text = (ROOT / "config.example.toml").read_text()
            assert f"{key} =" in text or f"# {key} =" in text, f"{section}.{key} undocumented"
            if (section, key) == ("delivery", "worker_processes"):
                assert example[section][key] == "auto"  # resolved per machine, below
            elif key in example.get(section, {}):
                assert example[section][key] == value, f"{section}.{key} default differs"
    assert load_settings(ROOT / "config.example.toml") == Settings()


def test_file_then_environment_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[delivery]\nbackoff_base_seconds = 0.01\nmax_retries = 3\n")
    monkeypatch.setenv("HERALD_DELIVERY__MAX_RETRIES", "5")
    monkeypatch.setenv("HERALD_DATABASE__URL", "sqlite:////var/lib/herald/h.db")
    s = load_settings(path)
    assert s.delivery.backoff_base_seconds == 0.01
    assert s.delivery.max_retries == 5
    assert s.database.sqlite_path == Path("/var/lib/herald/h.db")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[delivery]\nmax_retries = 'ten'\n", "delivery.max_retries"),
        ("[delivery]\nmax_retriez = 3\n", "delivery.max_retriez: unknown key"),
        ("[nonsense]\na = 1\n", "nonsense: unknown key"),
        ("[database]\nurl = 'mysql://x'\n", "database.url"),
        ("[api]\nlisten = 'localhost'\n", "api.listen"),
        ("[delivery]\nbackoff_base_seconds = 0\n", "delivery.backoff_base_seconds"),
        ("[security]\nallowed_networks = ['10.0.0.0/33']\n", "security.allowed_networks"),
        ("[log]\nformat = 'xml'\n", "log.format"),
        ("[delivery]\nwebhook_proxy = 'socks5://x:1'\n", "delivery.webhook_proxy"),
        ("[delivery]\nwebhook_source_addresses = ['not-an-ip']\n", "delivery.webhook_source_"),
        ("[delivery\n", "not valid TOML"),
        (
            "[delivery]\nheartbeat_seconds = 10\ninstance_timeout_seconds = 15\n",
            "delivery: instance_timeout_seconds (15) must be at least twice heartbeat_seconds",
        ),
        ("[delivery]\nheartbeat_seconds = 0\n", "delivery.heartbeat_seconds"),
        ("[delivery]\nworker_processes = 'many'\n", "delivery.worker_processes"),
        ("[delivery]\nworker_processes = 0\n", "delivery.worker_processes"),
        (
            "[console]\nportal_frame_ancestors = ['https://app.example.com/']\n",
            "console.portal_frame_ancestors: 'https://app.example.com/' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['https://*.example.com']\n",
            "console.portal_frame_ancestors: 'https://*.example.com' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['app.example.com']\n",
            "console.portal_frame_ancestors: 'app.example.com' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['https://app.example.com/path']\n",
            "console.portal_frame_ancestors: 'https://app.example.com/path' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['https://u@app.example.com']\n",
            "console.portal_frame_ancestors: 'https://u@app.example.com' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['javascript:alert(1)']\n",
            "console.portal_frame_ancestors: 'javascript:alert(1)' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['https://a.com; script-src *']\n",
            "console.portal_frame_ancestors: 'https://a.com; script-src *' is not an origin (scheme://host[:port])",
        ),
        (
            "[console]\nportal_frame_ancestors = ['https://x.com:0']\n",
            "console.portal_frame_ancestors: 'https://x.com:0' is not an origin (scheme://host[:port])",
        ),
    ],
)
def test_invalid_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    assert needle in info.value.message
    assert "\n" not in info.value.message


def test_the_portal_frame_ancestors_are_origins(tmp_path: Path) -> None:
    origins = ["https://app.example.com", "http://127.0.0.1:8000", "https://[::1]:8443"]
    path = write(tmp_path, f"[console]\nportal_frame_ancestors = {origins!r}\n")
    assert load_settings(path).console.portal_frame_ancestors == tuple(origins)
    assert load_settings(write(tmp_path, "")).console.portal_frame_ancestors == ()


def test_invalid_environment_value_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERALD_DELIVERY__WEBHOOK_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ConfigError, match=r"delivery\.webhook_timeout_seconds"):
        load_settings()


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_masked_hides_the_encryption_keys(tmp_path: Path) -> None:
    current = "Y3VycmVudC1rZXktb2YtZXhhY3RseS0zMi1ieXRlcyE="
    old = "cHJldmlvdXMta2V5LW9mLWV4YWN0bHktMzItYnl0ZSE="
    s = load_settings(
        write(
            tmp_path,
            f'[security]\nencryption_key = "{current}"\nprevious_encryption_keys = ["{old}"]\n',
        )
    )
    out = masked(s)
    assert out["security"]["encryption_key"] == "********"
    assert out["security"]["previous_encryption_keys"] == ["********"]
    assert current not in repr(out)
    assert old not in repr(out)


def test_key_file_sits_beside_the_sqlite_database(tmp_path: Path) -> None:
    path = write(tmp_path, f'[database]\nurl = "sqlite:///{tmp_path}/x/h.db"\n')
    assert load_settings(path).key_file() == tmp_path / "x" / "h.db.key"


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 2), (3, 3), (4, 4), (64, 4)])
def test_worker_processes_auto_follows_the_usable_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, expected: int
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr("herald.config.sections.CGROUP_ROOT", tmp_path / "no-cgroup")
    assert load_settings().delivery.worker_processes == expected  # the default is auto
    assert load_settings(write(tmp_path, "[delivery]\nworker_processes = 'auto'\n")) == (
        load_settings()
    )
    monkeypatch.setenv("HERALD_DELIVERY__WORKER_PROCESSES", "AUTO")
    assert load_settings().delivery.worker_processes == expected
    monkeypatch.setenv("HERALD_DELIVERY__WORKER_PROCESSES", "3")
    assert load_settings().delivery.worker_processes == 3


@pytest.mark.parametrize(
    ("files", "limit", "workers"),
    [
        ({"cpu.max": "max 100000\n"}, None, 4),  # v2, no quota
        ({"cpu.max": "100000 100000\n"}, 1.0, 1),  # a Kubernetes limit of "1"
        ({"cpu.max": "250000 100000\n"}, 2.5, 2),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None, 4),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0, 3),
        ({"cpu.max": "garbage"}, None, 4),
        ({}, None, 4),
    ],
)
def test_worker_processes_auto_respects_the_cgroup_cpu_quota(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str],
    limit: float | None,
    workers: int,
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert config.cgroup_cpu_limit(tmp_path) == limit
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setattr("herald.config.sections.CGROUP_ROOT", tmp_path)
    assert load_settings().delivery.worker_processes == workers


def test_check_config_prints_no_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`herald check-config` shows every URL without its password: the database's
    (in the userinfo or as a query parameter) and the webhook proxy's."""
    import argparse
    import asyncio

    from herald.cli.ops import cmd_check_config

    def main(path: Path) -> int:
        return asyncio.run(cmd_check_config(load_settings(path), argparse.Namespace()))

    path = write(
        tmp_path,
        '[database]\nurl = "postgresql://herald:Pg-S3cret@db.internal:5432/herald"\n'
        '[delivery]\nwebhook_proxy = "http://squid:Pr0xy-S3cret@proxy.internal:3128"\n'
        f'[security]\nencryption_key_file = "{tmp_path}/herald.key"\n',
    )
    assert main(path) == 0
    out = capsys.readouterr().out
    assert "Pg-S3cret" not in out
    assert "Pr0xy-S3cret" not in out
    assert "postgresql://herald:********@db.internal:5432/herald" in out
    assert "http://squid:********@proxy.internal:3128" in out

    monkeypatch.setenv("HERALD_DATABASE__URL", "postgresql://db/herald?user=h&password=Q-S3cret")
    assert main(path) == 0
    out = capsys.readouterr().out
    assert "Q-S3cret" not in out
    assert "password=********" in out


def test_a_rejected_url_is_echoed_without_its_password(tmp_path: Path) -> None:
    path = write(tmp_path, '[database]\nurl = "mysql://root:My-S3cret@db/herald"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert "My-S3cret" not in err.value.message
    assert "database.url" in err.value.message


@pytest.mark.parametrize(
    ("var", "meant"),
    [
        ("HERALD_DELIVERY_MAX_RETRIES", "HERALD_DELIVERY__MAX_RETRIES"),  # one underscore
        ("HERALD_DATABASE_URL", "HERALD_DATABASE__URL"),
        ("herald_api__listn", "HERALD_API__LISTEN"),
    ],
)
def test_a_mistyped_environment_variable_is_an_error_that_says_what_was_meant(
    monkeypatch: pytest.MonkeyPatch, var: str, meant: str
) -> None:
    monkeypatch.setenv(var, "3")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert var in caught.value.message
    assert f"did you mean {meant}?" in caught.value.message


def test_other_herald_variables_are_left_alone() -> None:
    env = {"HERALD_REQUIRE_SERVICES": "1", "HERALD_BENCH_POSTGRES": "x", "HERALD_API": "{}"}
    assert config.mistyped_variables(env) == []
    assert config.mistyped_variables({"HERALD_LOG__LEVEL": "debug"}) == []


def test_an_unknown_key_in_the_file_suggests_the_nearest(tmp_path: Path) -> None:
    path = tmp_path / "herald.toml"
    path.write_text("[delivery]\nmax_retrys = 3\n[relais]\nbatch_size = 1\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert "delivery.max_retrys: unknown key; did you mean delivery.max_retries?" in (
        caught.value.message
    )
    assert "relais: unknown key; did you mean relay?" in caught.value.message


def test_operator_secrets_are_every_url_password_and_the_keys(tmp_path: Path) -> None:
    from herald.crypto import generate_key

    key = generate_key()
    settings = Settings.model_validate(
        {
            "database": {"url": "postgresql://db/herald?user=h&password=Q%2BS3cret"},
            "delivery": {"webhook_proxy": "http://squid:Pr0xy%2FS3cret@proxy.internal:3128"},
            "security": {"previous_encryption_keys": [key]},
        }
    )
    secrets = operator_secrets(settings)
    assert {"Q%2BS3cret", "Q+S3cret", "Pr0xy%2FS3cret", "Pr0xy/S3cret", key} <= set(secrets)
    # The Basic credentials a proxy is sent, base64 of "squid:Pr0xy/S3cret".
    assert "c3F1aWQ6UHIweHkvUzNjcmV0" in secrets
    assert operator_secrets(Settings()) == ()


def test_the_redactor_masks_operator_secrets_and_any_url_password() -> None:
    redact = Redactor.of(
        Settings.model_validate({"delivery": {"webhook_proxy": "http://squid:Pr0xy%2FS3cret@p:1"}})
    )
    assert redact(None) is None
    assert redact("HTTP 503") == "HTTP 503"
    assert redact("refused: Pr0xy/S3cret and c3F1aWQ6UHIweHkvUzNjcmV0") == (
        "refused: ******** and ********"
    )
    # A URL's password is masked even when it is nobody's known secret.
    assert redact("url='amqp://guest:Other-S3cret@mq:5672/'") == (
        "url='amqp://guest:********@mq:5672/'"
    )
    assert redact("connect to host 127.0.0.1:9 ssl:default") == (
        "connect to host 127.0.0.1:9 ssl:default"
    )
