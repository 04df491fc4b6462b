"""What a layer's forward keeps for its backward, and what its backward holds at most, on fake tensors.

Storages are tracked through their lifetimes by a dispatch mode: a fake
storage freed by the forward hands its address to a later one, so a storage
is keyed by its address *and* the generation of that address, never by the
address alone (counting by address lost whichever of two colliding saves
came first, and made a layer measure differently from run to run).

Saved tensors are seen by ``torch.autograd.graph.saved_tensors_hooks`` and
returned detached, so the graph holds the bytes and not the tensor: an op
saving its own output would, without the detach, reach itself again through the
output's ``grad_fn``; that cycle keeps every graph the forward drops alive until the
backward. Parameters and their gradients are the memory model's to count and
are left out; the layer's input counts where the layer saves it.

Known limitations: a kernel's internal scratch buffers are not seen (only
what ops return); bytes are whole storages, so a saved view of a larger
buffer counts the buffer.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Sequence, Set, Tuple

import attrs

from ndcost.allocator import replay, stack_excess

Key = Tuple[int, int]

# Ops a matmul runs as, for attribution.
_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "matmul")
_SOFTMAX = ("_softmax", "_log_softmax", "softmax", "log_softmax")


def _torch():
    import torch
    return torch


class LiveBytes:
    """A dispatch mode following each storage the ops it sees return, from allocation to free.

    ``events`` is the ordered list of ``(key, +bytes)`` at allocation and
    ``(key, -bytes)`` when freed; ``sizes`` the storages live now.
    """

    def __new__(cls, *args, **kwargs):  # a TorchDispatchMode subclass defined lazily (torch import)
        return _live_bytes_class()(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _live_bytes_class():
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    scalar_read = torch.ops.aten._local_scalar_dense.default

    class _LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: Dict[Key, int] = {}
            self.generation: Dict[int, int] = {}
            self.events: List[Tuple[Key, int]] = []

        def key(self, tensor: Any) -> Key:
            """Identity of *tensor*'s storage: its address, and how many storages at that address died before."""
            address = tensor.untyped_storage()._cdata
            return address, self.generation.get(address, 0)

        def track(self, tensor: Any) -> None:
            """Log a birth event for *tensor*'s storage (once per storage) and a death event when it goes."""
            key = self.key(tensor)
            if key not in self.sizes:
                storage = tensor.untyped_storage()
                self.sizes[key] = nbytes = storage.nbytes()
                self.events.append((key, nbytes))
                weakref.finalize(storage, self._free, key)

        def _free(self, key: Key) -> None:
            address, lifetime = key
            self.generation[address] = max(self.generation.get(address, 0), lifetime + 1)
            nbytes = self.sizes.pop(key, 0)
            if nbytes:
                self.events.append((key, -nbytes))

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is scalar_read and isinstance(args[0], FakeTensor):
                return 0  # a fake tensor holds no value; shapes alone price the memory
            out = func(*args, **(kwargs or {}))
            for leaf in tree_flatten(out)[0]:
                if isinstance(leaf, torch.Tensor):
                    self.track(leaf)
            return out

        def peak(self, start: int, excluded: Iterable[Key], apart: Iterable[Key] = ()) -> int:
            """:meth:`peak_parts`' first figure: the bytes live at the peak, *apart* left out."""
            return self.peak_parts(start, excluded, apart)[0]

        def peak_parts(self, start: int, excluded: Iterable[Key], apart: Iterable[Key] = ()) -> Tuple[int, int]:
            """The highest live total from event *start* onwards, split in two, ignoring *excluded* storages.

            The *apart* storages (the parameters' gradients, which the memory
            model prices itself) help decide where the high point is, yet are
            reported separately: the first figure is everything else live there,
            the second is the *apart* bytes live there.
            """
            excluded, apart = set(excluded), set(apart)

            def running() -> Iterator[Tuple[int, int]]:
                total = of_apart = 0
                yield total, of_apart
                for key, delta in self.events:
                    if key not in excluded:
                        total += delta
                        if key in apart:
                            of_apart += delta
                    yield total, of_apart

            states = itertools.islice(running(), min(start, len(self.events)), None)
            best_total, best_apart = next(states)
            for total, of_apart in states:
                if total > best_total:
                    best_total, best_apart = total, of_apart
            return best_total - best_apart, best_apart

    return _LiveBytes


