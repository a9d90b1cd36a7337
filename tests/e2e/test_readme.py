"""The README's walk-through, run as written: its commands are read out of README.md,
not copied here, so the README cannot drift from what works.

The walk-through marks its steps with HTML comments that a reader never sees:

- ``<!-- walk: background NAME ready=URL|tcp:HOST:PORT -->`` before a block: a
  terminal left running (the daemon, the receiver), ready when the URL answers 200
  or the port accepts;
- ``<!-- walk: run -->`` before a block: the terminal where commands are typed;
  they must succeed, and variables they set stay set for the next blocks;
- ``<!-- walk: wait NAME="TEXT" -->``: until a background terminal has printed TEXT;
- ``<!-- walk: wait sql="SELECT COUNT(*) …" -->``: until the query counts more than 0
  in the walk-through's database (what a reader watches happen);
- ``<!-- walk: wait http=URL -->``: until the URL answers 200 (a page to open);
- ``<!-- walk: stop NAME -->`` and ``<!-- walk: restart NAME -->``: Ctrl-C in that
  terminal, and its command again.

It runs in a scratch directory with the repository's Makefile, pyproject.toml and
config.example.toml and the repository's ``.venv`` (which ``make test`` has just
installed), on the README's own ports, 8080 and 9000.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^\s*<!-- walk: (.+?) -->\s*$")
FENCE = re.compile(r"^\s*```")
WAIT_SECONDS = 60.0


@dataclass
class Step:
    action: str
    args: list[str]
    block: str | None = None


def walkthrough(readme: str) -> list[Step]:
    """The marked steps of the README's "Five minutes" section, with their blocks."""
    start = readme.index("## Five minutes with Herald")
    end = readme.index("\n## ", start + 1)
    lines = readme[start:end].splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        i += 1
        if not m:
            continue
        action, *args = shlex.split(m[1])
        step = Step(action, args)
        if action in ("background", "run"):
            while not FENCE.match(lines[i]):
                assert not MARK.match(lines[i]), f"no block after <!-- walk: {m[1]} -->"
                i += 1
            body = []
            i += 1
            while not FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            i += 1
            step.block = textwrap.dedent("\n".join(body)) + "\n"
        steps.append(step)
    return steps


@dataclass
class Terminal:
    name: str
    block: str
    ready: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Walk:
    cwd: Path
    env: dict[str, str]
    terminals: dict[str, Terminal] = field(default_factory=dict)
    state: Path = field(init=False)
    transcript: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = self.cwd / ".walk-state.sh"
        self.state.write_text("")

    def start(self, name: str, block: str, ready: str) -> None:
        log = self.cwd / f".walk-{name}.log"
        fh = log.open("ab")
        proc = subprocess.Popen(
            ["bash", "-e", "-c", block],
            cwd=self.cwd,
            env=self.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal would be
        )
        fh.close()
        self.terminals[name] = Terminal(name, block, ready, proc, log)
        self.until(lambda: self.ready(ready), f"{name} ready at {ready}", name)

    def ready(self, target: str) -> bool:
        try:
            if target.startswith("tcp:"):
                _, host, port = target.split(":")
                with socket.create_connection((host, int(port)), timeout=1):
                    return True
            with urllib.request.urlopen(target, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self, name: str, sig: signal.Signals = signal.SIGINT) -> int:
        term = self.terminals[name]
        if term.proc.poll() is None:
            os.killpg(term.proc.pid, sig)
        try:
            return term.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(term.proc.pid, signal.SIGKILL)
            return term.proc.wait(timeout=10)

    def run(self, block: str) -> str:
        script = f"set -a\nsource {self.state}\n{block}\nexport -p > {self.state}\n"
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.transcript.append(f"$ {block}{proc.stdout}{proc.stderr}")
        assert proc.returncode == 0, f"this README step failed:\n{block}\n{self.context()}"
        return proc.stdout

    def until(self, check: object, what: str, name: str | None = None) -> None:
        assert callable(check)
        deadline = time.monotonic() + WAIT_SECONDS
        while not check():
            if name is not None and self.terminals[name].proc.poll() is not None:
                raise AssertionError(f"{name} exited while waiting for {what}\n{self.context()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {what}\n{self.context()}")
            time.sleep(0.1)

    def count(self, sql: str) -> int:
        db = sqlite3.connect(f"file:{self.cwd / 'herald.db'}?mode=ro", uri=True)
        try:
            return int(db.execute(sql).fetchone()[0])
        finally:
            db.close()

    def context(self) -> str:
        parts = ["--- commands so far:", *self.transcript[-4:]]
        for term in self.terminals.values():
            parts += [f"--- {term.name}:", term.output()[-3000:]]
        return "\n".join(parts)


