"""``python -m herald.cli``, as before the command line became a package."""

from __future__ import annotations

from herald.cli import main

raise SystemExit(main())
