"""The stack census: for families whose layers cannot run alone, the model's own forward and backward.

DeepSeek-V4's layers carry ``hc_mult`` hyper-connection streams between
them (a layer's input is ``[b, s, hc, d]``), take the rotary flavours the
model picks per layer type as one mapping, route their first MoE layers by a
hash of the input ids, and build their compressed keys inside each
attention. A single layer built apart is not what the model runs, so the
census runs the model the config names (Transformers' base model, on fake
tensors, under the runtime's contracts and replacements) over a micro-batch
of one sequence, forward and backward:

- each tensor autograd saves counts toward the decoder layer whose forward
  saves it first (the outermost layer running), the embedding's and the
  final norm's toward none (the output layer's census prices the end of the
  model); a layer keeps those of its saves still live when the forward ends
  (a graph the forward drops, as the indexer's scores, is freed then);
- a layer's backward holds what it keeps plus the most the backward holds
  beyond every layer's saves (the parameters and their gradients left out)
  while it runs, counting only what the backward made: what was live when
  the forward ended is the output layer's (freed before most layers' backward
  runs), and the loss and its seed are the census's own;
- each kind's record averages the layers of that kind (so the kinds'
  records, times their layer counts, add back up to the stack's total), taken
  at TP 1 and as one rank of TP 2 and split the way the single-layer census
  splits;
- under the runtime's selective policy each layer runs checkpointed as a
  trainer wraps it (:func:`census_stack_selective`), and a kind's selective
  figures are the mean of its layers' kept bytes; its gradient share is its
  layers' gradients made by their working moments over all of them;
- what a layer saves of the tensors the model hands every layer (the rotary
  tables) is stated apart (``shared_saved_per_token``): the stage's;
- the caching allocator's reserved bytes above allocated ones: each layer's
  forward and backward windows of the stack's events replayed as the layer
  census replays one layer (:func:`_layer_excess`), a kind's the mean of its
  layers', plain, under the selective policy (the stack checkpointed) and
  with each attention function checkpointed (``recompute=core_attention``).

Registered as ``census/stack``; the census calls it for a family whose
``stack_census`` is set, and :func:`refuse_single_layer` refuses a
single-layer census of such a family.

FLOPs and traffic by part come from one more forward of the stack at TP 1,
Transformers' modules under the runtime's contracts, each op counted toward
the layer running it (the layer census's counter), a kind's the mean of its
layers'.

Known limitations: the working figure leaves out kernel scratch.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import attrs

from ndcost.errors import CensusUnavailable
from ndcost.hookspecs import hookimpl
from ndcost.plugins.census.measure import ModuleStack

SOURCE = "census-stack"

def _family(model_type: str) -> Any:
    try:
        from ndcost import manager
        return manager.registry().find(f"family/{model_type}")
    except Exception:  # pragma: no cover - a registry that fails to load says nothing
        return None


def needs_stack(config_or_spec: Any) -> bool:
    """Whether *config_or_spec*'s family must be measured over its whole stack (the family's ``stack_census``)."""
    family = _family(str(getattr(config_or_spec, "model_type", "")))
    return family is not None and bool(family.stack_census)


def refuse_single_layer(config: Any) -> None:
    """Raise CensusUnavailable for a single-layer census of a family whose layers cannot run alone.

    The layer census calls this before building one layer; the stack
    census (:func:`stack_records`) is the one that measures such a family.
    """
    model_type = str(getattr(config, "model_type", ""))
    if needs_stack(config):
        reason = _family(model_type).stack_census_reason or "its family says its layers cannot run alone"
        raise CensusUnavailable(
            f"no census of one {model_type} layer: {reason}. Measure the whole stack instead "
            f"(ndcost.plugins.census.kind_records runs the stack census, census/stack, for this family), "
            f"or price the model from the formulas (census='off')")


@contextlib.contextmanager
def fake_module_conversions() -> Iterator[None]:
    """Let a module built under FakeTensorMode convert its own dtype (``module.to(torch.float32)``).

    ``nn.Module._apply`` swaps a fake parameter for its converted copy, and the
    swap refuses a tensor holding a weak reference, as every fake tensor does;
    DeepSeek-V4 keeps its hyper-connections and norms in fp32 that way while
    it builds. During the build nothing else holds the parameter, so its data
    is replaced in place instead.
    """
    import torch
    import torch.utils

    original = torch.utils.swap_tensors

    def swap(first, second):
        try:
            return original(first, second)
        except RuntimeError:
            with torch.no_grad():
                first.data = second.data
            return None

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def stack_tp_config(config: Any, tp: int) -> Any:
    """*config* as one of *tp* TP ranks holds its layers (the layer census's rule: DeepSeek-V4's one
    shared key-value head is replicated, each width divided once)."""
    from ndcost.plugins.census.layer import tp_config
    return tp_config(config, tp)


@attrs.frozen(kw_only=True)
class LayerMeasure:
    """What one decoder layer of the stack keeps and holds, and its kept bytes by op."""

    kept_bytes: int
    working_bytes: int
    ops_bytes: Mapping[str, int] = attrs.field(factory=dict)
    # what it saves of the tensors the model hands every layer, by argument name (out of the figures above)
    shared_bytes: Mapping[str, int] = attrs.field(factory=dict)
    # the layer's parameter gradients made by its working moment, and all of them
    working_grad_bytes: int = 0
    grad_bytes: int = 0
    # the caching allocator's reserved bytes above allocated ones for a stack of this layer: its own forward and
    # backward events replayed as the layer census replays one layer's (ndcost.allocator.stack_excess)
    stack_excess: Any = None


class _LayerPaths(ModuleStack):
    """Which decoder layer runs its forward, and which of its modules (paths relative to the layer).

    The census's ``ModuleStack`` over every decoder layer, for per-op
    attribution; it notes each layer's forward window (its pre- and post-
    forward hooks) and backward window (hooks on its output and input
    tensors) on *clock*, and by *key* (a storage's identity; no tensor is
    held) its input, output and the gradient reaching its output.
    """

    def __init__(self, layers: Sequence[Any], clock: Callable[[], int],
                 key: Callable[[Any], Any] = id) -> None:
        self._start()
        self.layers = list(layers)
        self.clock = clock
        self.key = key
        self.layer_running: List[int] = []
        self.modules: Dict[str, Any] = {}
        self.windows: Dict[int, List[int]] = {}
        self.forward_windows: Dict[int, List[int]] = {}
        self.inputs: Dict[int, Tuple[Any, int]] = {}    # (key, bytes) of the layer's input storage
        self.outputs: Dict[int, Any] = {}               # key of its output storage
        self.incoming: Dict[int, Tuple[Any, int]] = {}  # (key, bytes) of the gradient reaching its output
        for index, layer in enumerate(self.layers):
            self.handles.append(layer.register_forward_pre_hook(functools.partial(self._enter_layer, index)))
            self.handles.append(layer.register_forward_hook(functools.partial(self._leave_layer, index)))
            for name, module in layer.named_modules():
                if name:
                    self.modules.setdefault(name, module)
                    self._follow(name, module)

    # forward ---------------------------------------------------------------------------------------
    def _enter_layer(self, index: int, module: Any, args: Tuple[Any, ...]) -> None:
        self.layer_running.append(index)
        hidden = args[0] if args else None
        self.forward_windows.setdefault(index, [self.clock(), self.clock()])
        if hidden is not None and hasattr(hidden, "untyped_storage"):
            self.inputs.setdefault(index, (self.key(hidden), hidden.untyped_storage().nbytes()))
        if hidden is not None and getattr(hidden, "requires_grad", False):
            # the gradient reaching the layer's input closes its backward
            hidden.register_hook(functools.partial(self._close, index))

    def _leave_layer(self, index: int, module: Any, args: Any, output: Any) -> None:
        if self.layer_running:
            self.layer_running.pop()
        out = output[0] if isinstance(output, tuple) else output
        if index in self.forward_windows:
            self.forward_windows[index][1] = self.clock()
        if hasattr(out, "untyped_storage"):
            self.outputs.setdefault(index, self.key(out))
        if getattr(out, "requires_grad", False):
            # the gradient reaching the layer's output opens its backward
            out.register_hook(functools.partial(self._open, index))

    # backward --------------------------------------------------------------------------------------
    def _open(self, index: int, grad: Any) -> None:
        now = self.clock()
        self.windows.setdefault(index, [now, now])
        self.incoming.setdefault(index, (self.key(grad), grad.untyped_storage().nbytes()))

    def _close(self, index: int, grad: Any) -> None:
        window = self.windows.setdefault(index, [self.clock(), self.clock()])
        window[1] = self.clock()

    # what SavedOps reads ---------------------------------------------------------------------------
    @property
    def layer(self) -> Optional[int]:
        return self.layer_running[0] if self.layer_running else None


def _base_model_class(config: Any) -> Any:
    """The Transformers base model class of *config* (its decoder stack, no LM head)."""
    import transformers

    mapping = transformers.AutoModel._model_mapping
    try:
        return mapping[type(config)]
    except KeyError:
        raise CensusUnavailable(
            f"Transformers {transformers.__version__} has no base model for model type "
            f"{getattr(config, 'model_type', '?')!r}; the stack census cannot build it. Upgrade Transformers, "
            f"or price the model from the formulas (census='off')") from None


def _decoder_layers(model: Any) -> Sequence[Any]:
    layers = getattr(model, "layers", None)
    if layers is None and hasattr(model, "get_decoder"):
        layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise CensusUnavailable(f"{type(model).__name__} holds no decoder layers the stack census can follow")
    return layers


@contextlib.contextmanager
def one_unpacked_sequence() -> Iterator[None]:
    """Transformers' packed-sequence check answered as real position ids answer it for the census's input.

    A model's mask builders read the position ids for packed sequences
    (``find_packed_sequence_indices``, transformers/masking_utils.py); on a
    fake tensor, which holds no values, the check cannot read them and takes
    the sequences for packed, so the model builds an explicit ``[1, 1, s, s]``
    mask where a real run of one sequence hands SDPA none (``is_causal``).
    Under that mask Transformers' SDPA path expands k and v to every head
    (``repeat_kv``) and the kernel keeps the mask as a bias: a layer would keep
    ``4 (heads - kv heads) s d + 2 s^2`` bytes (bf16) more than the layer census,
    which builds the mask without position ids (:func:`~ndcost.plugins.census.layer.attention_mask`).
    The census hands one sequence at positions 0 to s - 1, which the check,
    reading them, finds unpacked (None). Its only caller is the mask builders'
    ``_preprocess_mask_arguments``.
    """
    from transformers import masking_utils

    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:  # a Transformers without the check: nothing to answer
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextlib.contextmanager
def fake_stack(config: Any, runtime: Any, contracts: bool = True,
               replacements: bool = True) -> Iterator[Tuple[Any, List[Any], Any]]:
    """The base model of *config* on fake tensors, its runtime's replacements and contracts installed, its
    input taken for one unpacked sequence (:func:`one_unpacked_sequence`).

    Yields ``(model, loaded contracts, modeling module)``.
    """
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.contracts import Site

    model_type = L.refuse_unsupported(runtime, config, "model")
    modeling = L.modeling_module(config)
    model_cls = _base_model_class(config)
    loaded = L.load_contracts(runtime.contracts_for(model_type), model_type, runtime.name) if contracts else []
    config = L.runtime_config(config, modeling, runtime)

    def build() -> Any:
        with fake_module_conversions():
            return model_cls(config)

    with contextlib.ExitStack() as stack:
        stack.enter_context(one_unpacked_sequence())
        model = L.build_fake(stack, build)
        model.config._experts_implementation = runtime.experts
        if replacements and runtime.replacements:
            for layer in _decoder_layers(model):
                L._replaced(layer, model.config, runtime.replacements)
        model.train()
        L.install_contracts(stack, loaded, Site(config=model.config, modeling=modeling, root=model,
                                                runtime=runtime))
        yield model, loaded, modeling


class _Handed:
    """The storages of the tensors the model hands its decoder layers (every call argument but the hidden
    states), by argument name, noted by forward pre-hooks (``handles``) as each layer is called."""

    def __init__(self, layers: Sequence[Any], live: Any) -> None:
        self.names: Dict[Any, str] = {}
        self.live = live
        self.handles = [layer.register_forward_pre_hook(self._note, with_kwargs=True) for layer in layers]

    def _note(self, module: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        for name, value in [*(("", a) for a in args[1:]), *kwargs.items()]:
            if name == "hidden_states":
                continue
            for tensor in tree_flatten(value)[0]:
                if isinstance(tensor, torch.Tensor) and not tensor.requires_grad:
                    self.names.setdefault(self.live.key(tensor), name or "args")


@contextlib.contextmanager
def _checkpointed(layers: Sequence[Any], policy: Any, contracts: Any,
                  note: Optional[Callable[..., None]] = None) -> Iterator[None]:
    """Each layer run under ``torch.utils.checkpoint`` (non-reentrant, RNG state not preserved) with
    ``create_selective_checkpoint_contexts`` and *policy*, as a trainer wraps it; the forwards restored after."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ndcost.plugins.census.measure import checkpoints_on_cpu
    from ndcost.plugins.census.selective import _stands_for

    stands_for = _stands_for(contracts)

    def context_fn():
        return create_selective_checkpoint_contexts(policy.op_policy(stands_for, note=note))

    originals = [layer.forward for layer in layers]
    try:
        for layer, forward in zip(layers, originals, strict=True):
            layer.forward = functools.partial(checkpoint, forward, use_reentrant=False, preserve_rng_state=False,
                                              context_fn=context_fn)
        with checkpoints_on_cpu():
            yield
    finally:
        for layer, forward in zip(layers, originals, strict=True):
            layer.forward = forward