class SavedOps:
    """A dispatch mode telling which op of ``ndcost.OPS`` each tensor the forward saves belongs to.

    Autograd saves an op's outputs once the op has run, but its inputs
    before the op reaches a dispatch mode. A view saves no tensor, so a
    tensor saved just after one (eager attention's batched matmuls save
    their operands right after ``matmul`` has viewed them as 3-D) is an
    input of the op about to run: :meth:`attribute` then waits for the next
    op that does more than alias (:func:`aliases_only`) and gives the tensor
    to it; any other saved tensor is the last op's. :meth:`settle` gives
    what still waits when the forward ends to the last op.
    """

    def __new__(cls, *args, **kwargs):
        return _saved_ops_class()(*args, **kwargs)


class SavedBy:
    """The op of ``ndcost.OPS`` one saved tensor belongs to, filled in when the op saving it is known."""

    __slots__ = ("op",)

    def __init__(self) -> None:
        self.op = ""


def aliases_only(func: Any, inputs: Any, outputs: Any) -> bool:
    """Whether *func*, having returned *outputs* from *inputs*, only aliased (no kernel, no bytes moved).

    A view by its schema (``Tensor(a)`` returns: ``view``, ``t``,
    ``transpose``, ``detach``), or an op that writes none of its arguments
    and returns only tensors whose storage is one of its inputs' (the schema
    of ``aten._unsafe_view`` states no alias, yet it returns its input's
    storage). An in-place or ``out=`` op returns a storage it wrote, so it
    counts.
    """
    import torch
    if func.is_view:
        return True
    if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        return False
    returned = [t for t in outputs if isinstance(t, torch.Tensor)]
    if not returned:
        return False
    given = {t.untyped_storage()._cdata for t in inputs if isinstance(t, torch.Tensor)}
    return all(t.untyped_storage()._cdata in given for t in returned)


def grouped_mm_any_float() -> Any:
    """A TorchDispatchMode running ``aten._grouped_mm`` on fp32 and fp16 fake operands as the real kernels do.

    torch's meta kernel takes bf16 operands alone (``_meta_grouped_mm_common``, torch/_meta_registrations.py),
    where the CUDA kernel runs other dtypes through its per-group fallback (``_grouped_mm_cuda``,
    aten/src/ATen/native/cuda/GroupedBlas.cpp: ``_grouped_mm_fallback``) and the CPU kernel takes them too.
    Transformers' grouped experts under autocast with fp32 parameters cast their input to the weights' dtype
    (``_grouped_mm``, transformers/integrations/moe.py) and run fp32. The output takes the meta kernel's shape
    and strides at bf16, and the operands' dtype (or the op's ``out_dtype``).
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    others = (torch.float32, torch.float16)

    class GroupedMMAnyFloat(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is not torch.ops.aten._grouped_mm.default or args[0].dtype not in others \
                    or args[1].dtype != args[0].dtype:
                return func(*args, **kwargs)
            # _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None)
            out_dtype = kwargs.get("out_dtype") or (args[4] if len(args) > 4 else None) or args[0].dtype
            bf16 = (args[0].to(torch.bfloat16), args[1].to(torch.bfloat16), *args[2:4])
            shaped = func(*bf16, **{k: v for k, v in kwargs.items() if k != "out_dtype"})
            return torch.empty_strided(shaped.shape, shaped.stride(), dtype=out_dtype, device=shaped.device)

    return GroupedMMAnyFloat()


def launch_counter() -> Any:
    """A TorchDispatchMode whose ``launches`` counts the ops run under it that launch a kernel: all but the
    ``prim`` ops and those :func:`aliases_only` finds (the census's forward counter's rule,
    plugins/census/flops.py), for a pass the census does not count (a backward, a checkpointed step)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LaunchCounter(TorchDispatchMode):
        launches = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.namespace != "prim":
                tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
                returned = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                self.launches += not aliases_only(func, tensors, returned)
            return out

    return LaunchCounter()


