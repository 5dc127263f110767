"""``python -m lmplex``: the same command line as the ``lmplex`` script (see :mod:`lmplex.cli`)."""

from __future__ import annotations

from lmplex.cli import main

raise SystemExit(main())
