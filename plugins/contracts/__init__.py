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

# Modules a contract's kernel may stand for through a runtime's replacement (Contract.fuses): an RMSNorm with a
# weight, run by one kernel keeping its 16-bit input and an fp32 rstd a row; a SiLU-gated MLP whose gate and up
# projections are one matmul feeding one kernel that keeps its input alone; routed experts whose gated activation
# (SiLU, or GPT-OSS's clamped quick-GELU) is one kernel keeping its input and the routing weights it scales by, so
# the combine keeps none of the experts' outputs (Megatron-LM's TEGroupedMLP).
FUSED_MODULES = ("rms_norm", "silu_gated_mlp", "gated_experts")

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
    the kernel keeps, not the reference's every chunk. ``fuses`` names the modules a
    runtime's replacement runs through the kernel (:data:`FUSED_MODULES`): the
    formulas then take the kernel's op-record values for them
    (``op_records.runtime_values``).
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_.\-]*$"))
    summary: str
    implementation: str = attrs.field(validator=attrs.validators.matches_re(r"^[\w.]+:[\w.]+$"))
    saves: str = ""
    device: str = ""
    attention: bool = False
    repeats_kv: bool = False
    linear_rule: bool = False
    fuses: str = attrs.field(default="", validator=attrs.validators.in_(("",) + FUSED_MODULES))

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


# ---------------------------------------------------------------------------
# fused RMSNorm and SwiGLU kernels, and the modules that run them (a runtime's replacements)
# ---------------------------------------------------------------------------
def define_fused_norm_ops(namespace: str, device_call: str) -> None:
    """``namespace::rms_norm(x, gamma, epsilon) -> (y, rstd)``, keeping its input, gamma (a parameter) and an fp32
    ``rstd [..., 1]``; ``namespace::swiglu(x, dim) -> y``, keeping its input alone (its output half as wide along
    *dim*). *device_call* names the device's kernels, for the error a real tensor raises."""
    import torch

    rms_norm = fake_only_op(
        f"{namespace}::rms_norm", "(Tensor x, Tensor gamma, float epsilon) -> (Tensor, Tensor)",
        lambda x, gamma, epsilon: (torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)),
        use=f"call {device_call}")

    def norm_setup(ctx, inputs, output):
        x, gamma, _ = inputs
        _, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(x, gamma, rstd)

    def norm_backward(ctx, grad, _rstd):
        x, gamma, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(gamma), None

    rms_norm.register_autograd(norm_backward, setup_context=norm_setup)

    def swiglu_fake(x, dim):
        shape = list(x.shape)
        shape[dim] //= 2
        return x.new_empty(shape)

    swiglu = fake_only_op(f"{namespace}::swiglu", "(Tensor x, int dim) -> Tensor", swiglu_fake,
                          use=f"call {device_call}")

    def swiglu_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def swiglu_backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.empty_like(x), None

    swiglu.register_autograd(swiglu_backward, setup_context=swiglu_setup)


class FusedRmsNorm(OpContract):
    """The contract of a :func:`define_fused_norm_ops` ``rms_norm``: what it keeps are the norm's."""

    forward, saves_as, runs_as = "rms_norm", "normOp", "norm"

    def __init__(self, ops: Any, name: str, stands: str) -> None:
        self.name, self.stands = name, (stands,)
        super().__init__(ops)


class FusedSwiGlu(OpContract):
    """The contract of a :func:`define_fused_norm_ops` ``swiglu``: what it keeps is the activation's."""

    forward, saves_as = "swiglu", "ffAct"

    def __init__(self, ops: Any, name: str, stands: str) -> None:
        self.name, self.stands = name, (stands,)
        super().__init__(ops)


