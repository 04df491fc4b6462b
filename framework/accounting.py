"""Exact storage accounting: ``ndcost.accounting.training_bytes(...)`` and friends.

Each function here forwards to the implementation registered as
``accounting/<function name>`` (built in: :mod:`ndcost.plugins.accounting`
and :mod:`ndcost.plugins.storage`), so a third-party plugin can replace one
with ``register("accounting/training_bytes", fn, override=True)``. Results
are plain dicts of exact Python ints (floats only where a division makes
them so, such as ``bf16_payload_GiB``).

Optimizers come from the registry's ``optimizer/<name>`` entries and storage
formats from ``storage/<name>``, so those a plugin adds work here too.

Known limitations: these count payload, never measured loaded memory; they
exclude allocator overhead, runtime workspaces and master-weight copies.
"""
from __future__ import annotations

from typing import Any, Dict, List

from ndcost import manager

__all__ = [
    "training_bytes", "packed_w4_bytes", "kronecker_counts", "ouro_analytic_accounting", "tensor_tree_inventory",
    "pack_6bit", "unpack_6bit", "storage_format", "storage_formats", "storage_bytes", "matrix_storage_bytes",
    "optimizer_states", "optimizers",
]


def _registry():
    return manager.registry()


def _impl(name: str):
    return _registry().get(f"accounting/{name}")


def training_bytes(param_shapes, param_bytes_per_element, grad_bytes_per_element, activation_shapes,
                   activation_bytes_per_element, optimizer, optimizer_bytes_per_element) -> Dict[str, int]:
    """Bytes of parameters, gradients, activations and optimizer state from shapes and byte widths.

    Returns ``{"parameters", "gradients", "activations", "optimizer_state",
    "total"}``; gradients are shaped like the parameters; an empty shape is a
    scalar; ``optimizer`` is a registered optimizer name (case-insensitive).

    >>> training_bytes([[4, 3], [3]], 2, 4, [[2, 4]], 2, "adam", 4)["total"]
    226
    """
    return _impl("training_bytes")(
        param_shapes=param_shapes, param_bytes_per_element=param_bytes_per_element,
        grad_bytes_per_element=grad_bytes_per_element, activation_shapes=activation_shapes,
        activation_bytes_per_element=activation_bytes_per_element, optimizer=optimizer,
        optimizer_bytes_per_element=optimizer_bytes_per_element)


def packed_w4_bytes(rows, width) -> int:
    """Bytes of a ``[rows, width]`` weight packed to 4 bits with an fp32 scale per 32 elements of a row."""
    return _impl("packed_w4_bytes")(rows=rows, width=width)


def kronecker_counts(left, right) -> Dict[str, int]:
    """``{"effective_factors", "svd_trainable"}`` of a Kronecker factorization into left x left and right x right."""
    return _impl("kronecker_counts")(left=left, right=right)


def ouro_analytic_accounting(*, layers=24, hidden=2048, intermediate=5632, vocab=49152, heads=16, kv_heads=16,
                             hidden_factors=(32, 64), intermediate_factors=(64, 88), loops=4, selected_groups=4,
                             rank=8) -> Dict[str, Any]:
    """Analytic counts of a looped (Ouro) model with Kronecker adapters (see the plugin for the layout)."""
    return _impl("ouro_analytic_accounting")(
        layers=layers, hidden=hidden, intermediate=intermediate, vocab=vocab, heads=heads, kv_heads=kv_heads,
        hidden_factors=hidden_factors, intermediate_factors=intermediate_factors, loops=loops,
        selected_groups=selected_groups, rank=rank)


def tensor_tree_inventory(tree) -> Dict[str, Any]:
    """Tensor objects counted once and their storages deduplicated, over mappings, lists, tuples and modules."""
    return _impl("tensor_tree_inventory")(tree)


def pack_6bit(codes):
    """Pack uint8 codes ``[rows, in]`` (0..63, ``in`` divisible by 4) to uint8 ``[rows, in * 3 // 4]``."""
    return _impl("pack_6bit")(codes)


def unpack_6bit(packed, in_features):
    """Unpack :func:`pack_6bit`'s output back to uint8 codes ``[rows, in_features]``."""
    return _impl("unpack_6bit")(packed, in_features)


def storage_format(name):
    """The registered storage format ``storage/<name>`` (case-insensitive; common aliases accepted)."""
    return _impl("storage_format")(name)


def storage_formats() -> Dict[str, Any]:
    """Every registered storage format by name."""
    return {key.split("/", 1)[1]: value for key, value in _registry().items("storage")}


def storage_bytes(format, elements) -> int:
    """Exact bytes of a tensor of *elements* elements stored flat in *format* (name or StorageFormat)."""
    return _impl("storage_bytes")(format=format, elements=elements)


def matrix_storage_bytes(format, rows, width) -> int:
    """Exact bytes of a ``[rows, width]`` matrix stored row by row in *format* (scales per row's groups)."""
    return _impl("matrix_storage_bytes")(format=format, rows=rows, width=width)


def optimizer_states(optimizer) -> int:
    """State tensors per parameter the registered optimizer keeps (SGD 0, AdaGrad 1, Adam/AdamW 2)."""
    return _impl("optimizer_states")(optimizer)


def optimizers() -> List[str]:
    """Registered optimizer names."""
    return _registry().names("optimizer")
