"""Kernel contracts: fake kernels that stand for device kernels this host cannot run.

A contract states, for one device kernel, its outputs and exactly what it
saves for the backward, as ``torch.library`` custom ops with a fake
implementation and an autograd formula. The census runs a layer on fake
tensors under the contracts its runtime profile names, so what it counts is
what the device run keeps, not what a CPU fallback would.

A contract is registered as ``contract/<name>`` with a :class:`Contract`,
a torch-free descriptor: importing ndcost never imports torch. Its
implementation, a :class:`KernelContract`, is imported by
:meth:`Contract.load` when a census runs. How to add one: docs/contracts.md.
"""
from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any, ContextManager, Dict, Mapping, Optional, Tuple

import attrs

from ndcost.errors import InvalidValue, NdcostError

_LOADED: Dict[str, "KernelContract"] = {}
_LOCK = threading.Lock()


@attrs.frozen(kw_only=True)
class Site:
    """Where a contract is installed for one census run: the config, the modeling module, the module tree."""

    config: Any
    modeling: Any
    root: Any
    runtime: Any = None


@attrs.frozen(kw_only=True)
class FlopCount:
    """Forward FLOPs of one contract op: the part they belong to, as the kernel runs them and at all pairs."""

    part: str
    flops: int
    all_pairs_flops: int


class KernelContract:
    """The torch side of a contract; subclasses override what their kernel needs.

    ``stands_for`` maps each custom op of the contract (an ``OpOverload``) to
    the name of the runtime operator it stands for (``"aten._scaled_dot_product_cudnn_attention"``),
    so a selective-checkpoint policy decides on the contract op as it decides on
    that operator.
    """

    name: str = ""

    def stands_for(self) -> Mapping[Any, str]:
        """``{custom op: runtime operator name}`` for the checkpoint policies."""
        return {}

    def install(self, site: Site) -> ContextManager[None]:
        """Make the modules at *site* call this contract's ops while the context lasts."""
        return contextlib.nullcontext()

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        """The op of ``ndcost.OPS`` a tensor saved by *func* (one of this contract's ops) belongs to, or None."""
        return None

    def flops(self, func: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> Optional[FlopCount]:
        """Forward FLOPs of *func* if it is one of this contract's forward ops, else None."""
        return None

    def flop_formulas(self) -> Mapping[Any, Any]:
        """``{OpOverloadPacket: formula}`` in ``torch.utils.flop_counter`` form (shape arguments, ``out_shape``)."""
        return {}

    def part(self, func: Any) -> Optional[str]:
        """The FLOP part (``scores``, ``linrec``, ...) an op of this contract runs for, or None for the module's."""
        return None


@attrs.frozen(kw_only=True)
class Contract:
    """A registered kernel contract: a name, what it stands for, and where its torch implementation lives.

    ``implementation`` is ``"package.module:attribute"``, a zero-argument
    callable returning the :class:`KernelContract`, imported only when a
    census runs. ``saves`` says in words what the kernel keeps, for listings.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_.\-]*$"))
    summary: str
    implementation: str = attrs.field(validator=attrs.validators.matches_re(r"^[\w.]+:[\w.]+$"))
    saves: str = ""
    device: str = ""

    def load(self) -> KernelContract:
        """The contract's implementation (imports torch on first use)."""
        with _LOCK:
            found = _LOADED.get(self.implementation)
            if found is None:
                module, _, attribute = self.implementation.partition(":")
                try:
                    target = importlib.import_module(module)
                    for name in attribute.split("."):
                        target = getattr(target, name)
                except (ImportError, AttributeError) as exc:
                    raise NdcostError(
                        f"contract {self.name!r}: cannot import its implementation {self.implementation!r} "
                        f"({exc}); reinstall the distribution that registers it") from exc
                found = target()
                if not isinstance(found, KernelContract):
                    raise InvalidValue(f"contract {self.name!r}: {self.implementation} returned "
                                       f"{type(found).__name__}, not a KernelContract")
                _LOADED[self.implementation] = found
            return found


def contract_key(name: str) -> str:
    """The registry key of contract *name*."""
    return f"contract/{name}"
