"""Exact storage accounting, registered as ``accounting/<function>``: training bytes from shapes and byte
widths, packed W4, Kronecker factors, the Ouro layout, a tensor inventory.

These are the implementations behind :mod:`ndcost.accounting`, which looks
each one up in the registry so a third party can override it. Every count and
byte figure is an exact Python int. None of them equates payload with
measured loaded memory: allocator overhead, workspaces and master copies are
outside what they count.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.plugins.storage import StorageFormat, exact_int as _int

TRAINING_KEYS = ("parameters", "gradients", "activations", "optimizer_state", "total")
OURO_ASSUMPTIONS = ("fixed local Kronecker layout, all loop copies, no optional diagonals; "
                    "not measured loaded memory")
INVENTORY_EXCLUDES = "allocator overhead, runtime workspaces, KV cache, Python containers"


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------
def _width(what: str, value: Any) -> int:
    """A byte width: a whole number of bytes >= 0 (sub-byte formats go through storage_bytes)."""
    try:
        return _int(what, value)
    except InvalidValue:
        raise InvalidValue(f"{what} must be a whole number of bytes >= 0, got {value!r}; for sub-byte or "
                           f"block-scaled formats use ndcost.accounting.storage_bytes(format, elements)") from None


def _shapes(what: str, shapes: Any) -> List[Tuple[int, ...]]:
    """A collection of shapes (a sequence of shapes, or a mapping name -> shape)."""
    if isinstance(shapes, Mapping):
        shapes = list(shapes.values())
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Iterable):
        raise InvalidValue(f"{what} must be a list of shapes such as [[4, 3], [3]], got {shapes!r}")
    out = []
    for n, shape in enumerate(shapes):
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            raise InvalidValue(f"{what}[{n}] must be a shape (a list of dimension sizes; [] is a scalar), "
                               f"got {shape!r}")
        out.append(tuple(_int(f"{what}[{n}] dimension", d) for d in shape))
    return out


def _elements(shapes: Sequence[Tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def _registry():
    from ndcost import manager
    return manager.registry()


def optimizer_states(optimizer: Any, registry=None) -> int:
    """State tensors per parameter of a registered optimizer (``optimizer/<name>``, case-insensitive)."""
    if not isinstance(optimizer, str):
        raise InvalidValue(f"optimizer must be a name such as 'adamw', got {optimizer!r}")
    registry = registry if registry is not None else _registry()
    name = optimizer.strip().lower()
    value = registry.find(f"optimizer/{name}")
    if value is None:
        known = ", ".join(registry.names("optimizer")) or "none"
        raise InvalidValue(f"optimizer: unknown optimizer {optimizer!r}; known: {known} "
                           f"(a plugin can register more as 'optimizer/<name>')")
    # the optimizer/ contract (ndcost.protocols) guarantees the field; an int only where it is whole
    return _int(f"optimizer/{name}: states_per_parameter", value.states_per_parameter)


# ---------------------------------------------------------------------------
# training bytes from shapes and byte widths
# ---------------------------------------------------------------------------
def training_bytes(param_shapes, param_bytes_per_element, grad_bytes_per_element, activation_shapes,
                   activation_bytes_per_element, optimizer, optimizer_bytes_per_element) -> Dict[str, int]:
    """Bytes of parameters, gradients (shaped like the parameters), activations and optimizer state.

    An empty shape is a scalar (one element); a zero dimension gives zero
    elements; an empty collection holds no tensors. The optimizer keeps
    ``states_per_parameter`` tensors per parameter (SGD 0, AdaGrad 1, Adam and
    AdamW 2, or what a plugin registers). Excludes allocator overhead and
    master-weight copies.
    """
    params = _elements(_shapes("param_shapes", param_shapes))
    activations = _elements(_shapes("activation_shapes", activation_shapes))
    out = {
        "parameters": params * _width("param_bytes_per_element", param_bytes_per_element),
        "gradients": params * _width("grad_bytes_per_element", grad_bytes_per_element),
        "activations": activations * _width("activation_bytes_per_element", activation_bytes_per_element),
        "optimizer_state": optimizer_states(optimizer) * params
        * _width("optimizer_bytes_per_element", optimizer_bytes_per_element),
    }
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------
# packed W4, Kronecker factors, the Ouro layout, a tensor inventory
# ---------------------------------------------------------------------------
def packed_w4_bytes(rows, width) -> int:
    """Bytes of a ``[rows, width]`` weight packed to 4 bits with one fp32 scale per 32 elements of a row."""
    rows = _int("packed_w4_bytes: rows", rows, 1)
    width = _int("packed_w4_bytes: width", width, 1)
    return rows * (math.ceil(width / 2) + 4 * math.ceil(width / 32))


def kronecker_counts(left, right) -> Dict[str, int]:
    """Elements of a Kronecker factorization ``A (left x left) ⊗ B (right x right)``.

    ``effective_factors`` counts the two square factors; ``svd_trainable``
    the trainable elements when each factor is kept as ``U, V`` and a diagonal
    (``2 n^2 + n`` each).
    """
    left = _int("kronecker_counts: left", left, 1)
    right = _int("kronecker_counts: right", right, 1)
    return {"effective_factors": left * left + right * right,
            "svd_trainable": 2 * left * left + left + 2 * right * right + right}


def _factors(what: str, value: Any) -> Tuple[int, int]:
    try:
        left, right = value
    except (TypeError, ValueError):
        raise InvalidValue(f"ouro_analytic_accounting: {what} must be a pair (left, right), got {value!r}") from None
    return _int(f"ouro_analytic_accounting: {what}[0]", left, 1), _int(f"ouro_analytic_accounting: {what}[1]", right, 1)


def ouro_analytic_accounting(*, layers=24, hidden=2048, intermediate=5632, vocab=49152, heads=16, kv_heads=16,
                             hidden_factors=(32, 64), intermediate_factors=(64, 88), loops=4, selected_groups=4,
                             rank=8) -> Dict[str, Any]:
    """Analytic element and byte counts of a looped (Ouro) model with Kronecker-factored adapters.

    The layout: untied embedding and LM head, bias-free q/k/v/o and
    gate/up/down projections, four norms a layer plus the final norm, and an
    exit gate of ``hidden + 1``. ``loop_dependent_bounds`` let every selected
    group be the smallest or the largest candidate and include all ``loops``
    copies (not an extra-copy delta). Shared and loop-dependent counts stay
    apart from the bf16 backbone count.
    """
    def positive(what, value):
        return _int(f"ouro_analytic_accounting: {what}", value, 1)

    layers, hidden, intermediate = positive("layers", layers), positive("hidden", hidden), \
        positive("intermediate", intermediate)
    vocab, heads, kv_heads = positive("vocab", vocab), positive("heads", heads), positive("kv_heads", kv_heads)
    loops = positive("loops", loops)
    selected_groups = _int("ouro_analytic_accounting: selected_groups", selected_groups)
    rank = _int("ouro_analytic_accounting: rank", rank)
    hf, mf = _factors("hidden_factors", hidden_factors), _factors("intermediate_factors", intermediate_factors)
    if hidden % heads:
        raise InvalidValue(f"ouro_analytic_accounting: hidden {hidden} is not divisible by heads {heads}")
    if heads % kv_heads:
        raise InvalidValue(f"ouro_analytic_accounting: heads {heads} is not divisible by kv_heads {kv_heads}")
    if hf[0] * hf[1] != hidden:
        raise InvalidValue(f"ouro_analytic_accounting: hidden_factors {hf[0]} x {hf[1]} = {hf[0] * hf[1]} "
                           f"must equal hidden {hidden}")
    if mf[0] * mf[1] != intermediate:
        raise InvalidValue(f"ouro_analytic_accounting: intermediate_factors {mf[0]} x {mf[1]} = {mf[0] * mf[1]} "
                           f"must equal intermediate {intermediate}")

    kv = hidden // heads * kv_heads
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),
              (intermediate, hidden), (intermediate, hidden), (hidden, intermediate)]
    projection = layers * sum(rows * cols for rows, cols in shapes)
    scales = layers * sum(r * math.ceil(c / 32) for r, c in shapes)
    non_projection = 2 * vocab * hidden + (4 * layers + 1) * hidden + hidden + 1
    backbone = projection + non_projection
    h, m = kronecker_counts(*hf), kronecker_counts(*mf)
    dependent_cta = (loops - 1) * (2 * hidden + rank)
    las = layers * 4 * loops
    bounds = {name: [selected_groups * loops * min(h[name], m[name]) + las + dependent_cta,
                     selected_groups * loops * max(h[name], m[name]) + las + dependent_cta] for name in h}
    return {
        "projection_elements": projection,
        "group32_weight_scales": scales,
        "backbone_stored_elements": backbone,
        "bf16_payload_bytes": backbone * 2,
        "bf16_payload_GiB": backbone * 2 / 2 ** 30,
        "packed_projection_payload_bytes": layers * sum(packed_w4_bytes(r, c) for r, c in shapes),
        "non_projection_bf16_payload_bytes": non_projection * 2,
        "shared_transform_counts": {name: layers * (3 * h[name] + m[name]) for name in h},
        "shared_cta_uv": 2 * hidden * rank,
        "loop_dependent_las": las,
        "loop_dependent_cta": dependent_cta,
        "loop_dependent_bounds": bounds,
        "assumptions": OURO_ASSUMPTIONS,
    }


def tensor_tree_inventory(tree) -> Dict[str, Any]:
    """Tensors in a tree of mappings, lists, tuples and modules: each object counted once, storages deduplicated.

    ``logical_tensor_bytes`` sums every distinct tensor object's elements
    times element size (views counted in full); ``unique_storage_bytes`` sums
    the distinct storages behind them, so aliased views and tied weights are
    paid once.
    """
    import torch

    objects: Dict[int, Any] = {}
    storages: Dict[Any, int] = {}
    seen_containers = set()

    def storage_key(tensor):
        storage = tensor.untyped_storage()
        # Meta and fake tensors (their storage lives on "meta") have no address: tell their storages
        # apart by the storage object itself, which views of one base share.
        if storage.device.type == "meta":
            identity = ("storage", storage._cdata)
        else:
            identity = storage.data_ptr() or ("storage", storage._cdata)
        return (str(tensor.device), identity, storage.nbytes()), storage.nbytes()

    def visit(value):
        if isinstance(value, torch.Tensor):
            if id(value) not in objects:
                objects[id(value)] = value
                key, nbytes = storage_key(value)
                storages[key] = nbytes
            return
        if isinstance(value, (Mapping, list, tuple, set, frozenset, torch.nn.Module)):
            if id(value) in seen_containers:
                return
            seen_containers.add(id(value))
        if isinstance(value, torch.nn.Module):
            for _, child in value.named_parameters(remove_duplicate=False):
                visit(child)
            for _, child in value.named_buffers(remove_duplicate=False):
                visit(child)
        elif isinstance(value, Mapping):
            for child in value.values():
                visit(child)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for child in value:
                visit(child)

    visit(tree)
    return {
        "tensor_objects": len(objects),
        "tensor_elements": sum(t.numel() for t in objects.values()),
        "logical_tensor_bytes": sum(t.numel() * t.element_size() for t in objects.values()),
        "unique_storage_bytes": sum(storages.values()),
        "excludes": INVENTORY_EXCLUDES,
    }


# ---------------------------------------------------------------------------
# storage formats
# ---------------------------------------------------------------------------
def storage_format(name: Any, registry=None) -> StorageFormat:
    """The registered ``storage/<name>`` (case-insensitive; ``bfloat16``, ``w4``, ``6bit`` ... accepted)."""
    if isinstance(name, StorageFormat):
        return name
    if not isinstance(name, str):
        raise InvalidValue(f"storage format must be a name such as 'bf16' or 'int4', got {name!r}")
    registry = registry if registry is not None else _registry()
    text = name.strip().lower()
    found = registry.find(f"storage/{text}")
    if found is None:  # another spelling a registered format declares (StorageFormat.aliases)
        found = next((fmt for _, fmt in registry.items("storage") if text in fmt.aliases), None)
    if found is None:
        raise InvalidValue(f"unknown storage format {name!r}; known: {', '.join(registry.names('storage'))} "
                           f"(a plugin can register more as 'storage/<name>', with aliases=(...) for other "
                           f"spellings)")
    return found


def storage_bytes(format, elements) -> int:
    """Exact bytes of a tensor of *elements* elements stored flat in *format* (a name or StorageFormat)."""
    return storage_format(format).tensor_bytes(_int("storage_bytes: elements", elements))


def matrix_storage_bytes(format, rows, width) -> int:
    """Exact bytes of a ``[rows, width]`` matrix stored row by row in *format*."""
    return storage_format(format).matrix_bytes(_int("matrix_storage_bytes: rows", rows),
                                               _int("matrix_storage_bytes: width", width))


FUNCTIONS = {
    "training_bytes": training_bytes,
    "packed_w4_bytes": packed_w4_bytes,
    "kronecker_counts": kronecker_counts,
    "ouro_analytic_accounting": ouro_analytic_accounting,
    "tensor_tree_inventory": tensor_tree_inventory,
    "storage_bytes": storage_bytes,
    "matrix_storage_bytes": matrix_storage_bytes,
    "storage_format": storage_format,
    "optimizer_states": optimizer_states,
}


@hookimpl
def ndcost_register(register):
    for name, function in FUNCTIONS.items():
        register(f"accounting/{name}", function)
