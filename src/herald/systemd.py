"""The sd_notify protocol, for ``Type=notify`` units (no libsystemd needed).

``READY=1`` once serving, ``WATCHDOG=1`` from the main loop while the relay and
workers are alive (when systemd set ``WATCHDOG_USEC``), ``STOPPING=1`` on
shutdown. Outside systemd (no ``NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An abstract socket is spelled with a leading "@" in the variable.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watchdog = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        self.watchdog_interval: float | None = int(usec) / 2e6 if watchdog else None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, *states: str) -> bool:
        """Send ``states`` (e.g. ``READY=1``); False when not under systemd or on error."""
        if not self._address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall("\n".join(states).encode())
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")
