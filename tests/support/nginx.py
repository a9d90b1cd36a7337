"""nginx as a fast webhook receiver for load tests: answers 204 and logs every request.

Python receivers in the test process would be the bottleneck (and share the
cores with the daemons under test); nginx is not. Each request is logged as
``path webhook-id`` so a test can count arrivals per destination exactly.
``scripts/test-services.sh`` installs nginx when it is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.support.daemon import free_port

CONFIG = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    log_format arrivals '$uri $http_webhook_id';
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    {pace}
    server {{
        listen 127.0.0.1:{port};
        access_log {dir}/arrivals.log arrivals buffer=64k flush=100ms;
        {location}
    }}
}}
"""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


class Nginx:
    """``per_second`` paces answers with nginx's ``limit_req`` (delayed, never refused):
    a test that must interrupt a run part-way keeps that run long enough to do so."""

    def __init__(self, *, per_second: int | None = None) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (scripts/test-services.sh installs it)")
        self.dir = Path(tempfile.mkdtemp(prefix="herald-nginx-"))
        self.port = free_port()
        pace, location = "", "location / { return 204; }"
        if per_second is not None:
            # One bucket for all requests; a burst far above the in-flight count means
            # requests wait their turn instead of getting a 503. `return` runs before
            # limit_req's phase, so the answer comes from a named location after it.
            pace = f"limit_req_zone $server_port zone=pace:1m rate={per_second}r/s;"
            location = (
                "location / { limit_req zone=pace burst=100000; try_files /.none @ok; }\n"
                "        location @ok { return 204; }"
            )
        (self.dir / "nginx.conf").write_text(
            CONFIG.format(dir=self.dir, port=self.port, pace=pace, location=location)
        )
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not (self.dir / "nginx.pid").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.dir / "error.log").read_text(errors="replace"))
            time.sleep(0.02)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def arrivals(self) -> Counter[tuple[str, str]]:
        """(path, webhook-id) → how many times it arrived."""
        log = self.dir / "arrivals.log"
        if not log.exists():
            return Counter()
        out: Counter[tuple[str, str]] = Counter()
        for line in log.read_text().splitlines():
            path, _, webhook_id = line.partition(" ")
            out[(path, webhook_id)] += 1
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: flushes the log buffer
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