def module_part(path: str, module: Any = None) -> str:
    """Which part of a decoder layer owns the module at *path* (a path inside the layer).

    Every norm, the per-head query/key norms inside an attention included,
    is ``norm``; anything else under an attention-named child is
    ``attention``; inside the feed-forward, modules of a shared expert are
    ``shared``, the routed experts' are ``routed``, the router's ``router``,
    and what remains ``ffn``. The
    layer's own code (residual adds) is ``other``.
    """
    if not path:
        return "other"
    segments = path.split(".")
    leaf = segments[-1]
    if segments[0] in ("lm_head", "head", "output_layer"):
        return "head"
    if "norm" in segments[0] or "norm" in leaf or (module is not None and "norm" in type(module).__name__.lower()):
        return "norm"
    if "attn" in segments[0] or "attention" in segments[0] or "mixer" in segments[0]:
        return "attention"
    if any("shared" in s for s in segments):
        return "shared"
    if "experts" in segments:
        return "routed"
    if leaf in ("gate", "router") and len(segments) > 1:
        return "router"
    return "ffn"


class ModuleStack:
    """Which of a layer's modules runs now, followed by forward hooks (removed by :meth:`close`)."""

    def __init__(self, layer: Any) -> None:
        self._start()
        self.modules = dict(layer.named_modules())
        for name, module in self.modules.items():
            if name:
                self._follow(name, module)

    def _start(self) -> None:
        self.running: List[str] = []
        self.delta_rule = 0
        self.handles: List[Any] = []

    def _follow(self, name: str, module: Any) -> None:
        """Note *module* as running at path *name* while its forward runs."""
        self.handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
        self.handles.append(module.register_forward_hook(self._leave))

    def _enter(self, name: str, *_: Any) -> None:
        self.running.append(name)

    def _leave(self, *_: Any) -> None:
        if self.running:
            self.running.pop()

    @property
    def path(self) -> str:
        return self.running[-1] if self.running else ""

    def part(self) -> str:
        path = self.path
        return module_part(path, self.modules.get(path))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@contextlib.contextmanager
