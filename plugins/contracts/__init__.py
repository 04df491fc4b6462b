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
import functools
import importlib
import inspect
import threading
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

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

    def matmul_flops(self, func: Any, args: Tuple[Any, ...]) -> int:
        """FLOPs of *func* on *args* where it is one of this contract's matmuls (a grouped GEMM), else 0.

        What a selective policy decides on as a matmul, for the shares of
        matmul FLOPs it recomputes; an attention kernel's are its own.
        """
        return 0

    def part(self, func: Any) -> Optional[str]:
        """The FLOP part (``scores``, ``linrec``, ...) an op of this contract runs for, or None for the module's."""
        return None


class OpContract(KernelContract):
    """A contract whose kernel is one custom op (with, where it has one, its backward op), named in *ops*.

    Subclasses name the ops (``forward``, ``backward``, attributes of the
    ``torch.ops`` namespace handed in), the runtime operators they stand for
    (``stands``, in that order), the op of ``ndcost.OPS`` the tensors the
    forward saves belong to (``saves_as``) and the FLOP part both run for
    (``runs_as``); they override what their kernel decides otherwise.
    """

    forward: str = ""
    backward: str = ""
    stands: Tuple[str, ...] = ()
    saves_as: Optional[str] = None
    runs_as: Optional[str] = None

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.forward_op = getattr(ops, self.forward).default
        self.backward_op = getattr(ops, self.backward).default if self.backward else None

    def stands_for(self) -> Mapping[Any, str]:
        return dict(zip((self.forward_op, self.backward_op), self.stands))

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        return self.saves_as if func is self.forward_op else None

    def part(self, func: Any) -> Optional[str]:
        return self.runs_as if func is self.forward_op or (func is self.backward_op and func is not None) else None


@attrs.frozen(kw_only=True)
class Contract:
    """A registered kernel contract: a name, what it stands for, and where its torch implementation lives.

    ``implementation`` is ``"package.module:attribute"``, a zero-argument
    callable returning the :class:`KernelContract`, imported only when a
    census runs. ``saves`` says in words what the kernel keeps, for listings.
    ``attention`` says the kernel is a family's attention function itself
    (installed by a runtime's ``family_contracts`` in place of Transformers'
    eager one): the time model then prices the layer's scores by the
    estimator's FLOPs under this name (its ``kernel_tables.attention`` entry,
    else ``efficiency.attention``), not as eager attention's every pair.
    ``repeats_kv`` says the SDPA calls it answers take keys and values
    repeated to every query head by the caller (torchtitan's ``repeat_kv``):
    the kernel saves, and ring CP passes, a query head's K/V each, not a KV
    head's (``op_records.runtime_repeats_kv``). ``linear_rule`` says it is a
    fused chunked delta-rule kernel standing for Transformers' torch reference
    rule (``op_records.runtime_eager_linear_rule``): the formulas then keep what
    the kernel keeps, not the reference's every chunk.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_.\-]*$"))
    summary: str
    implementation: str = attrs.field(validator=attrs.validators.matches_re(r"^[\w.]+:[\w.]+$"))
    saves: str = ""
    device: str = ""
    attention: bool = False
    repeats_kv: bool = False
    linear_rule: bool = False

    def load(self) -> KernelContract:
        """The contract's implementation (imports torch on first use)."""
        with _LOCK:
            found = _LOADED.get(self.implementation)
            if found is None:
                try:
                    target = import_target(self.implementation)
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


