"""Contract ``fla-chunk-gated-delta-rule``: a fused chunked gated-delta-rule kernel, as flash-linear-attention's.

Transformers' gated-delta-net layers (Qwen3-Next, Qwen3.5, OLMo-hybrid, ...)
call their modeling module's ``torch_chunk_gated_delta_rule``: where the
``fla`` package is installed that name runs its fused Triton kernel,
otherwise Transformers' eager reference rule, a Python loop over chunks whose
autograd keeps every chunk's intermediates (the ``hf-cuda`` profile runs the
reference, as a plain install does). This contract stands for the fused
kernel. Its autograd function keeps for the backward:

- the query and key as the kernel takes them, the value, all ``[b, s, h, d]``
  with grouped value heads unexpanded (the kernel takes ``h_v`` a multiple
  of ``h_k``);
- the gates cumulated within each chunk, fp32 ``[b, s, h_v]``;
- beta, ``[b, s, h_v]``;
- one chunk matrix, the solved intra-chunk system ``A``,
  ``[b, s, h_v, chunk]`` in the key's dtype;
- with the queries' and keys' L2 norm in the kernel
  (``use_qk_l2norm_in_kernel``, as Transformers calls it), the normalized
  query and key in their place and each one's fp32 reciprocal norm
  ``[b, s, h_k]`` (flash-linear-attention's ``l2norm_fwd``).

The backward recomputes the chunk states from these. The rule's output is
``[b, s, h_v, d_v]`` in the query's dtype; no final state is returned
unless asked for (an fp32 ``[b, h_v, d_k, d_v]``).

Known limitations: the kernel's per-chunk state buffers in the backward
(``h`` of ``[b, chunks, h_v, d_k, d_v]``) are scratch the working-peak count
does not see.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Mapping, Optional, Tuple

from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (Contract, FlopCount, OpContract, Patched, Site, fake_only_op,
                                      register_contracts, register_kernel_autograd)

NAME = "fla-chunk-gated-delta-rule"

# The modeling-module functions a gated-delta-net layer calls by name (Transformers 5.15 and later),
# and the module attribute earlier versions held the rule in.
RULE_FUNCTION = "torch_chunk_gated_delta_rule"
RULE_ATTRIBUTE = "chunk_gated_delta_rule"

CONTRACT = Contract(
    name=NAME,
    summary="flash-linear-attention's chunk_gated_delta_rule (fused chunked gated delta rule)",
    implementation="ndcost.plugins.contracts.delta_rule:implementation",
    saves="q, k, v (value heads unexpanded), the chunk-cumulated gates fp32 [b, s, h_v], beta, one chunk "
          "matrix [b, s, h_v, chunk]; with the L2 norm in the kernel, normalized q and k and fp32 "
          "reciprocal norms [b, s, h_k]",
    device="cuda",
    linear_rule=True,
)


def chunk_rule_flops(batch: int, tokens: int, value_heads: int, key_width: int, value_width: int,
                     chunk: int) -> int:
    """Forward FLOPs of the chunked rule: per chunk, its intra-chunk matmuls and its three state matmuls.

    Per chunk of ``c`` tokens and value head: ``k_beta k^T`` and ``q k^T``
    (``2 c^2 d_k`` each), the solved system applied to the values and the
    decayed keys (``2 c^2 d_v`` and ``2 c^2 d_k``), the intra-chunk output
    (``2 c^2 d_v``), and the state read by the keys and the queries and its
    update (``2 c d_k d_v`` each).
    """
    chunks = -(-tokens // chunk)
    per_chunk = 2 * chunk * chunk * (3 * key_width + 2 * value_width) + 6 * chunk * key_width * value_width
    return batch * value_heads * chunks * per_chunk


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The custom ops, defined once per process."""
    import torch

    namespace = "ndcost_fla"

    l2norm = fake_only_op(
        f"{namespace}::l2norm", "(Tensor x, float eps) -> (Tensor, Tensor)",
        lambda x, eps: (torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)))

    def l2norm_setup(ctx, inputs, output):
        y, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(y, rstd)

    def l2norm_backward(ctx, grad, _rstd):
        y, _ = ctx.saved_tensors
        return torch.empty_like(y), None

    l2norm.register_autograd(l2norm_backward, setup_context=l2norm_setup)

    def rule_fake(q, k, v, g, beta, scale, chunk_size):
        batch, tokens, value_heads, value_width = v.shape
        out = q.new_empty((batch, tokens, value_heads, value_width))
        gates = g.new_empty((batch, tokens, value_heads), dtype=torch.float32)
        chunk_matrix = k.new_empty((batch, tokens, value_heads, chunk_size))
        return out, gates, chunk_matrix

    chunk_gated_delta_rule = fake_only_op(
        f"{namespace}::chunk_gated_delta_rule",
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, "
        "int chunk_size) -> (Tensor, Tensor, Tensor)",
        rule_fake, use="on a GPU install flash-linear-attention")
    chunk_gated_delta_rule_grad = fake_only_op(
        f"{namespace}::chunk_gated_delta_rule_grad",
        "(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor gates, Tensor beta, "
        "Tensor chunk_matrix, float scale, int chunk_size) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        lambda grad, q, k, v, gates, beta, chunk_matrix, scale, chunk_size: (
            torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(gates),
            torch.empty_like(beta)))

    def rule_saves(inputs, output):
        # q, k, v, the chunk-cumulated fp32 gates (not g itself), beta and the chunk matrix
        q, k, v, _, beta = inputs[:5]
        _, gates, chunk_matrix = output
        return [q, k, v, gates, beta, chunk_matrix]

    register_kernel_autograd(chunk_gated_delta_rule, chunk_gated_delta_rule_grad, saves=rule_saves,
                             options=lambda inputs: inputs[5:], stateless=(1, 2))
    return torch.ops.ndcost_fla


