"""The store's part for outbox sources (producers' own databases, ``[[outbox.sources]]``):
the commit of rows read from a source, and the lease that lets one instance at a time
relay each source."""

from __future__ import annotations

import time
from collections.abc import Sequence

from herald.model import DEFAULT_TENANT, OutboxRow, RelayPlan
from herald.store.base import RelayProcessor
from herald.store.dialect import Conn
from herald.store.part import StorePart

StoredEvents = dict[tuple[str, str], tuple[str, str]]
"""(tenant, id) -> (type, data) of the events stored under a batch's ids."""


def same_event(row: OutboxRow, stored: StoredEvents) -> bool:
    """Whether ``row`` is an event already stored as it is (the same tenant, id, type
    and data): one a relay committed before the row's delete from its source was lost."""
    if row.id is None or row.type is None or row.data is None:
        return False
    tenant = DEFAULT_TENANT if row.tenant_id is None else row.tenant_id.decode("utf-8", "replace")
    found = stored.get((tenant, row.id.decode("utf-8", "replace")))
    return found is not None and found == (
        row.type.decode("utf-8", "replace"),
        row.data.strip().decode("utf-8", "replace"),
    )


class SourceStore(StorePart):
    """Rows of outbox sources in, and who relays each source."""

    async def relay_source(
        self,
        source: str,
        rows: Sequence[OutboxRow],
        process: RelayProcessor,
        *,
        destinations_version: int | None = None,
        ordered: bool = False,
    ) -> tuple[RelayPlan, list[OutboxRow]] | None:
        """Commit ``process``'s plan for rows read from the outbox source ``source`` in
        one transaction, as :meth:`relay` does for Herald's own outbox (rejected rows
        are stored naming ``source``). Returns the plan and the rows left out of it
        because their events are already stored as they are (relayed before a crash
        that lost the source's delete); the caller then deletes every row from the
        source. None, with nothing written, when destinations changed since
        ``destinations_version`` (refresh the catalog and try again). ``ordered``: as
        :meth:`relay`'s, the order lock first."""
        d = self.dialect

        async def batch(c: Conn) -> tuple[RelayPlan, list[OutboxRow]] | None:
            if not await self._relay_fence(
                c, ordered=ordered, destinations_version=destinations_version
            ):
                return None
            ids = [r.id.decode("utf-8", "replace") for r in rows if r.id is not None]
            stored: StoredEvents = {
                (str(t), str(i)): (str(ty), str(data))
                for t, i, ty, data in await d.fetch(c, "source_existing", ids)
            }
            fresh: list[OutboxRow] = []
            relayed: list[OutboxRow] = []
            for row in rows:
                (relayed if same_event(row, stored) else fresh).append(row)
            plan = process(fresh, set(stored))
            now = time.time()
            await self._write_plan(c, plan, now, source)
            return plan, relayed

        return await d.transact(batch)

    async def source_lease(self, source: str, owner: str, *, until: float, now: float) -> bool:
        """Take or renew ``owner``'s lease on relaying ``source``; False while another
        instance holds an unexpired one."""
        async with self.dialect.tx() as c:
            got = await self.dialect.fetchval(c, "source_lease", source, owner, until, now)
            return got is not None

    async def source_release(self, source: str, owner: str) -> None:
        """Give up ``owner``'s lease on ``source`` (a clean stop): another takes it now."""
        async with self.dialect.tx() as c:
            await self.dialect.execute(c, "source_release", source, owner)
