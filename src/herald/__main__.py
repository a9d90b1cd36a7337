"""``python -m herald`` is the ``herald`` command."""

from __future__ import annotations

from herald.cli import main

raise SystemExit(main())