def fused_module_classes(ops: Callable[[], Any], prefix: str) -> Tuple[type, type]:
    """``(<prefix>RMSNorm, <prefix>SwiGLUMLP)``: an RMSNorm calling ``ops().rms_norm`` (the source's weight kept,
    ``1 + weight`` as gamma where zero-centred) and a gated MLP whose gate and up projections are one matmul
    feeding ``ops().swiglu`` (``gate_up_proj`` holds the source's two weights stacked, ``down_proj`` is the
    source's): the modules a runtime's replacement factories put in place of Transformers' own."""
    import torch

    class FusedRMSNorm(torch.nn.Module):
        def __init__(self, weight: Any, eps: float, zero_centred: bool = False) -> None:
            super().__init__()
            self.weight = weight
            self.variance_epsilon = eps
            self.zero_centred = zero_centred

        def forward(self, hidden_states: Any) -> Any:
            gamma = (1.0 + self.weight) if self.zero_centred else self.weight
            return ops().rms_norm(hidden_states, gamma.to(hidden_states.dtype)
                                  if gamma.dtype != hidden_states.dtype else gamma, self.variance_epsilon)[0]

    class FusedSwiGLUMLP(torch.nn.Module):
        def __init__(self, source: Any) -> None:
            super().__init__()
            gate, up = source.gate_proj, source.up_proj
            self.gate_up_proj = torch.nn.Linear(gate.in_features, gate.out_features + up.out_features,
                                                bias=gate.bias is not None, dtype=gate.weight.dtype,
                                                device=gate.weight.device)
            self.down_proj = source.down_proj

        def forward(self, x: Any) -> Any:
            return self.down_proj(ops().swiglu(self.gate_up_proj(x), -1))

    FusedRMSNorm.__name__ = FusedRMSNorm.__qualname__ = f"{prefix}RMSNorm"
    FusedSwiGLUMLP.__name__ = FusedSwiGLUMLP.__qualname__ = f"{prefix}SwiGLUMLP"
    return FusedRMSNorm, FusedSwiGLUMLP


def _zero_centred(module: Any) -> bool:
    """Whether *module*'s RMSNorm scales by ``1 + weight`` (Gemma, Qwen3-Next) rather than by ``weight``."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    compact = source.replace(" ", "")
    return "(1.0+self.weight" in compact or "(1+self.weight" in compact


def _norm_eps(module: Any) -> float:
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 1e-6


GATED_ACTIVATIONS = ("silu", "swish")


def fused_rms_norm(module: Any, norm_cls: type) -> Any:
    """*module*, an RMSNorm with a weight, as *norm_cls* (a :func:`fused_module_classes` norm); else as it is."""
    weight = getattr(module, "weight", None)
    if weight is None:
        return module  # an unweighted norm is no fused RMSNorm's
    return norm_cls(weight, _norm_eps(module), _zero_centred(module))


def swiglu_experts(module: Any, config: Any) -> bool:
    """Whether *module* is Transformers' routed experts a fused kernel runs: SiLU-gated, no biases, the gate and up
    projections one ``[E, 2I, hidden]`` weight beside a ``[E, hidden, I]`` down projection; not another
    activation, nor clamped or biased experts (:func:`clamped_glu_experts` answers for GPT-OSS's)."""
    weights = (getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None))
    if any(getattr(w, "dim", lambda: 0)() != 3 for w in weights) or getattr(module, "has_bias", False):
        return False
    if getattr(module, "is_transposed", False) or getattr(module, "has_gate", True) is False:
        return False
    act = str(getattr(config, "hidden_act", "") or getattr(config, "hidden_activation", ""))
    return act in GATED_ACTIVATIONS and getattr(module, "limit", None) is None


def clamped_glu_experts(module: Any) -> bool:
    """Whether *module* is GPT-OSS's routed experts: a clamped GLU (``limit``, ``alpha``) behind a biased
    ``[E, hidden, 2I]`` gate-and-up projection and a biased ``[E, I, hidden]`` down projection."""
    names = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
    return (all(getattr(module, n, None) is not None for n in names) and getattr(module, "limit", None) is not None
            and getattr(module, "alpha", None) is not None and module.gate_up_proj.dim() == 3)


def fused_swiglu_mlp(module: Any, config: Any, mlp_cls: type) -> Any:
    """*module*, a SiLU-gated MLP (gate, up, down), as *mlp_cls*; a module of another shape (GPT-2's, a clamped
    or biased gate) as it is, as a framework's plan leaves a module its factory cannot fuse."""
    if not all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")):
        return module
    act = str(getattr(config, "hidden_act", "") or getattr(config, "hidden_activation", ""))
    if act not in GATED_ACTIVATIONS or getattr(module, "limit", None) is not None:
        return module
    return mlp_cls(module)