def census_stack(config: Any, seq: int, runtime: Any, policy: Any = None) -> List[LayerMeasure]:
    """What each decoder layer of *config* keeps and holds, from one forward and backward of the stack.

    With *policy* every layer runs checkpointed under it (a ``layer``-scoped one: the whole layer, which keeps
    its input; ``core_attention``: its attention function alone), and only each layer's ``stack_excess`` is
    that pass's figure (what a policy keeps is :func:`census_stack_selective`'s).
    """
    import torch

    from ndcost.plugins.census.measure import LiveBytes, SavedBy, SavedOps, delta_rule_followed

    with fake_stack(config, runtime) as (model, contracts, modeling):
        layers = _decoder_layers(model)
        params = list(model.parameters())
        stored = {p.untyped_storage()._cdata for p in params}
        live = LiveBytes()
        follow = _LayerPaths(layers, lambda: len(live.events), live.key)
        ops = SavedOps(follow, stored, contracts)
        saved_by: Dict[Any, int] = {}
        saved_op: Dict[Any, SavedBy] = {}
        saved_in: set = set()  # (storage, layer): each layer's saves, a storage two layers save counted by both
        handed = _Handed(layers, live)
        shared_by: Dict[Any, set] = {}  # a handed tensor's storage: the layers saving it

        def pack(tensor):
            found = ops.attribute(tensor)
            owner = follow.layer
            if owner is not None and tensor.untyped_storage()._cdata not in stored:
                key = live.key(tensor)
                saved_in.add((key, owner))
                if key in handed.names:
                    shared_by.setdefault(key, set()).add(owner)
                else:
                    saved_op.setdefault(key, found)
                    saved_by.setdefault(key, owner)
            return tensor.detach()  # a graph the forward drops is freed, not held by its own output

        grads: List[Any] = []
        owner_of = {id(p): index for index, layer in enumerate(layers) for p in layer.parameters()}
        own_grads: List[set] = [set() for _ in layers]

        def made(param: Any, grad: Any) -> None:
            grads.append(live.key(grad))
            if id(param) in owner_of:
                own_grads[owner_of[id(param)]].add(live.key(grad))

        handles = [p.register_hook(functools.partial(made, p)) for p in params if p.requires_grad]
        handles += handed.handles
        kept = [0] * len(layers)
        by_op: List[Dict[str, int]] = [dict() for _ in layers]
        shared: List[Dict[str, int]] = [dict() for _ in layers]
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(live)
                stack.enter_context(ops)
                for layer in layers:
                    stack.enter_context(delta_rule_followed(modeling, layer, follow))
                if policy is not None and policy.scope == "core_attention":
                    from ndcost.plugins.census.measure import checkpoints_on_cpu
                    from ndcost.plugins.census.selective import _core_attention_checkpointed
                    stack.enter_context(checkpoints_on_cpu())
                    stack.enter_context(_core_attention_checkpointed())
                elif policy is not None:
                    stack.enter_context(_checkpointed(layers, policy, contracts))
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor))
                input_ids = torch.zeros(1, seq, dtype=torch.long)
                out = model(input_ids=input_ids, use_cache=False).last_hidden_state
                ops.settle()
                forward_end = len(live.events)
                for key, index in saved_by.items():
                    size = live.sizes.get(key, 0)
                    kept[index] += size
                    if size:
                        op = saved_op[key].op
                        by_op[index][op] = by_op[index].get(op, 0) + size
                for key, owners in shared_by.items():
                    for index in owners:
                        name = handed.names[key]
                        shared[index][name] = shared[index].get(name, 0) + live.sizes.get(key, 0)
                loss = out.float().sum()
                seed = torch.ones_like(loss)
                harness = {key for key, delta in live.events[forward_end:] if delta > 0}  # the loss and its seed
                loss.backward(seed)
        finally:
            follow.close()
            for handle in handles:
                handle.remove()
        grads.extend(live.key(param.grad) for param in params if param.grad is not None)
        for index, layer in enumerate(layers):
            own_grads[index].update(live.key(p.grad) for p in layer.parameters() if p.grad is not None)
        excluded = (set(saved_by) | set(shared_by) | set(grads)
                    | {key for key, _ in live.events if key[0] in stored})
        # running total of the bytes the backward makes beyond every layer's saves, after each event: what was
        # live when the forward ended (the embedding's, the final norm's) is the output layer's, and freed by
        # the time most layers' backward runs, so it is neither counted nor taken off
        made_by_backward = {key for key, delta in live.events[forward_end:] if delta > 0} - harness - excluded
        beyond = [0, *itertools.accumulate(delta * (key in made_by_backward) for key, delta in live.events)]

        # what the layer census's replay leaves out too: the parameters, their gradients, the loss and its seed
        excluded_from_replay = set(grads) | harness | {key for key, _ in live.events if key[0] in stored}

        def running(keys: set) -> List[int]:
            return [0, *itertools.accumulate(delta * (key in keys) for key, delta in live.events)]

        def layer_measure(index: int) -> LayerMeasure:
            # the moment in its backward where its own saves (freed as it runs), the bytes beyond every layer's
            # saves and its own gradients peak together (the layer census's rule), and its gradients made by then
            begin, end = follow.windows.get(index, (forward_end, forward_end))
            own = running({key for key, owner in saved_by.items() if owner == index})
            made = running(own_grads[index])
            moment = max(range(begin, end + 1), key=lambda t: own[t] + beyond[t] + made[t], default=forward_end)
            grad_bytes = sum({live.key(p.grad): p.grad.untyped_storage().nbytes()
                              for p in layers[index].parameters() if p.grad is not None}.values())
            return LayerMeasure(kept_bytes=kept[index], working_bytes=own[moment] + beyond[moment],
                                ops_bytes=by_op[index], shared_bytes=shared[index],
                                working_grad_bytes=made[moment], grad_bytes=grad_bytes,
                                stack_excess=_layer_excess(live.events, follow, index, saved_in,
                                                           excluded_from_replay, forward_end,
                                                           checkpointed=policy is not None
                                                           and policy.scope == "layer"))

        return [layer_measure(index) for index in range(len(layers))]


