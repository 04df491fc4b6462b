"""``python -m ndcost``: the ``ndcost`` command, for environments whose scripts folder is not on PATH."""
from ndcost.cli import main

raise SystemExit(main())
