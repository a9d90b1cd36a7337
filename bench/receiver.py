"""The webhook receiver under load: nginx answering 204, or an aiohttp fallback process.

nginx runs with a private config in a temp dir (no root-owned paths) and is
stopped by its PID at the end. When no nginx binary exists, it is installed
from Debian's packages if we are root and apt works (time-boxed); otherwise,
or when that fails, a minimal aiohttp server runs in a separate process.

Both write an access log of ``$msec $status $uri $http_webhook_id`` lines
(nginx: buffered, flushed every second; ``$msec`` is the millisecond wall
clock at the end of the request), which :class:`AccessLog` reads
incrementally: arrival time per webhook id, and counts by path.

``python -m bench.receiver --port P [--delay S] [--access-log F]`` is the
aiohttp server; with ``--delay`` it is the slow receiver of the isolation
benchmark (nginx cannot delay a response).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO_ROOT, BenchError, Child, free_port, log, wait_port

NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
INSTALL_TIMEOUT = 240.0
START_TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class Receiver:
    kind: str
    """``nginx`` or ``aiohttp``."""
    url: str
    note: str = ""
    access_log: Path | None = None
    pid: int | None = None
    """The receiver's process (nginx's master; its worker is its child)."""

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT`` (append any path: every path answers 204)."""
        return self.url.rsplit("/", 1)[0]


@dataclass(frozen=True, slots=True)
class Hit:
    """One access-log line."""

    ts: float
    status: int
    uri: str
    webhook_id: str


class AccessLog:
    """Reads a receiver's access log incrementally (only complete lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[Hit]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        hits = []
        for line in lines:
            parts = line.decode("utf-8", "replace").split(" ")
            if len(parts) == 4 and parts[1].isdigit():
                hits.append(Hit(float(parts[0]), int(parts[1]), parts[2], parts[3]))
        return hits


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_PATHS if os.access(p, os.X_OK)), None)


def _apt(args: list[str], timeout: float) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        proc = subprocess.run(
            ["apt-get", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        log(f"apt-get {' '.join(args)}: {exc}")
        return False
    if proc.returncode != 0:
        log(f"apt-get {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return proc.returncode == 0


def install_nginx(timeout: float = INSTALL_TIMEOUT) -> str | None:
    """Install Debian's nginx when root and apt-get exist; None when that is not possible."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None
    log("nginx not found; installing Debian's nginx-light with apt-get (time-boxed)")
    third = timeout / 3
    install = ["install", "-y", "-q", "--no-install-recommends"]
    for attempt in range(2):
        for package in ("nginx-light", "nginx"):
            if _apt([*install, package], third) and (found := find_nginx()):
                return found
        if attempt == 0 and not _apt(["update", "-q"], third):
            break
    return None


_NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    log_format bench '$msec $status $uri $http_webhook_id';
    access_log {tmp}/access.log bench buffer=256k flush=1s;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            return 204;
        }}
    }}
}}
"""


@contextlib.contextmanager
def _nginx(binary: str, workdir: Path) -> Iterator[Receiver]:
    tmp = workdir / "nginx"
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(_NGINX_CONF.format(tmp=tmp, port=port))
    argv = [binary, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")]
    child = Child("nginx", argv, log_path=tmp / "stdout.log", group=True)
    try:
        try:
            wait_port(port, timeout=START_TIMEOUT, alive=child.alive)
        except BenchError as exc:
            raise BenchError(f"nginx did not start: {exc}\n{child.log_tail()}") from exc
        yield Receiver(
            "nginx",
            f"http://127.0.0.1:{port}/hook",
            access_log=tmp / "access.log",
            pid=child.pid,
        )
    finally:
        child.stop(timeout=10)


@contextlib.contextmanager
def aiohttp_receiver(
    workdir: Path,
    note: str = "",
    *,
    delay: float = 0.0,
    delay_prefix: str = "",
    name: str = "receiver",
) -> Iterator[Receiver]:
    """The aiohttp server in its own process; answers 204, after ``delay`` seconds to
    requests whose ``webhook-id`` starts with ``delay_prefix``."""
    port = free_port()
    access_log = workdir / f"{name}-access.log"
    argv = [sys.executable, "-m", "bench.receiver", "--port", str(port)]
    argv += ["--delay", str(delay), "--delay-prefix", delay_prefix]
    argv += ["--access-log", str(access_log)]
    child = Child(name, argv, log_path=workdir / f"{name}.log", cwd=REPO_ROOT)
    try:
        try:
            wait_port(port, timeout=START_TIMEOUT, alive=child.alive)
        except BenchError as exc:
            raise BenchError(f"aiohttp receiver did not start: {exc}\n{child.log_tail()}") from exc
        yield Receiver("aiohttp", f"http://127.0.0.1:{port}/hook", note, access_log, pid=child.pid)
    finally:
        child.stop(timeout=10)


@contextlib.contextmanager
def start(mode: str, workdir: Path) -> Iterator[Receiver]:
    """A running receiver; ``mode`` is ``auto``, ``nginx`` or ``aiohttp``."""
    note = ""
    if mode in ("auto", "nginx"):
        binary = find_nginx() or install_nginx()
        if binary is not None:
            with _nginx(binary, workdir) as receiver:
                yield receiver
            return
        if mode == "nginx":
            raise BenchError("nginx is not installed and could not be installed")
        note = "nginx unavailable (not installed, install not possible): aiohttp fallback"
        log(note)
    with aiohttp_receiver(workdir, note) as receiver:
        yield receiver


# --- the fallback server (child process) -------------------------------------------
def serve(
    port: int, *, delay: float = 0.0, delay_prefix: str = "", access_log: Path | None = None
) -> None:
    """Answer every request with 204 on 127.0.0.1:``port`` until killed; after ``delay``
    seconds when its ``webhook-id`` starts with ``delay_prefix`` (so a verification ping
    can be answered at once)."""
    import asyncio
    import time

    from aiohttp import web

    lines: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        webhook_id = request.headers.get("webhook-id", "-")
        if delay > 0 and webhook_id.startswith(delay_prefix):
            await asyncio.sleep(delay)
        if access_log is not None:
            lines.append(f"{time.time():.3f} 204 {request.path} {webhook_id}\n")
        return web.Response(status=204)

    async def flush_forever() -> None:
        assert access_log is not None
        with access_log.open("a") as fh:
            while True:
                await asyncio.sleep(0.5)
                if lines:
                    fh.write("".join(lines))
                    lines.clear()
                    fh.flush()

    async def start_flusher(app: web.Application) -> None:
        if access_log is not None:
            tasks.append(asyncio.get_running_loop().create_task(flush_forever()))

    app = web.Application(client_max_size=2**20)
    app.on_startup.append(start_flusher)
    app.router.add_route("*", "/{tail:.*}", hook)
    loop = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=loop)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--delay-prefix", default="")
    parser.add_argument("--access-log", type=Path, default=None)
    args = parser.parse_args()
    serve(args.port, delay=args.delay, delay_prefix=args.delay_prefix, access_log=args.access_log)


if __name__ == "__main__":
    main()
