"""One exception hierarchy: every refusal says what was wrong and how to fix it."""
from __future__ import annotations


class NdcostError(Exception):
    """Base of every error ndcost raises on purpose; the CLI prints it as one line, exit 1."""


class InvalidValue(NdcostError, ValueError):
    """A value (a strategy field, a model width, a spec entry) outside what is allowed."""


class UnknownKey(NdcostError, KeyError):
    """A lookup of a name nobody registered; the message lists the closest known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RegistrationError(NdcostError):
    """A plugin registered a bad key, or a key another plugin holds without declaring override."""


class PluginLoadError(NdcostError):
    """A plugin failed to import (raised under NDCOST_STRICT_PLUGINS=1, else a warning)."""


class StalePluginSet(NdcostError):
    """An essential built-in plugin is missing: the installed metadata is older than the source."""


class Unpriced(NdcostError):
    """A quantity nobody priced: reported, never counted as zero."""


class InvalidStrategy(InvalidValue):
    """A strategy that cannot run on the model it is priced for."""


class CensusUnavailable(NdcostError, RuntimeError):
    """A census cannot run here: no kernel contract states what the run's kernels save."""


class NoValidStrategy(InvalidStrategy):
    """A search whose space holds no strategy that runs and fits: the message names what removed the last."""


class MissingExtra(NdcostError, ImportError):
    """An optional feature whose extra is not installed; the message names the extra to install."""