def delta_rule_followed(modeling: Any, layer: Any, stack: ModuleStack):
    """Note in *stack* while a gated-delta-rule function of *modeling* (or a module's attribute) runs.

    Transformers' gated-delta-net modules call their modeling module's
    ``torch_chunk_gated_delta_rule`` by name (5.15 and later) or hold it in
    ``chunk_gated_delta_rule``; a contract may have replaced either, and the
    wrapper follows whatever is installed when the layer runs.
    """
    names = [n for n in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                         "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
             if callable(getattr(modeling, n, None))]
    patched: List[Tuple[Any, str, Any]] = []

    def follow(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            stack.delta_rule += 1
            try:
                return function(*args, **kwargs)
            finally:
                stack.delta_rule -= 1
        return run

    for name in names:
        patched.append((modeling, name, getattr(modeling, name)))
        setattr(modeling, name, follow(getattr(modeling, name)))
    for module in layer.modules():
        for name in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule"):
            value = module.__dict__.get(name)
            if callable(value):
                patched.append((module, name, value))
                setattr(module, name, follow(value))
    try:
        yield
    finally:
        for owner, name, value in reversed(patched):
            setattr(owner, name, value)


@functools.lru_cache(maxsize=None)
def _saved_ops_class():
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    dropout = {torch.ops.aten.native_dropout.default, torch.ops.aten.dropout.default}
    detach = torch.ops.aten.detach.default

    def tensors(tree: Any) -> List[Any]:
        return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]

    class _SavedOps(TorchDispatchMode):
        """Remembers the last op dispatched, whether a weight took part and whether it only aliased."""

        def __init__(self, stack: ModuleStack, params: Set[int], contracts: Sequence[Any]) -> None:
            super().__init__()
            self.stack = stack
            self.params = params
            self.contracts = list(contracts)
            self.func = None
            self.weighted = False
            self.aliased = False
            # saved tensors waiting for the op that saves them, each an input its caller holds until that op
            # runs: (handle, tensor, part, module, in delta rule)
            self.waiting: List[Tuple[SavedBy, Any, str, Any, bool]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # metadata reads run as prims, and the pack hook detaches each save: neither is the saver
            if func.namespace != "prim" and func is not detach:
                inputs = tensors((args, kwargs))
                self.func = func
                self.weighted = any(t.untyped_storage()._cdata in self.params for t in inputs)
                self.aliased = aliases_only(func, inputs, tensors(out))
                if not self.aliased:
                    self.settle()
            return out

        def attribute(self, tensor: Any) -> SavedBy:
            """The op *tensor*, saved now, belongs to: found now, or once the op saving it runs."""
            found = SavedBy()
            context = (self.stack.part(), self.stack.modules.get(self.stack.path), bool(self.stack.delta_rule))
            if self.aliased:
                self.waiting.append((found, tensor, *context))
            else:
                found.op = self._op(tensor, *context)
            return found

        def settle(self) -> None:
            """The tensors waiting for their saver given to the last op dispatched."""
            waiting, self.waiting = self.waiting, []
            for found, tensor, *context in waiting:
                found.op = self._op(tensor, *context)

        def _op(self, tensor: Any, part: str, module: Any, delta_rule: bool) -> str:
            func = self.func
            for contract in self.contracts:
                found = contract.saved_op(func, tensor)
                if found is not None:
                    return found
            if delta_rule:
                return "linrec"
            if func in dropout:
                return "dropout"
            name = func._opname if func is not None else ""
            if part == "norm":
                return "normOp"
            if part == "attention":
                if name in _SOFTMAX:
                    return "softmax"
                if name in _MATMULS and not self.weighted:
                    return "attBMM"
                return "attMM"
            if part == "other":
                return "other"
            if module is not None and type(module).__module__ in ("transformers.activations",
                                                                  "torch.nn.modules.activation"):
                return "ffAct"
            return "ffMM"

    return _SavedOps


@functools.lru_cache(maxsize=None)
def _weight_copies_class():
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    to_copy = torch.ops.aten._to_copy.default

    class _WeightCopies(TorchDispatchMode):
        """Counts every copy of a parameter an op makes (autocast's casts) as a parameter's storage."""

        def __init__(self, stored: Set[int], live: Any, copies: List[Key]) -> None:
            super().__init__()
            self.stored, self.live, self.copies = stored, live, copies

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is to_copy and args[0].untyped_storage()._cdata in self.stored:
                self.stored.add(out.untyped_storage()._cdata)
                self.copies.append(self.live.key(out))
            return out

    return _WeightCopies


@contextlib.contextmanager
def checkpoints_on_cpu() -> Iterator[None]:
    """Activation checkpointing's default device type set to the CPU while the context lasts, then put back.

    A checkpoint over CPU tensors (a census's are fake and on the CPU) takes
    ``torch.utils.checkpoint.DefaultDeviceType``, which ``torch_npu`` sets to
    ``npu`` when it is imported: the recompute would then enter the NPU's
    autocast and start a device the census never uses (and fail on a host
    whose NPU cannot start).
    """
    from torch.utils.checkpoint import DefaultDeviceType

    previous = DefaultDeviceType.get_device_type()
    DefaultDeviceType.set_device_type("cpu")
    try:
        yield
    finally:
        DefaultDeviceType.set_device_type(previous)


@attrs.frozen(kw_only=True)
class Measured:
    """One forward and backward of a layer: bytes it keeps, the most its backward holds, and by op."""

    saved_bytes: int
    working_bytes: int
    ops_bytes: Dict[str, int] = attrs.field(factory=dict)
    saved_tensors: Tuple[Tuple[Tuple[int, ...], str, int, str], ...] = ()
    # every storage the forward saved, also those a graph it dropped freed before its end (as a
    # saved-tensors hook that counts at pack time sees them)
    packed_bytes: int = 0
    # the parameters' gradients live at the working moment, and all of them once the backward has run
    working_grad_bytes: int = 0
    grad_bytes: int = 0
    # the inputs no op saved and no checkpoint keeps: out of the working figure (a real model frees them)
    inputs_left_out_bytes: int = 0
    # the caching allocator's reserved bytes above allocated ones for a stack of this layer
    # (ndcost.allocator.stack_excess over the events, the working figure's left-out bytes and the gradients apart)
    stack_excess: Any = None
    # and for this layer alone, once (the output layer's figure): peak reserved less peak allocated
    alone_excess_bytes: int = 0
    # without checkpointing, of saved_bytes and ops_bytes, the storages of the *shared* tensors (what the model
    # hands every layer), by the name they are handed under and by op; in working_bytes too (the caller holds
    # them); a checkpointed pass keeps none of them (empty)
    shared_saved_bytes: Dict[str, int] = attrs.field(factory=dict)
    shared_ops_bytes: Dict[str, int] = attrs.field(factory=dict)


def measure(params: Sequence[Any], inputs: Iterable[Any], forward: Callable[[], Any],
            backward: Callable[[Any], None], grad_inputs: Iterable[Any] = (), checkpointed: bool = False,
            shared: Mapping[str, Any] = MappingProxyType({}), ops: Any = None, extra_modes: Sequence[Any] = (),
            inputs_kept: bool = True, weight_copies: bool = False, gradients_at_peak: bool = True) -> Measured:
    """Two figures for one forward/backward: what the forward leaves saved for the backward, and the backward's high point.

    Without checkpointing, the saved bytes are the unique storages the
    autograd graph saved (parameters left out) still live at the forward's
    end; with checkpointing, the storages live at its end but for the
    output, the parameters and the *shared* tensors (what the checkpoint and
    its policy keep, the input included unless *inputs_kept* is false, when it
    counts only where an op saved it). *shared* maps a name to the tensors
    (any nesting) the model computes once and hands every layer under it
    (the rotary cos and sin); what the forward saves of them is stated apart
    (``shared_saved_bytes``, ``shared_ops_bytes``). The working figure is the bytes
    live when the backward holds the most (from the forward's end on), the
    output, parameters and parameter gradients left out, and the inputs too
    unless an op saved them or a checkpoint keeps them (a real model frees
    an input nothing saves: an H200 Llama output layer's peak is the
    census's without it). The moment is the one the activations and the
    parameters' gradients together peak at: ``working_grad_bytes`` are the
    gradients live then, ``grad_bytes`` all of them once the backward has run,
    ``inputs_left_out_bytes`` the inputs the working figure leaves out. *ops* (a
    :class:`SavedOps`) takes the saved bytes by op, each storage counted
    toward the op that first saved it. With *weight_copies*, the copies of
    the parameters the forward makes (autocast's bf16 casts, which the
    memory model prices with the parameters) are left out as they are.
    Without *gradients_at_peak* the moment is the activations' own high point
    (``working_grad_bytes`` 0): the output layer's, whose head gradient can
    outweigh the loss's tensors (Llama-3.1-405B's, 4.2 GB, beside 6.3 GB at
    4,096 tokens) and move the moment between the full and the half
    vocabulary the census compares.
    """
    torch = _torch()
    from torch.utils._pytree import tree_flatten

    stored = {p.untyped_storage()._cdata for p in params}
    live = LiveBytes()
    saved: Dict[Key, int] = {}
    saved_op: Dict[Key, SavedBy] = {}
    shapes: Dict[Key, Tuple[Tuple[int, ...], str]] = {}

    def pack(tensor):
        found = None if ops is None else ops.attribute(tensor)  # ask first: reading the storage dispatches
        address = tensor.untyped_storage()._cdata
        if address not in stored:
            key = live.key(tensor)
            if key not in saved:
                saved[key] = tensor.untyped_storage().nbytes()
                shapes[key] = (tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))
                if found is not None:
                    saved_op[key] = found
        return tensor.detach()

    grads: List[Key] = []
    copies: List[Key] = []
    handles = [p.register_hook(lambda grad: grads.append(live.key(grad))) for p in params if p.requires_grad]
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(checkpoints_on_cpu())
            stack.enter_context(live)
            if weight_copies:
                stack.enter_context(_weight_copies_class()(stored, live, copies))
            for mode in extra_modes:
                stack.enter_context(mode)
            if ops is not None:
                stack.enter_context(ops)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor))
            inputs = list(inputs)
            for tensor in inputs:
                live.track(tensor)
            out = forward()
            if ops is not None:
                ops.settle()
            start = len(live.events)
            left_out = {live.key(out), *(live.key(p) for p in params), *copies}
            shared_keys = {name: {live.key(t) for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)}
                           for name, tree in shared.items()}
            not_kept = left_out | set().union(*shared_keys.values())
            # an input no op saved is freed by a real model once the forward has used it (it is the
            # previous layer's output, which nothing else holds); only a checkpoint keeps it whole
            unsaved_inputs = {live.key(t) for t in inputs} - set(saved)
            inputs_left_out = 0
            if not (checkpointed and inputs_kept):
                not_kept |= unsaved_inputs
                left_out |= unsaved_inputs
                inputs_left_out = sum(live.sizes.get(key, 0) for key in unsaved_inputs)
            kept = sum(live.sizes[key] for key in live.sizes.keys() - not_kept)
            held = {key: saved[key] for key in saved if key in live.sizes}
            for tensor in grad_inputs:
                live.track(tensor)
            backward(out)
    finally:
        for handle in handles:
            handle.remove()
    grads.extend(live.key(param.grad) for param in params if param.grad is not None)
    apart = left_out | set(grads)
    events = [(key, delta) for key, delta in live.events if key not in apart]
    forward_end = sum(1 for key, _ in live.events[:start] if key not in apart)
    alone = replay(events)
    by_op: Dict[str, int] = {}
    ops_of = {key: found.op for key, found in saved_op.items()}
    for key, size in held.items():
        if key in ops_of:
            by_op[ops_of[key]] = by_op.get(ops_of[key], 0) + size
    tensors = tuple(sorted(((shapes[k][0], shapes[k][1], size, ops_of.get(k, "")) for k, size in held.items()),
                           key=lambda t: (-t[2], t[0], t[1])))
    working, working_grads = (live.peak_parts(start, left_out, grads) if gradients_at_peak
                              else (live.peak(start, left_out | set(grads)), 0))
    grad_bytes = sum({live.key(p.grad): p.grad.untyped_storage().nbytes()
                      for p in params if p.grad is not None}.values())
    saved_bytes = kept if checkpointed else sum(held.values())
    shared_saved: Dict[str, int] = {}
    shared_ops: Dict[str, int] = {}
    counted: Set[Key] = set()
    for name, keys in shared_keys.items() if not checkpointed else ():
        for key in sorted((keys & held.keys()) - counted):  # a storage handed under two names counts once
            counted.add(key)
            shared_saved[name] = shared_saved.get(name, 0) + held[key]
            if key in ops_of:
                shared_ops[ops_of[key]] = shared_ops.get(ops_of[key], 0) + held[key]
    return Measured(saved_bytes=saved_bytes,
                    working_bytes=working, working_grad_bytes=working_grads, grad_bytes=grad_bytes,
                    inputs_left_out_bytes=inputs_left_out,
                    ops_bytes=by_op, saved_tensors=tensors, packed_bytes=sum(saved.values()),
                    stack_excess=stack_excess(events[:forward_end], events[forward_end:]),
                    alone_excess_bytes=alone.peak_reserved_bytes - alone.peak_allocated_bytes,
                    shared_saved_bytes=shared_saved, shared_ops_bytes=shared_ops)
