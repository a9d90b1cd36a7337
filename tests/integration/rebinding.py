"""A DNS that answers the egress check with one address and every later lookup with another.

The egress policy resolves through its ``resolver`` (:meth:`Rebinding.resolve`): the
first lookup of the name — the check before an attempt — gets ``checked``; any
later one gets ``later``. Lookups that do not go through the policy (an SDK
resolving the name itself, through ``socket.getaddrinfo`` as aio-pika's and
Azure's asyncio transports do) always get ``later``, once :meth:`install` has
patched ``socket.getaddrinfo``; a name that is not patched (gRPC resolves in C)
the system does not know at all. So an SDK that connects to ``checked`` connected
to the address the check pinned, and one that reaches ``later`` (or fails to
resolve) resolved the name again on its own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
from typing import Any

import pytest

from herald.egress import EgressPolicy


def loopback_address() -> str:
    """A random 127.x.y.z other than 127.0.0.1: an address a test can listen on."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


class Rebinding:
    def __init__(self, name: str, checked: str, later: str | None = None) -> None:
        self.name = name
        self.checked = checked
        self.later = later
        self.policy_lookups = 0
        self.sdk_lookups = 0

    def policy(self) -> EgressPolicy:
        """A policy that allows only ``checked`` and resolves through this DNS."""
        return EgressPolicy(
            allowed_networks=(ipaddress.ip_network(self.checked),), resolver=self.resolve
        )

    async def resolve(self, host: str) -> list[str]:
        if host != self.name:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        self.policy_lookups += 1
        if self.policy_lookups == 1 or self.later is None:
            return [self.checked]
        return [self.later]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Answer ``socket.getaddrinfo`` for the name with ``later`` (or no address)."""
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host == self.name:
                self.sdk_lookups += 1
                if self.later is None:
                    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
                return real(self.later, port, *args, **kwargs)
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


class Listener:
    """A TCP port that counts the connections made to it and holds them open, silent."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self.port = port
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> Listener:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
