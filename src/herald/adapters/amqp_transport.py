"""How Herald's AMQP connections reach a broker: the socket goes to the address the
egress check pinned (never the name), TLS still verifies the broker's name, and
frames are read with a bound.

aiormq opens its socket through a ``transport_factory`` (its documented hook), and
aio-pika passes on only the connection parameters it declares:
:func:`pinned_connection_class` declares that one, and :class:`PinnedTransport` is
the factory. Used by :mod:`herald.adapters.rabbitmq`.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from typing import TYPE_CHECKING, Any

# aio-pika takes about 0.1 s to import: it is imported where it is used, so a process
# with no RabbitMQ destination (and every CLI command) never pays.
if TYPE_CHECKING:
    import aio_pika

MAX_FRAME_BYTES = 8 * 1024 * 1024
"""Largest AMQP frame Herald reads (brokers negotiate 128 KiB by default): a peer that
announces more is not a broker Herald talks to."""


class BoundedReader(asyncio.StreamReader):
    """A stream reader that refuses to wait for a frame larger than MAX_FRAME_BYTES.

    aiormq reads a frame by its declared length (``readexactly``) without a bound, so
    a peer that declares a frame of gigabytes and streams it would make Herald buffer
    all of it (about 1 GB in 3 s on loopback) before the attempt's deadline ends it.
    """

    async def readexactly(self, n: int) -> bytes:
        if n > MAX_FRAME_BYTES:
            raise ConnectionError(
                f"the peer announced a frame of over {MAX_FRAME_BYTES} bytes ({n} to read);"
                " not an AMQP broker Herald talks to"
            )
        return await super().readexactly(n)


class PinnedTransport:
    """aiormq's transport factory (its documented ``transport_factory`` hook): the
    socket goes to the checked ``addresses`` — the pinned one, then the others the
    same check permitted, in turn, as asyncio would try a name's addresses — and TLS
    verifies ``server_hostname`` (the broker's name); frames are read through
    :class:`BoundedReader`."""

    def __init__(
        self,
        addresses: list[str],
        context: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> None:
        self._addresses = addresses
        self._context = context
        self._server_hostname = server_hostname

    async def create(
        self, url: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        from aiormq.exceptions import AMQPConnectionError

        loop = asyncio.get_running_loop()
        failure: OSError | None = None
        for address in self._addresses:
            reader = BoundedReader(limit=2**16, loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            try:
                transport, _ = await loop.create_connection(
                    functools.partial(_as_is, protocol),
                    address,
                    url.port,
                    ssl=self._context,
                    server_hostname=self._server_hostname if self._context is not None else None,
                )
            except OSError as exc:
                failure = exc
                continue
            return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
        assert failure is not None
        raise AMQPConnectionError(*failure.args) from failure


def _as_is(value: Any) -> Any:
    return value


@functools.cache
def pinned_connection_class() -> type[aio_pika.RobustConnection]:
    """aio-pika's robust connection, also passing ``transport_factory`` on to aiormq.

    aio-pika forwards to aiormq only the connection parameters it declares
    (``PARAMETERS``, its extension point); aiormq opens the socket through the
    ``transport_factory`` it is given.
    """
    import aio_pika
    from aio_pika.abc import ConnectionParameter

    class Connection(aio_pika.RobustConnection):
        PARAMETERS = (
            *aio_pika.RobustConnection.PARAMETERS,
            ConnectionParameter(name="transport_factory", parser=_as_is, is_kwarg=True),
        )

    return Connection