def _layer_excess(events: Sequence[Tuple[Any, int]], follow: "_LayerPaths", index: int, saved_in: set,
                  apart: set, forward_end: int, checkpointed: bool = False) -> Any:
    """One layer's reserved-over-allocated figures from its windows of the stack's events, replayed as the
    layer census replays one layer built apart (``ndcost.plugins.census.measure.measure``).

    The forward: the layer's input born first where the layer saves it or a
    *checkpointed* layer keeps it (the layer census tracks its input; an input
    neither holds is left out, as there), then its window's events, its output left out; what it made and
    frees only after its window (before its backward) is freed at the window's
    end. The backward: the gradient reaching its output born first (the layer
    census hands it in), then its window's events. Frees of storages another
    layer made are not the layer's.
    """
    from ndcost.allocator import stack_excess

    f0, f1 = follow.forward_windows.get(index, (forward_end, forward_end))
    b0, b1 = follow.windows.get(index, (forward_end, forward_end))
    out_key = follow.outputs.get(index)
    left_out = set(apart) | {out_key}
    born: set = set()

    def replayed(first: Optional[Tuple[Any, int]], span: Sequence[Tuple[Any, int]]) -> List[Tuple[Any, int]]:
        """*first* born, then *span*'s events but the left-out storages' and frees of what another layer made."""
        out = []
        for key, delta in ([first] if first is not None and first[0] not in left_out else []) + list(span):
            if key in left_out or (delta < 0 and key not in born):
                continue
            out.append((key, delta))
            if delta > 0:
                born.add(key)
        return out

    entering = follow.inputs.get(index)
    kept_input = entering is not None and (checkpointed or (entering[0], index) in saved_in)
    forward = replayed(entering if kept_input else None, events[f0:f1])
    for key, delta in events[f1:b0]:  # its temporaries freed after its forward: freed as it ends
        if delta < 0 and key in born:
            forward.append((key, delta))
            born.discard(key)
    return stack_excess(forward, replayed(follow.incoming.get(index), events[b0:b1]))