def fused_chunk_gated_delta_rule(query: Any, key: Any, value: Any, g: Any, beta: Any, chunk_size: int = 64,
                                 initial_state: Any = None, output_final_state: bool = False,
                                 use_qk_l2norm_in_kernel: bool = False, scale: Optional[float] = None,
                                 **kwargs: Any) -> Tuple[Any, Any]:
    """``torch_chunk_gated_delta_rule``'s signature, answered by the fused kernel's contract."""
    import torch

    ops = _ops()
    if use_qk_l2norm_in_kernel:
        query = ops.l2norm(query, 1e-6)[0]
        key = ops.l2norm(key, 1e-6)[0]
    scale = float(scale) if scale is not None else query.shape[-1] ** -0.5
    out = ops.chunk_gated_delta_rule(query, key, value, g, beta, scale, int(chunk_size))[0]
    final = None
    if output_final_state:
        batch, _, value_heads, value_width = value.shape
        final = torch.empty(batch, value_heads, key.shape[-1], value_width, dtype=torch.float32,
                            device=value.device)
    return out, final


class _DeltaRule(OpContract):
    """The torch side of ``fla-chunk-gated-delta-rule``."""

    name = NAME
    forward, backward = "chunk_gated_delta_rule", "chunk_gated_delta_rule_grad"

    def __init__(self) -> None:
        super().__init__(_ops())
        self.l2norm_op = self.ops.l2norm.default

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "fla.chunk_gated_delta_rule", self.l2norm_op: "fla.l2norm"}

    def install(self, site: Site):
        return _installed(site)

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        return "linrec" if func in (self.forward_op, self.l2norm_op) else None

    def part(self, func: Any) -> Optional[str]:
        return "linrec" if func in (self.forward_op, self.backward_op, self.l2norm_op) else None

    def flops(self, func, args, kwargs, out) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        q, k, v = args[:3]
        chunk = int(args[6]) if len(args) > 6 else int(kwargs.get("chunk_size", 64))
        batch, tokens, value_heads, value_width = v.shape
        flops = chunk_rule_flops(batch, tokens, value_heads, k.shape[-1], value_width, chunk)
        return FlopCount(part="linrec", flops=flops, all_pairs_flops=flops)

    def flop_formulas(self) -> Mapping[Any, Any]:
        def forward(q_shape, k_shape, v_shape, g_shape, beta_shape, scale=None, chunk_size=64, *args,
                    out_shape=None, **kwargs):
            batch, tokens, value_heads, value_width = v_shape
            return chunk_rule_flops(batch, tokens, value_heads, k_shape[-1], value_width, int(chunk_size))

        def backward(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs):
            batch, tokens, value_heads, value_width = v_shape
            chunk = int(args[-1]) if args else 64
            return 2 * chunk_rule_flops(batch, tokens, value_heads, k_shape[-1], value_width, chunk)

        return {self.ops.chunk_gated_delta_rule: forward, self.ops.chunk_gated_delta_rule_grad: backward}


@contextlib.contextmanager
def _installed(site: Site) -> Iterator[None]:
    """Route the modeling module's rule, and any module's rule attribute, to the contract while open."""
    modeling, root = site.modeling, site.root
    with Patched() as patched:
        if modeling is not None and callable(getattr(modeling, RULE_FUNCTION, None)):
            patched.set(modeling, RULE_FUNCTION, fused_chunk_gated_delta_rule)
        if root is not None:
            for module in root.modules():
                if RULE_ATTRIBUTE in module.__dict__ or callable(getattr(type(module), RULE_ATTRIBUTE, None)):
                    patched.set(module, RULE_ATTRIBUTE, fused_chunk_gated_delta_rule)
        yield


@functools.lru_cache(maxsize=None)
def implementation() -> _DeltaRule:
    """The contract's torch side, defined once per process."""
    return _DeltaRule()


@hookimpl
def ndcost_register(register):
    register_contracts(register, (CONTRACT,))