def scratch(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "config.example.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    # The repository's .venv, which make test has just brought up to date; its
    # pyproject.toml dated back so that make run never reinstalls from here.
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    os.utime(tmp_path / "pyproject.toml", (0, 0))
    return tmp_path


def test_the_walkthrough_parses_into_steps() -> None:
    steps = walkthrough((ROOT / "README.md").read_text())
    actions = [s.action for s in steps]
    assert actions[:2] == ["background", "background"], actions
    assert {"run", "wait", "stop", "restart"} <= set(actions)
    assert all(s.block for s in steps if s.action in ("background", "run"))


def test_the_readme_walkthrough_works_as_written(tmp_path: Path) -> None:
    for port in (8080, 9000):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"port {port}, which the README uses, is taken on this machine")
    env = {
        k: v
        for k, v in os.environ.items()
        # A fresh terminal: no Herald settings, no parent make's job server.
        if not k.upper().startswith("HERALD_") and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }
    walk = Walk(scratch(tmp_path), env)
    try:
        for step in walkthrough((ROOT / "README.md").read_text()):
            if step.action == "background":
                name, ready = step.args[0], step.args[1].removeprefix("ready=")
                assert step.block is not None
                walk.start(name, step.block, ready)
            elif step.action == "run":
                assert step.block is not None
                walk.run(step.block)
            elif step.action == "wait":
                key, _, text = step.args[0].partition("=")
                if key == "sql":
                    walk.until(lambda text=text: walk.count(text) > 0, f"{text} > 0")
                elif key == "http":
                    walk.until(lambda text=text: walk.ready(text), f"{text} answering 200")
                else:
                    out = walk.terminals[key].output
                    walk.until(lambda out=out, text=text: text in out(), repr(text), key)
            elif step.action == "stop":
                walk.stop(step.args[0])
            elif step.action == "restart":
                term = walk.terminals[step.args[0]]
                walk.start(term.name, term.block, term.ready)
            else:
                raise AssertionError(f"unknown walk-through step {step.action!r}")
        receiver = walk.terminals["receiver"].output()
        assert "refused" not in receiver, receiver
        for n in (1, 2, 3):
            assert f"'task_run_id': 'trun_{n}'" in receiver, receiver
    finally:
        for name in list(walk.terminals)[::-1]:
            walk.stop(name, signal.SIGTERM)
    assert "Traceback" not in walk.terminals["daemon"].output(), walk.context()


def test_the_outbox_python_snippet_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The outbox") :]
    snippet = section[section.index("```python\n") + len("```python\n") :]
    snippet = snippet[: snippet.index("```")]
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "herald"), "migrate"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.upper().startswith("HERALD_")},
    )
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", snippet],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    event_id = proc.stdout.strip()
    assert event_id.startswith("evt_"), proc.stdout
    db = sqlite3.connect(tmp_path / "herald.db")
    try:
        rows = db.execute("SELECT tenant_id, type FROM herald_outbox WHERE id = ?", (event_id,))
        assert rows.fetchall() == [("org_42", "task_run.completed")]
    finally:
        db.close()