@attrs.frozen(kw_only=True)
class SelectiveMeasure:
    """What one decoder layer of the stack keeps under a selective policy, and the forward matmul FLOPs the
    policy saved or recomputes (a :class:`~ndcost.plugins.census.selective.RecomputeLedger`)."""

    kept_bytes: int
    ledger: Any
    # the caching allocator's excess for a stack of this layer under the policy (census_stack's replay of the
    # checkpointed stack, forward and backward); None: not replayed
    stack_excess: Any = None


def census_stack_selective(config: Any, seq: int, runtime: Any, policy: Any) -> List[SelectiveMeasure]:
    """What each decoder layer of *config* keeps under *policy* (a ``layer``-scoped checkpoint policy), from one
    forward of the stack with every layer checkpointed as a trainer wraps it.

    Each layer runs ``torch.utils.checkpoint.checkpoint`` (non-reentrant, RNG
    state not preserved) with ``create_selective_checkpoint_contexts`` and the
    policy, as the layer census's selective pass runs one layer. A layer keeps
    what is live when the forward ends of the storages its forward made (the
    outputs the policy saved), and its input, which the checkpoint holds; its
    own output is the next layer's input (the last one's the final norm's).
    The tensors the model hands every layer (the rotary tables) are the
    stage's, not a layer's.
    """
    import torch

    from ndcost.plugins.census.measure import LiveBytes
    from ndcost.plugins.census.selective import RecomputeLedger, attention_storages

    if policy.scope != "layer":
        raise CensusUnavailable(f"the stack census runs layer-scoped checkpoint policies; "
                                f"checkpoint_policy/{policy.name} is {policy.scope}-scoped")
    with fake_stack(config, runtime) as (model, contracts, modeling):
        layers = _decoder_layers(model)
        stored = {p.untyped_storage()._cdata for p in model.parameters()}
        live = LiveBytes()
        handed = _Handed(layers, live)
        ledgers = [RecomputeLedger(attention_storages(layer), contracts, stored) for layer in layers]
        running: List[int] = []
        windows: Dict[int, Tuple[int, int]] = {}
        inputs: Dict[Any, int] = {}
        outputs: set = set()

        def note(func: Any, args: Any, saved: bool, is_recompute: bool) -> None:
            if running:
                ledgers[running[-1]].note(func, args, saved, is_recompute)

        def enter(index: int, module: Any, args: Tuple[Any, ...]) -> None:
            running.append(index)
            windows[index] = (len(live.events), len(live.events))
            if args and isinstance(args[0], torch.Tensor):
                inputs.setdefault(live.key(args[0]), index)

        def leave(index: int, module: Any, args: Any, output: Any) -> None:
            running.pop()
            windows[index] = (windows[index][0], len(live.events))
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor):
                outputs.add(live.key(out))

        for index, layer in enumerate(layers):
            handed.handles.append(layer.register_forward_pre_hook(functools.partial(enter, index)))
            handed.handles.append(layer.register_forward_hook(functools.partial(leave, index)))
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_checkpointed(layers, policy, contracts, note))
                stack.enter_context(live)
                out = model(input_ids=torch.zeros(1, seq, dtype=torch.long), use_cache=False)  # holds the graph
                made_by = {}
                for position, (key, delta) in enumerate(live.events):
                    if delta > 0:
                        made_by.setdefault(key, next((i for i, (b, e) in windows.items() if b <= position < e), None))
                kept = [0] * len(layers)
                for key, size in live.sizes.items():
                    if key[0] in stored or key in handed.names:
                        continue
                    owner = inputs.get(key, None if key in outputs else made_by.get(key))
                    if owner is not None:
                        kept[owner] += size
                del out
        finally:
            for handle in handed.handles:
                handle.remove()
        return [SelectiveMeasure(kept_bytes=kept[index], ledger=ledgers[index]) for index in range(len(layers))]


