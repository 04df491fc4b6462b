"""Contracts of DeepSeek-V4's attention kernels: its sparse attention and its lightning indexer.

Transformers ships DeepSeek-V4 with eager attention only
(``_supports_sdpa = False``): every query scores the whole sliding window
*and* every compressed entry densely, and the indexer's top-k selection
only masks. The runtimes DeepSeek-V4 is trained with run two kernels
instead, which these contracts state:

- ``deepseek-v4-sparse-attention``: one sparse attention over the entries each
  query selects (its sliding window, and the compressed entries the indexer
  picks on a compressed-sparse layer, or all causal compressed entries on a
  heavily-compressed one), with the per-head attention sink. It keeps the
  query ``[b, h, s, d]``, the shared key-value ``[b, 1, t, d]`` (one tensor:
  K = V), its output, an fp32 log-sum-exp ``[b, h, s]``, and the int32
  indices it gathered ``[b, s, k]`` (``k`` = window + selected compressed
  entries); the sink is a parameter. It is Transformers' attention
  interface entry ``dsv4_sparse_attention``, taking causality and the
  window from the layer (no dense mask is built).
- ``deepseek-v4-indexer``: the lightning indexer's scoring kernel. Its selection
  keeps nothing for the backward: the indices are integers no gradient
  reaches, so in a run the scores' graph is freed as soon as the top-k is
  taken, and the indexer's projections receive no gradient. The contract
  runs the selection without recording that graph (the indexer's forward
  under ``no_grad``, its scores one op with no autograd state), so a census
  measures the same kept bytes with it as without, and no transient graph.

Known limitations: the sparse kernel's backward scratch is not seen by the
working-peak count.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional, Tuple

from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (AttentionKernel, Contract, FamilyAttentionContract, FlopCount, OpContract,
                                      Patched, Site, attention_saved_op, fake_only_op, register_attention_kernels,
                                      register_contracts, register_kernel_autograd)

SPARSE_ATTENTION = "deepseek-v4-sparse-attention"
INDEXER = "deepseek-v4-indexer"
ATTENTION_IMPLEMENTATION = "dsv4_sparse_attention"

CONTRACTS = (
    Contract(name=SPARSE_ATTENTION, device="cuda",
             summary="DeepSeek-V4's sparse attention with sinks over window and selected compressed entries",
             implementation="ndcost.plugins.contracts.deepseek_v4:sparse_attention_implementation",
             saves="q [b, h, s, d], the shared K=V [b, 1, t, d], the output, fp32 log-sum-exp [b, h, s], "
                   "int32 gathered indices [b, s, k]", attention=True),
    Contract(name=INDEXER, device="cuda",
             summary="DeepSeek-V4's lightning indexer: scores and top-k selection, no autograd state",
             implementation="ndcost.plugins.contracts.deepseek_v4:indexer_implementation",
             saves="nothing: its indices take no gradient and its scores' graph is not kept"),
)
# the formulas price the layer under the sparse kernel's name as one keeping a row's statistics, not its scores
ATTENTION_KERNELS = (
    AttentionKernel(name=SPARSE_ATTENTION, materializes_scores=False,
                    description="DeepSeek-V4's sparse attention: the log-sum-exp and gathered indices, not the scores"),
)


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The custom ops, defined once per process."""
    import torch

    namespace = "ndcost_dsv4"

    def attention_fake(query, kv, sinks, indices, scale):
        batch, heads, queries, width = query.shape
        out = query.new_empty((batch, queries, heads, width))
        lse = query.new_empty((batch, heads, queries), dtype=torch.float32)
        return out, lse

    sparse_attention = fake_only_op(
        f"{namespace}::sparse_attention",
        "(Tensor query, Tensor kv, Tensor sinks, Tensor indices, float scale) -> (Tensor, Tensor)",
        attention_fake)
    sparse_attention_grad = fake_only_op(
        f"{namespace}::sparse_attention_grad",
        "(Tensor grad, Tensor query, Tensor kv, Tensor sinks, Tensor indices, Tensor out, Tensor lse, "
        "float scale) -> (Tensor, Tensor, Tensor)",
        lambda grad, query, kv, sinks, indices, out, lse, scale: (
            torch.empty_like(query), torch.empty_like(kv), torch.empty_like(sinks)))

    # q, the shared K=V, the sinks (a parameter), the gathered indices, the output and the log-sum-exp
    register_kernel_autograd(sparse_attention, sparse_attention_grad,
                             saves=lambda inputs, output: [*inputs[:4], *output],
                             options=lambda inputs: inputs[4:], stateless=(1,))

    indexer_scores = fake_only_op(
        f"{namespace}::indexer_scores",
        "(Tensor q, Tensor compressed_kv, Tensor weights, float scale) -> Tensor",
        lambda q, compressed_kv, weights, scale: q.new_empty((*q.shape[:2], compressed_kv.shape[-2]),
                                                             dtype=torch.float32))

    def indexer_setup(ctx, inputs, output):
        ctx.mark_non_differentiable(output)

    def indexer_backward(ctx, grad):
        return None, None, None, None

    indexer_scores.register_autograd(indexer_backward, setup_context=indexer_setup)
    return torch.ops.ndcost_dsv4


