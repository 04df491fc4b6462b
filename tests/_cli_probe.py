"""``python -m ndcost ARGS`` as the hostile corpus runs it, telling the test what reached the CLI's generic handler.

The same ``ndcost.cli.main`` as ``python -m ndcost`` (``framework/__main__.py``); an exception other than an
NdcostError that leaves a command (see ``_hostile.escaped_exceptions``) is written, as ``module.type: message``, to
the file ``$NDCOST_PROBE_ESCAPED`` names.
"""
import os
import sys

from _hostile import escaped_exceptions

from ndcost import cli

with escaped_exceptions() as escaped:
    code = cli.main(sys.argv[1:])
if escaped:
    exc = escaped[0]
    with open(os.environ["NDCOST_PROBE_ESCAPED"], "w") as f:
        f.write(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
raise SystemExit(code)
