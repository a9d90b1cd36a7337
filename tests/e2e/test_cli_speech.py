"""The CLI speaks like the rest: a close match for a mistyped word, a hint that fits
each usage error, help for a bare ``herald``, a clean stdout, and a ``check-config``
that never says OK when ``run`` would fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Herald

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    """One ``herald run`` on SQLite, for what a second one would meet."""
    h = Herald(tmp_path_factory.mktemp("daemon"), None, database_url=None)
    h.start()
    yield h
    h.kill()


ENV = {k: v for k, v in os.environ.items() if not k.startswith("HERALD_")}


def run_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "herald", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**ENV, **(env or {})},
    )


def error_and_hint(proc: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """The usage error's two lines: what is wrong, and what to do (after argparse's usage)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("herald: ")]
    assert len(lines) == 2, proc.stderr
    error, hint = lines
    assert error.startswith("herald: error: "), proc.stderr
    assert hint.startswith("herald: hint: "), proc.stderr
    return error.removeprefix("herald: error: "), hint.removeprefix("herald: hint: ")


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["destination", "list"], "did you mean 'destinations'?"),
        (["delivery", "list"], "did you mean 'deliveries'?"),
        (["replays", "lst"], "did you mean 'list'?"),
        (["destinations", "lsit"], "did you mean 'list'?"),
        (["destinations", "list", "--stauts", "active"], "did you mean '--status'?"),
        (["deliveries", "list", "--sinse", "1h"], "did you mean '--since'?"),
        (["deliveries", "list", "--status", "failed"], "did you mean 'failure'?"),
    ],
)
def test_a_mistyped_word_gets_its_close_match(tmp_path: Path, args: list[str], wanted: str) -> None:
    proc = run_cli(tmp_path, *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    _, hint = error_and_hint(proc)
    assert hint == wanted


def test_the_internal_worker_command_is_never_offered(tmp_path: Path) -> None:
    error, _ = error_and_hint(run_cli(tmp_path, "wrker"))
    assert "choose from run, migrate" in error
    assert "worker" not in error


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        # Each hint fits its error: not "printable characters" for a missing evt_,
        # not "--help" for a malformed time.
        (["emit", "order.paid", "--data", "{}", "--id", "ord_1"], "starts with 'evt_'"),
        (["deliveries", "list", "--since", "yesterday"], "RFC 3339"),
        (["replay", "--status", "failure", "--since", "soon", "--dry-run"], "RFC 3339"),
        (["keys"], "'herald keys' with --help"),
        (["deliveries", "show", "dlv_1", "extra"], "'herald deliveries show' with --help"),
        (["emit", "order.paid", "--data", "[1"], "well-formed JSON"),
    ],
)
def test_every_usage_error_is_followed_by_a_hint_that_fits_it(
    tmp_path: Path, args: list[str], wanted: str
) -> None:
    config = tmp_path / "herald.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/herald.db"\n')
    needs_config = args[0] not in ("keys",) and "extra" not in args
    proc = run_cli(tmp_path, *args, *(["--config", str(config)] if needs_config else []))
    assert proc.returncode == 2, proc.stderr
    _, hint = error_and_hint(proc)
    assert wanted in hint, hint


def test_a_loopback_target_is_told_about_allow_private_networks(tmp_path: Path) -> None:
    config = tmp_path / "herald.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/herald.db"\n')
    body = '{"name": "x", "type": "webhook", "events": ["*"], "webhook": {"url": "http://127.0.0.1:9/"}}'
    proc = run_cli(tmp_path, "destinations", "create", "--data", body, "--config", str(config))
    assert proc.returncode == 2
    error, hint = error_and_hint(proc)
    assert "127.0.0.1" in error
    assert "security.allow_private_networks" in hint


def test_bare_herald_prints_its_help(tmp_path: Path) -> None:
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: herald")
    assert "destinations" in proc.stdout
    assert "worker" not in proc.stdout


def test_stdout_holds_only_the_output_and_stderr_only_the_audit_line(tmp_path: Path) -> None:
    config = tmp_path / "herald.toml"
    config.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/herald.db"\n'
        "[security]\nallow_private_networks = true\n"
    )
    body = '{"name": "x", "type": "webhook", "events": ["*"], "webhook": {"url": "http://127.0.0.1:9/"}}'
    created = run_cli(
        tmp_path, "destinations", "create", "--data", body, "--config", str(config), "--json"
    )
    assert created.returncode == 0, created.stderr
    dest = json.loads(created.stdout)  # stdout is the JSON, and nothing else
    logged = [json.loads(line) for line in created.stderr.splitlines()]
    assert [line["event"] for line in logged] == ["destination_created"]

    quiet = run_cli(tmp_path, "destinations", "verify", dest["id"], "--config", str(config))
    assert quiet.returncode == 0, quiet.stderr
    events = [json.loads(line)["event"] for line in quiet.stderr.splitlines()]
    assert "verification_requested" not in events
    assert all(not line.startswith("{") for line in quiet.stdout.splitlines())

    verbose = run_cli(
        tmp_path, "destinations", "verify", dest["id"], "--config", str(config), "--verbose"
    )
    assert verbose.returncode == 0, verbose.stderr
    events = [json.loads(line)["event"] for line in verbose.stderr.splitlines()]
    assert "verification_requested" in events


def test_check_config_never_says_ok_when_run_would_fail(daemon: Herald) -> None:
    proc = daemon.cli("check-config", check=False)
    assert proc.returncode == 1, proc.stdout
    verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict.startswith("NOT OK"), verdict
    assert "api.listen" in verdict
    assert "another herald run" in verdict
    found = json.loads(daemon.cli("check-config", "--json", check=False).stdout)
    assert found["ok"] is False
    assert len(found["blockers"]) == 2


def test_a_second_run_is_told_what_to_do_not_to_fix_a_setting(daemon: Herald) -> None:
    proc = daemon.cli("run", check=False)
    assert proc.returncode == 2
    line = json.loads(proc.stderr.strip().splitlines()[-1])
    assert "another herald run" in line["error"]
    assert line["hint"].startswith("Stop the other herald run")


def test_a_port_in_use_is_named_with_the_setting_that_moves_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "herald.toml"
        config.write_text(
            f'[database]\nurl = "sqlite:///{tmp_path}/herald.db"\n'
            f'[api]\nlisten = "127.0.0.1:{port}"\n[log]\nformat = "json"\n'
        )
        proc = run_cli(tmp_path, "run", "--config", str(config))
    assert proc.returncode == 2
    line = json.loads(proc.stderr.strip().splitlines()[-1])
    assert f"127.0.0.1:{port}" in line["error"]
    assert "HERALD_API__LISTEN" in line["hint"]