def count_stack(config: Any, seq: int, runtime: Any) -> List[Any]:
    """Forward FLOPs and traffic of each decoder layer by part, from one forward of the stack.

    Transformers' own modules run (no replacement: a fused module runs the
    same arithmetic), under the runtime's contracts, as the layer census
    counts them; each op counts toward the layer running it.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ndcost.plugins.census.flops import counter_class, flop_formulas
    from ndcost.plugins.census.measure import delta_rule_followed

    with fake_stack(config, runtime, replacements=False) as (model, contracts, modeling):
        layers = _decoder_layers(model)
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        follow = _LayerPaths(layers, lambda: 0)
        formulas = flop_formulas(contracts)
        counters = [counter_class()(follow, params, contracts, formulas, seq) for _ in layers]

        class _PerLayer(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                index = follow.layer
                if index is None:
                    return func(*args, **(kwargs or {}))
                return counters[index].__torch_dispatch__(func, types, args, kwargs)

        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                for layer in layers:
                    stack.enter_context(delta_rule_followed(modeling, layer, follow))
                stack.enter_context(_PerLayer())
                model(input_ids=torch.zeros(1, seq, dtype=torch.long), use_cache=False)
        finally:
            follow.close()
        return [c.count() for c in counters]


def _kinds(groups: Sequence[Any], build_mtp: bool = False) -> List[str]:
    """The kind of each decoder layer the stack builds, in model order (MTP layers are not built)."""
    kinds: List[str] = []
    for group in groups:
        if getattr(group, "mtp", False):
            if build_mtp:
                raise CensusUnavailable(
                    f"the runtime builds MTP layers ({group.kind}), which Transformers' stack does not hold; "
                    f"price them from the formulas (census='off')")
            continue
        kinds.extend([str(group.kind)] * int(group.count))
    return kinds


# what a pass of the stack under a policy may raise: the pass is then left out (said), the rest priced
_PASS_FAILURES = (CensusUnavailable, RuntimeError, TypeError, ValueError, NotImplementedError)


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _selective_passes(config: Any, seq: int, runtime: Any,
                      say: Callable[[str], None]) -> Optional[Tuple[List[SelectiveMeasure], List[SelectiveMeasure]]]:
    """The stack under the runtime's selective policy at TP 1 and TP 2; None (said why) where it cannot run."""
    from ndcost.plugins.census.records import policy_for

    policy = policy_for(runtime)
    try:
        passes = tuple(census_stack_selective(stack_tp_config(config, tp), seq, runtime, policy) for tp in (1, 2))
    except _PASS_FAILURES as exc:
        say(f"  the stack under checkpoint_policy/{policy.name} not measured ({_first_line(exc)}); "
            f"recompute=selective is unpriced for it")
        return None
    try:  # its allocations, forward and backward, replayed layer by layer (reserved bytes)
        replayed = [census_stack(stack_tp_config(config, tp), seq, runtime, policy) for tp in (1, 2)]
    except _PASS_FAILURES as exc:
        say(f"  the stack's backward under checkpoint_policy/{policy.name} not replayed ({_first_line(exc)}); "
            f"recompute=selective claims no reserved bytes")
        return passes[0], passes[1]
    one, two = ([attrs.evolve(each, stack_excess=layer.stack_excess) for each, layer in zip(kept, run, strict=True)]
                for kept, run in zip(passes, replayed, strict=True))
    return one, two