def _selected(module: Any, queries: int, entries: int) -> int:
    """Entries each query's kernel call gathers: the window, and the compressed entries of its layer type."""
    config = module.config
    window = min(int(module.sliding_window or queries), queries)
    layer_type = getattr(module, "layer_type", "sliding_attention")
    compressed = max(0, entries - queries)
    if layer_type == "compressed_sparse_attention":
        return window + min(int(config.index_topk), compressed)
    if layer_type == "heavily_compressed_attention":
        return window + compressed
    return window


def dsv4_sparse_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                                  dropout: float = 0.0, scaling: Optional[float] = None,
                                  sliding_window: Optional[int] = None, s_aux: Any = None,
                                  **kwargs: Any) -> Tuple[Any, None]:
    """Transformers' attention interface, run by DeepSeek-V4's sparse attention kernel (K = V, one head)."""
    import torch

    batch, _, queries, _ = query.shape
    entries = key.shape[-2]
    indices = torch.empty(batch, queries, _selected(module, queries, entries), dtype=torch.int32,
                          device=query.device)
    sinks = s_aux if s_aux is not None else module.sinks
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = _ops().sparse_attention(query, key, sinks, indices, scale)[0]
    return out, None


class _SparseAttention(FamilyAttentionContract):
    name = SPARSE_ATTENTION
    forward, backward = "sparse_attention", "sparse_attention_grad"
    stands = ("dsv4.sparse_attn", "dsv4.sparse_attn_backward")
    runs_as = "scores"
    # the kernel takes the window and causality from the layer: no dense mask is built
    implementation_name = ATTENTION_IMPLEMENTATION
    attention_forward = staticmethod(dsv4_sparse_attention_forward)

    def __init__(self) -> None:
        super().__init__(_ops())
        self.register()

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        if func is not self.forward_op:
            return None
        return attention_saved_op(tensor)

    def flops(self, func, args, kwargs, out) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        query, kv, _, indices = args[:4]
        batch, heads, queries, width = query.shape
        per_pair = 2 * batch * heads * 2 * width
        # each query gathers at most k entries; early queries see fewer (bounded by causality)
        selected = indices.shape[-1]
        pairs = sum(min(selected, i + 1 + max(0, kv.shape[-2] - queries)) for i in range(queries))
        return FlopCount(part="scores", flops=per_pair * pairs, all_pairs_flops=per_pair * queries * kv.shape[-2])


class _Indexer(OpContract):
    name = INDEXER
    forward, stands, saves_as, runs_as = "indexer_scores", ("dsv4.fp8_index",), "attBMM", "scores"

    def __init__(self) -> None:
        super().__init__(_ops())

    def install(self, site: Site):
        return self._installed(site)

    @contextlib.contextmanager
    def _installed(self, site: Site) -> Iterator[None]:
        import torch

        with Patched() as patched:
            for module in (site.root.modules() if site.root is not None else ()):
                name = type(module).__name__
                if name.endswith("IndexerScorer") and hasattr(module, "weights_proj"):
                    patched.set(module, "forward", functools.partial(_scores, module))
                elif name.endswith("Indexer") and hasattr(module, "scorer"):
                    patched.set(module, "forward", _without_grad(module.forward, torch))
            yield

    def flops(self, func, args, kwargs, out) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        q, compressed = args[:2]
        batch, queries, heads, width = q.shape
        flops = 2 * batch * queries * heads * compressed.shape[-2] * width
        return FlopCount(part="scores", flops=flops, all_pairs_flops=flops)


def _scores(scorer: Any, q: Any, compressed_kv: Any, hidden_states: Any) -> Any:
    """The lightning indexer scorer's forward as one kernel: ``sum_h w_h relu(q_h . k)``, fp32 ``[b, s, t]``."""
    weights = scorer.weights_proj(hidden_states).float() * scorer.weights_scaling
    return _ops().indexer_scores(q, compressed_kv, weights, float(scorer.softmax_scale))


def _without_grad(forward: Any, torch: Any) -> Any:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return forward(*args, **kwargs)
    return run


@functools.lru_cache(maxsize=None)
def sparse_attention_implementation() -> _SparseAttention:
    return _SparseAttention()


@functools.lru_cache(maxsize=None)
def indexer_implementation() -> _Indexer:
    return _Indexer()


@hookimpl
def ndcost_register(register):
    register_contracts(register, CONTRACTS)
    register_attention_kernels(register, ATTENTION_KERNELS)