@attrs.frozen(kw_only=True)
class AttentionKernel:
    """An attention implementation the formulas price, registered as ``attention_kernel/<name>``.

    ``name`` is Transformers' ``attn_implementation`` value or a runtime
    profile's kernel (``sdpa``, ``npu_fusion_attention``).
    ``materializes_scores`` says whether the kernel keeps the ``[b, h, s, s]``
    score matrix for the backward (eager does) or only a row's softmax
    statistics (fused kernels); the op records' ``score`` slot prices one or
    the other. ``call`` is the operator an op-level checkpoint policy sees
    for the kernel's forward (the one its contract stands for), so that the
    formulas can price such a policy; None where unstated (the formulas then
    leave the policy unpriced; eager runs matmuls the op records list). The
    plugin that knows the kernel (its contract) registers it, so a new kernel
    needs no edit of the op records.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_.\-]*$"))
    materializes_scores: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    description: str = ""
    call: Optional[str] = None


def attention_kernel_key(name: str) -> str:
    """The registry key of attention kernel *name*."""
    return f"attention_kernel/{name}"


def register_attention_kernels(register: Callable[..., None], kernels: Sequence[AttentionKernel]) -> None:
    """Register each of *kernels* under its key (torch-free, like :func:`register_contracts`)."""
    for kernel in kernels:
        register(attention_kernel_key(kernel.name), kernel)


def contract_key(name: str) -> str:
    """The registry key of contract *name*."""
    return f"contract/{name}"


def import_target(path: str) -> Any:
    """The object ``"package.module:attribute.path"`` names (ImportError or AttributeError where it is not there)."""
    module, _, attribute = path.partition(":")
    target = importlib.import_module(module)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target


def register_contracts(register: Callable[..., None], contracts: Sequence[Contract]) -> None:
    """Register each of *contracts* under its key (a contract module's ``ndcost_register``)."""
    for contract in contracts:
        register(contract_key(contract.name), contract)


# ---------------------------------------------------------------------------
# torch-side machinery the contracts share (each imports torch when called)
# ---------------------------------------------------------------------------
def fake_only_op(qualname: str, schema: str, fake: Callable[..., Any], use: str = "") -> Any:
    """A ``torch.library`` custom op ``namespace::name`` that runs on fake tensors only.

    *fake* gives its outputs' shapes, dtypes and layouts; run on real tensors
    it raises, saying *use* (what to call on the device instead) where given.
    The caller registers its autograd: what the kernel saves is its own.
    """
    import torch

    message = f"{qualname} is a contract for fake tensors only" + (f"; {use}" if use else "")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(message)

    op = torch.library.custom_op(qualname, kernel, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


def register_kernel_autograd(op: Any, backward_op: Any, *, saves: Callable[[Any, Any], Sequence[Any]],
                             options: Callable[[Any], Sequence[Any]], stateless: Sequence[int],
                             kept: Optional[Callable[[Sequence[Any]], Sequence[Any]]] = None) -> None:
    """*op*'s autograd: what its device kernel keeps for the backward, and the backward op it runs.

    ``saves(inputs, output)`` lists exactly the tensors the kernel keeps
    (what the census counts); the outputs at the indices *stateless*
    (statistics, masks, RNG state) take no gradient. The backward runs
    ``backward_op(grad, *kept(saved), *options(inputs))`` (*kept*, where
    given, fills the arguments of what a kernel keeps only sometimes); its
    results are the gradients of the leading inputs, each in its input's
    dtype, and the other inputs take none.
    """

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(*(output[i] for i in stateless))
        # no zero gradients made for the stateless outputs (the device kernel's backward makes none)
        ctx.set_materialize_grads(False)
        ctx.options = tuple(options(inputs))
        ctx.input_dtypes = tuple(getattr(value, "dtype", None) for value in inputs)
        ctx.save_for_backward(*saves(inputs, output))

    def backward(ctx, grad, *_):
        saved = ctx.saved_tensors
        grads = backward_op(grad, *(kept(saved) if kept is not None else saved), *ctx.options)
        grads = [g if g.dtype == dtype else g.to(dtype) for g, dtype in zip(grads, ctx.input_dtypes)]
        return (*grads, *(None,) * (len(ctx.input_dtypes) - len(grads)))

    op.register_autograd(backward, setup_context=setup_context)


def attention_saved_op(tensor: Any, dropout_dtype: Any = None) -> str:
    """The op of ``ndcost.OPS`` a tensor an attention kernel saves belongs to, told by its dtype.

    fp32 is the softmax statistic the backward rebuilds the softmax from,
    *dropout_dtype* (where the kernel draws a dropout mask or RNG state) the
    dropout's, the rest (q, k, v, the output, a bias) the two batched matmuls'.
    """
    import torch

    if tensor.dtype == torch.float32:
        return "softmax"
    if dropout_dtype is not None and tensor.dtype == dropout_dtype:
        return "dropout"
    return "attBMM"


def register_attention_function(name: str, forward: Callable[..., Any]) -> None:
    """Make *name* an attention implementation Transformers accepts, run by *forward*.

    Its mask builder is Transformers' flash-attention one: such a kernel
    takes causality (and a sliding window) from the layer, not a dense mask.
    """
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


class FamilyAttentionContract(OpContract):
    """An :class:`OpContract` that is a family's attention function itself (``Contract(attention=True)``).

    Installing it registers ``attention_forward`` as the Transformers attention implementation
    ``implementation_name`` and points every config at the site to it while the context lasts, so the
    layer's attention module calls the contract's op in place of the eager function its family ships.
    """

    implementation_name: str = ""

    @staticmethod
    def attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                          **kwargs: Any) -> Tuple[Any, None]:
        raise NotImplementedError

    def register(self) -> None:
        register_attention_function(self.implementation_name, self.attention_forward)

    @contextlib.contextmanager
    def install(self, site: Site) -> Iterator[None]:
        self.register()
        modules = site.root.modules() if site.root is not None else ()
        configs = {id(c): c for c in [site.config] + [getattr(m, "config", None) for m in modules]
                   if c is not None and hasattr(c, "_attn_implementation")}
        with Patched() as patched:
            for config in configs.values():
                patched.set(config, "_attn_implementation", self.implementation_name)
            yield


class Patched:
    """Attributes set on objects while the context lasts, each put back on exit, the last set first.

    An attribute the object held itself (in its ``__dict__``, or through a
    property of its class, as a Transformers config's ``_attn_implementation``)
    gets its value back; one it only inherited (a class's method) is removed
    again, so the class's shows through.
    """

    def __init__(self) -> None:
        self._undo: List[Tuple[Any, str, Any, bool]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """``setattr(owner, name, value)`` until the context closes."""
        own = getattr(owner, "__dict__", {})
        if name in own:
            self._undo.append((owner, name, own[name], True))
        elif hasattr(inspect.getattr_static(type(owner), name, None), "__set__"):
            self._undo.append((owner, name, getattr(owner, name), True))
        else:
            self._undo.append((owner, name, None, False))
        setattr(owner, name, value)

    def __enter__(self) -> "Patched":
        return self

    def __exit__(self, *exc: Any) -> bool:
        for owner, name, value, had in reversed(self._undo):
            if had:
                setattr(owner, name, value)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
        self._undo = []
        return False


@contextlib.contextmanager
def function_replaced(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``make(original)`` (wrapped to look like the original) while the context lasts.

    A function replaced where the caller looks it up at each call, not a
    function mode: a mode is off inside its own handler, so the recompute a
    checkpoint runs during the backward would miss it.
    """
    original = getattr(owner, name)
    with Patched() as patched:
        patched.set(owner, name, functools.wraps(original)(make(original)))
        yield


def dropout_replaced(fused: Callable[[Any, float], Any]) -> ContextManager[None]:
    """``torch.nn.functional.dropout`` running *fused* ``(input, p) -> output`` where it draws a mask.

    Outside training, with ``p == 0`` or in place it runs the original.
    """
    import torch.nn.functional as F

    def make(original: Any) -> Any:
        def dropout(input, p=0.5, training=True, inplace=False):
            if not training or p == 0 or inplace:
                return original(input, p, training, inplace)
            return fused(input, p)
        return dropout

    return function_replaced(F, "dropout", make)


def fp32_layer_norm_statistics(func: Any, args: Tuple[Any, ...], out: Any) -> Any:
    """*out* of ``native_layer_norm`` with fp32 mean and rstd where its input is bf16 or fp16, as device
    kernels keep them (the CPU kernel keeps them in the input's dtype); *out* unchanged otherwise."""
    import torch

    if func is torch.ops.aten.native_layer_norm.default and args[0].dtype in (torch.bfloat16, torch.float16):
        return (out[0], *(torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in out[1:]))
    return out