def _core_attention_passes(config: Any, seq: int, runtime: Any,
                           say: Callable[[str], None]) -> Optional[Tuple[List[LayerMeasure], List[LayerMeasure]]]:
    """The stack with each attention function checkpointed (``recompute=core_attention``: Megatron-LM's
    selective) at TP 1 and TP 2, for its allocations' replay; None (said why) where it cannot run."""
    from ndcost.plugins.census.records import core_attention_policy

    policy = core_attention_policy()
    try:
        return census_stack(stack_tp_config(config, 1), seq, runtime, policy), \
            census_stack(stack_tp_config(config, 2), seq, runtime, policy)
    except _PASS_FAILURES as exc:
        say(f"  the stack under checkpoint_policy/{policy.name} not replayed ({_first_line(exc)}); "
            f"recompute=core_attention claims no reserved bytes")
        return None


def _selective_figures(selective: Any, members: Sequence[int], plain: Sequence[LayerMeasure], seq: int,
                       kind: str, say: Callable[[str], None]) -> Dict[str, Any]:
    """A kind's ``selective_*``, recomputed-share and ``reserved_selective_*`` fields: the mean of its layers
    under the policy, split as the saved figures are, and their ledgers' FLOPs together. Empty (unpriced)
    where the stack did not run under the policy, or where the kind keeps more under it than plain (the layer
    census refuses such a layer: the policy holds outputs no backward reads)."""
    from ndcost.plugins.census.records import recomputed_share_fields, split
    from ndcost.plugins.census.selective import RecomputeLedger

    if selective is None:
        return {}
    one, two = selective
    mean_1, mean_2 = (sum(each[i].kept_bytes for i in members) / len(members) for each in (one, two))
    if mean_1 > sum(plain[i].kept_bytes for i in members) / len(members):
        say(f"  {kind}: keeps more under the selective policy than plain; recompute=selective is unpriced for it")
        return {}
    together = RecomputeLedger(())
    for index in members:
        for key, value in one[index].ledger.flops.items():
            together.flops[key] = together.flops.get(key, 0) + value
    selective_per_token, selective_tp_per_token = split(mean_1, mean_2, seq)
    return dict(selective_per_token=selective_per_token, selective_tp_per_token=selective_tp_per_token,
                **recomputed_share_fields(together),
                **_reserved(one, two, members, seq, "reserved_selective"))


def _reserved(one: Sequence[Any], two: Sequence[Any], members: Sequence[int], seq: int,
              prefix: str) -> Dict[str, float]:
    """KindRecord's ``<prefix>_per_layer`` and ``<prefix>_working`` fields (each with its TP part): the mean
    of the kind's layers' ``stack_excess`` at TP 1 and TP 2; empty where a layer's was not replayed."""
    from ndcost.plugins.census.records import split

    if any(each[i].stack_excess is None for each in (one, two) for i in members):
        return {}
    out: Dict[str, float] = {}
    for name, figure in (("per_layer", "per_layer_bytes"), ("working", "working_bytes")):
        at_1, at_2 = (sum(getattr(each[i].stack_excess, figure) for i in members) / len(members)
                      for each in (one, two))
        out[f"{prefix}_{name}_per_token"], out[f"{prefix}_{name}_tp_per_token"] = split(at_1, at_2, seq)
    return out


def stack_kind_records(config: Any, groups: Sequence[Any], seq: int, runtime: Any,
                       progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """``{kind: KindRecord}`` of *config*'s stack: each kind the mean of its layers, at TP 1 and TP 2."""
    from ndcost.plugins.census.records import split
    from ndcost.records import KindRecord
    from ndcost.values import OPS

    kinds = _kinds(groups, getattr(runtime, "build_mtp", False))
    say = progress or (lambda message: None)
    began = time.perf_counter()
    say(f"census {config.model_type}: the whole stack of {len(kinds)} layers at {seq} tokens, TP 1 and TP 2, "
        f"under {runtime.name} (its layers cannot run alone)")
    one = census_stack(stack_tp_config(config, 1), seq, runtime)
    two = census_stack(stack_tp_config(config, 2), seq, runtime)
    counted = count_stack(stack_tp_config(config, 1), seq, runtime)
    selective = _selective_passes(config, seq, runtime, say)
    core = _core_attention_passes(config, seq, runtime, say)
    if len(one) != len(kinds):
        raise CensusUnavailable(f"the model builds {len(one)} decoder layers but its spec lists {len(kinds)}; "
                                f"check the spec's layer groups against the config's num_hidden_layers")
    out: Dict[str, Any] = {}
    positions: Dict[str, List[int]] = {}
    for index, each in enumerate(kinds):
        positions.setdefault(each, []).append(index)
    for kind, members in positions.items():

        def mean(stack: List[LayerMeasure], read: Callable[[LayerMeasure], int]) -> float:
            return sum(read(stack[index]) for index in members) / len(members)

        saved, saved_tp = split(mean(one, lambda m: m.kept_bytes), mean(two, lambda m: m.kept_bytes), seq)
        working, working_tp = split(mean(one, lambda m: m.working_bytes), mean(two, lambda m: m.working_bytes), seq)
        ops, ops_tp = {}, {}
        for op in OPS:
            if any(op in one[i].ops_bytes or op in two[i].ops_bytes for i in members):
                ops[op], ops_tp[op] = split(mean(one, lambda m: m.ops_bytes.get(op, 0)),
                                            mean(two, lambda m: m.ops_bytes.get(op, 0)), seq)
        def mean_table(read: Callable[[Any], Mapping[str, int]]) -> Dict[str, float]:
            parts = sorted({part for index in members for part in read(counted[index])})
            return {part: sum(read(counted[index]).get(part, 0) for index in members) / len(members)
                    for part in parts}

        traffic = {"moved_bytes": mean_table(lambda c: c.moved_bytes),
                   "parameter_bytes": mean_table(lambda c: c.parameter_bytes),
                   "launches": mean_table(lambda c: c.launches)}
        grads = sum(one[index].grad_bytes for index in members)
        shared = {name: sum(one[index].shared_bytes.get(name, 0) for index in members) / len(members) / seq
                  for name in sorted({name for index in members for name in one[index].shared_bytes})}
        out[kind] = KindRecord(kind=kind, seq=seq, source=SOURCE, saved_per_token=saved,
                               saved_tp_per_token=saved_tp, working_per_token=working,
                               working_tp_per_token=working_tp, ops=ops, ops_tp=ops_tp,
                               working_grad_share=sum(one[i].working_grad_bytes for i in members) / grads
                               if grads else None,
                               **_selective_figures(selective, members, one, seq, kind, say),
                               flops_by_part=mean_table(lambda c: c.flops),
                               flops_all_pairs_by_part=mean_table(lambda c: c.all_pairs_flops),
                               traffic=traffic, shared_saved_per_token=shared,
                               **_reserved(one, two, members, seq, "reserved"),
                               **({} if core is None else _reserved(*core, members, seq, "reserved_core_attention")))
    say(f"  stack census done ({time.perf_counter() - began:.1f} s)")
    return out


def stack_records(spec: Any, seq: int, runtime: Any = "hf-cuda", use_cache: bool = True,
                  progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """``{kind: KindRecord}`` for *spec* (a ModelSpec) from the stack census, cached on disk."""
    from ndcost.plugins.census import cache
    from ndcost.plugins.census.records import config_of, runtime_profile

    profile = runtime_profile(runtime)
    config = config_of(spec)
    say = progress if progress is not None else (lambda message: print(message, file=sys.stderr, flush=True))
    groups = list(spec.layers)
    content = cache.entry_content(what="stack", config=config.to_dict(), seq=seq,
                                  runtime=profile.content(),
                                  layers=[[g.kind, int(g.count), bool(g.mtp)] for g in groups])
    # one entry per kind, all computed together
    records: Dict[str, Any] = {}
    kinds = list(dict.fromkeys(_kinds(groups, profile.build_mtp)))
    computed: Dict[str, Any] = {}

    def compute_all() -> Dict[str, Any]:
        if not computed:
            computed.update(stack_kind_records(config, groups, seq, profile, say))
        return computed

    for kind in kinds:
        entry = dict(content, kind=kind)
        records[kind] = (cache.cached(entry, lambda kind=kind: compute_all()[kind]) if use_cache
                         else compute_all()[kind])
    return records


@hookimpl
def ndcost_register(register):
    register("census/stack", stack_records)
