"""The work of a layer kind and of a model, as the time model reads it: FLOPs by op class, bytes moved.

A FLOPs estimator (``estimator/flops/<name>``: the census's measured FLOPs, or
the analytic shapes of :mod:`ndcost.plugins.estimators.flops`) turns each layer
kind into a :class:`KindWork`; the resolver gathers them into a
:class:`ModelWork` per sequence length.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue
from ndcost.values import frozen_mapping

# An RMSNorm upcasts to fp32, squares, averages, scales, casts back and multiplies by its weight: 18
# 2-byte elements moved an element (Transformers' eager LlamaRMSNorm); the analytic traffic of a norm.
NORM_ELEMENTS = 18


# ---------------------------------------------------------------------------
# pairs of tokens the attention computes
# ---------------------------------------------------------------------------
def causal_pairs(seq):
    """Query-key pairs a causal kernel computes on one sequence: ``s (s + 1) / 2``."""
    s = np.asarray(seq, dtype=np.float64)
    return s * (s + 1.0) / 2.0


def window_pairs(seq, window):
    """Causal pairs under a sliding window of *window* keys (0: no window), vectorized."""
    s = np.asarray(seq, dtype=np.float64)
    w = np.asarray(window, dtype=np.float64)
    windowed = w * (w + 1.0) / 2.0 + (s - w) * w
    return np.where((w > 0) & (s > w), windowed, causal_pairs(s))


# ---------------------------------------------------------------------------
# one layer kind's work
# ---------------------------------------------------------------------------
# KindWork.source's start where the analytic estimator counted the work from the shapes (a census's names it)
ANALYTIC_FLOPS = "analytic flops"
# The kernels a layer's forward launches more where Transformers hands its SDPA call a mask
# (LayerKind.sdpa_masked): repeat_kv's copies of the keys and values (transformers/integrations/sdpa_attention.py)
# and SDPA's turning the boolean mask into the kernel's additive bias; the census counts 6 on Mistral-7B's layer
# under hf-cuda at 4,096 tokens (44 against the 38 of the same layer unmasked: attention 18 and 14, scores 3 and 1)
MASKED_SDPA_LAUNCHES = 6
# The kernels Transformers' eager_attention_forward launches beyond an SDPA call's one (modeling_llama.py): the scores'
# matmul, scaling, mask addition, softmax to fp32 and cast back, dropout and the context's matmul; the census counts
# 7 more on a Llama layer under hf-cuda-eager than under hf-cuda (45 against 38 a layer), and 2 more again where
# repeat_kv copies the keys and values to the query heads (GQA)
EAGER_ATTENTION_LAUNCHES = 7
REPEAT_KV_LAUNCHES = 2
GEMM_CLASSES = ("attention", "other", "routed")  # the KindWork FLOPs field each prices
GEMM_SPLITS = ("none", "column", "row")          # what TP (ETP for routed experts) divides: nothing, out, in


def _one_of(choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise InvalidValue(f"Gemm.{attribute.name} must be one of {', '.join(choices)}, got {value!r}")
    return check


def _positive(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidValue(f"Gemm.{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen(kw_only=True)
class Gemm:
    """One projection shape of a layer, ``y = x W^T`` with ``W`` of ``out_features x in_features``, at TP 1.

    ``count`` such GEMMs a layer; ``split`` is how tensor parallelism
    divides it (``column``: ``out / tp``; ``row``: ``in / tp``). A
    ``routed`` one (op class) is an expert's: ``tokens_per_token`` experts
    a token (top-k) over ``experts`` experts, so each expert multiplies
    the tokens routed to it (``M`` in :func:`ndcost.compose.time.layer_seconds`).
    ``forward_only``: autograd records no backward for it (DeepSeek-V3.2's
    indexer, run under no_grad; ``KindWork.forward_only_*``).
    """

    op_class: str = attrs.field(validator=_one_of(GEMM_CLASSES))
    in_features: int = attrs.field(validator=_positive)
    out_features: int = attrs.field(validator=_positive)
    count: int = attrs.field(default=1, validator=_positive)
    split: str = attrs.field(default="none", validator=_one_of(GEMM_SPLITS))
    tokens_per_token: int = attrs.field(default=1, validator=_positive)
    experts: int = attrs.field(default=1, validator=_positive)
    forward_only: bool = False

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs a token of the layer's input, all ``count`` of them, at TP 1."""
        return 2.0 * self.count * self.tokens_per_token * self.in_features * self.out_features


def tp_whole_parameters(gemms: Sequence[Gemm]) -> int:
    """The weights of a layer's TP-split parts (``attention`` GEMMs) that tensor parallelism leaves whole: every TP
    rank holds and multiplies them (``Gemm.split`` ``none``: MLA's down-projections, DeepSeek-V3.2's indexer
    projections; routers are a replicated part already). Their biases and the latents' norms are left out."""
    return sum(g.in_features * g.out_features * g.count for g in gemms
               if g.split == "none" and g.op_class == "attention")


@attrs.frozen(kw_only=True)
class KindWork:
    """One layer kind's forward work, per token or per pair of tokens, at TP 1 and CP 1.

    FLOPs are split by the op class that prices them; ``routed`` is the
    routed experts' matmuls (scaled by ``moe_imbalance``). Elementwise bytes
    are in elements per token (times the compute dtype's width): those
    tensor parallelism splits, and those it splits only under sequence
    parallelism (norms and residual adds over the hidden width). ``gemms``
    are the matmul shapes whose efficiency prices those FLOPs (their share
    of each class, not their totals, is read where the FLOPs were measured);
    ``launches_*`` the kernels a forward launches, which bound a pass below.
    """

    kind: str
    source: str
    attention_mm_flops_per_token: float
    other_mm_flops_per_token: float
    routed_mm_flops_per_token: float = 0.0
    score_flops_per_pair: float = 0.0
    window: int = 0
    linrec_flops_per_token: float = 0.0
    elementwise_elements_per_token: float = 0.0
    replicated_elements_per_token: float = 0.0
    dense_parameters: int = 0          # split by TP
    routed_parameters: int = 0         # split by EP x ETP
    replicated_parameters: int = 0     # norms: held whole by every TP rank
    recomputed_attention_mm_share: Optional[float] = None
    recomputed_other_mm_share: Optional[float] = None
    recomputed_scores_share: Optional[float] = None
    query_elements_per_token: int = 0  # what Ulysses moves for queries and outputs
    kv_elements_per_token: int = 0     # keys and values a CP ring passes
    kv_copies: int = 1                 # of them, the copies of a KV head the attention takes (repeat_kv)
    experts_per_token: int = 0         # 0: no expert all-to-all
    has_attention: bool = True
    # under Strategy.float8: the FLOPs of the Linear layers torchao converts (attention projections, dense and
    # shared MLP: the TP-split parts), their matmuls' input and output elements a token (what is cast); None: unknown
    float8_mm_flops_per_token: Optional[float] = None
    float8_input_elements_per_token: Optional[float] = None
    float8_output_elements_per_token: Optional[float] = None
    # of those inputs, each read once where projections reading one tensor are one fused linear (Transformer
    # Engine's linear_qkv and linear_fc1 under Megatron-LM, RuntimeProfile.float8_casts)
    float8_fused_input_elements_per_token: Optional[float] = None
    # of those inputs, the ones a TP rank reads gathered (linears TP does not split by rows), and of the outputs, the
    # ones whose gradient it reads gathered (linears TP does not split by columns): cast after SP's gather wherever
    # no Float8 TP style casts them before it (torchtitan's llama3 parallelize_llama.py, rowwise recipes)
    float8_gathered_input_elements_per_token: Optional[float] = None
    float8_gathered_output_elements_per_token: Optional[float] = None
    # under Strategy.float8_experts: the routed experts' matmuls' input and output elements a token (each of its
    # copies, one an expert it is routed to); their FLOPs are routed_mm_flops_per_token; None: unknown
    float8_routed_input_elements_per_token: Optional[float] = None
    float8_routed_output_elements_per_token: Optional[float] = None
    # under Strategy.compile: the elementwise elements a token with each pointwise chain fused (TP-split, and
    # those TP splits only under SP, as the eager pair above); None: unknown
    compiled_elementwise_elements_per_token: Optional[float] = None
    compiled_replicated_elements_per_token: Optional[float] = None
    # under Strategy.compile with a rotary embedding torch.compile cannot fuse (RuntimeProfile.rotary complex):
    # the elements a token its separate kernels move beyond the fused chain's (TP-split)
    unfused_rotary_elements_per_token: float = 0.0
    gemms: Tuple[Gemm, ...] = ()       # the matmul shapes (empty: unknown, a constant efficiency prices them)
    launches_per_layer: float = 0.0    # kernels a forward launches, at TP 1
    launches_per_token: float = 0.0    # more of them for each token of a sequence (a chunked recurrence's loop)
    # the attention kernel's shape at TP 1: query heads, a query's (and key's) and a value's width a head; 0:
    # unknown (the constant efficiency.attention prices the scores)
    attention_heads: int = 0
    attention_head_dim: int = 0
    attention_value_head_dim: int = 0
    # keys a query's scores span beyond the sequence's own, per token of the sequence: eager attention runs
    # s x s (1 + this) pairs (DeepSeek-V4 concatenates its s / compress rate compressed entries to the keys;
    # a remainder shorter than a window is left out)
    extra_keys_per_token: float = 0.0
    # of the forward figures above, the work autograd records no backward for (a module's no_grad work, as
    # DeepSeek-V3.2's indexer under Transformers, and integer bookkeeping): the backward repeats none of it
    forward_only_attention_mm_flops_per_token: float = 0.0
    forward_only_other_mm_flops_per_token: float = 0.0
    forward_only_routed_mm_flops_per_token: float = 0.0
    forward_only_score_flops_per_pair: float = 0.0
    forward_only_linrec_flops_per_token: float = 0.0
    forward_only_elementwise_elements_per_token: float = 0.0
    forward_only_replicated_elements_per_token: float = 0.0

    @classmethod
    def idle(cls, kind: str, source: str) -> "KindWork":
        """The work of a kind the runtime builds no layer of (MTP layers Transformers does not build): none, every
        figure known to be zero, so no feature's pricing finds it unknown."""
        return cls(kind=kind, source=source, attention_mm_flops_per_token=0.0, other_mm_flops_per_token=0.0,
                   has_attention=False, recomputed_attention_mm_share=0.0, recomputed_other_mm_share=0.0,
                   recomputed_scores_share=0.0,
                   float8_mm_flops_per_token=0.0, float8_input_elements_per_token=0.0,
                   float8_output_elements_per_token=0.0, float8_fused_input_elements_per_token=0.0,
                   float8_routed_input_elements_per_token=0.0, float8_routed_output_elements_per_token=0.0,
                   float8_gathered_input_elements_per_token=0.0, float8_gathered_output_elements_per_token=0.0,
                   compiled_elementwise_elements_per_token=0.0,
                   compiled_replicated_elements_per_token=0.0)

    def masked_sdpa(self, seq: int, repeats_kv: bool = False) -> "KindWork":
        """This work (the analytic estimator's, at *seq* tokens) where Transformers hands its SDPA call a mask
        (:meth:`~ndcost.layer.LayerKind.sdpa_masked`): the kernel scores every pair of the sequence, where the
        analytic FLOPs count the causal or windowed ones, the layer launches :data:`MASKED_SDPA_LAUNCHES`
        more and, *repeats_kv* (fewer key-value heads than query heads), moves repeat_kv's copies of the keys and
        values to every query head (each read expanded and written). The mask is turned into the kernel's bias with
        two fp32 scalars made (forward-only, 8 bytes a layer); left out, as the census files it with the kernel's
        own bytes (a tensor of the sequence's pairs), the bias itself: 11 bytes a pair (a torch.where into fp32, a
        cast). A census's work is what ran already (its FLOPs a pair are over the windowed pairs, as here)."""
        copies = 2.0 * self.attention_heads * (self.attention_head_dim + self.attention_value_head_dim) \
            if repeats_kv else 0.0
        scalars = 4.0 / seq  # 2-byte elements a token
        return attrs.evolve(self.every_pair(seq), launches_per_layer=self.launches_per_layer + MASKED_SDPA_LAUNCHES,
                            elementwise_elements_per_token=self.elementwise_elements_per_token + copies + scalars,
                            forward_only_elementwise_elements_per_token=(
                                self.forward_only_elementwise_elements_per_token + scalars))

    def eager_attention(self, launches: int = EAGER_ATTENTION_LAUNCHES, repeats_kv: bool = False) -> "KindWork":
        """This work (the analytic estimator's) under Transformers' eager attention: *launches* more kernels than
        an SDPA call (a family may state its own: ``Family.kernel_launches["eager_attention"]``), and repeat_kv's
        copies where the keys and values are repeated (the time model prices its scores over every pair)."""
        return attrs.evolve(self, launches_per_layer=self.launches_per_layer + launches
                            + (REPEAT_KV_LAUNCHES if repeats_kv else 0))

    def every_pair(self, seq: int) -> "KindWork":
        """This work (the analytic estimator's, at *seq* tokens) with its attention kernel's FLOPs over every pair of
        the sequence, as a kernel computes them that masks rather than skips (eager attention, a masked SDPA call),
        stated a windowed pair, as a census states what it counted (forward-only scores, as DeepSeek-V3.2's
        indexer's, are no kernel's: kept)."""
        kernel = self.score_flops_per_pair - self.forward_only_score_flops_per_pair  # (the rest are not its)
        return attrs.evolve(self, score_flops_per_pair=kernel * seq * seq / float(window_pairs(seq, self.window))
                            + self.forward_only_score_flops_per_pair)

    def forward_flops(self, seq, *, all_pairs: bool = False, forward_only: bool = False):
        """This kind's forward FLOPs on one sequence of *seq* tokens (vectorized); *forward_only*: of them, those
        the backward does not repeat."""
        s = np.asarray(seq, dtype=np.float64)
        pairs = s * s if all_pairs else window_pairs(s, self.window)
        prefix = "forward_only_" if forward_only else ""
        per_token = sum(getattr(self, f"{prefix}{name}_flops_per_token")
                        for name in ("attention_mm", "other_mm", "routed_mm", "linrec"))
        return s * per_token + pairs * getattr(self, f"{prefix}score_flops_per_pair")

    def training_flops(self, seq, *, all_pairs: bool = False):
        """FLOPs of a forward and its backward on one sequence: the backward twice the forward's but what it
        does not repeat."""
        forward = self.forward_flops(seq, all_pairs=all_pairs)
        return 3.0 * forward - 2.0 * self.forward_flops(seq, all_pairs=all_pairs, forward_only=True)


def as_run(work: KindWork, spec: Any, kind: str, kernel: Optional[str], seq: int,
           kernel_launches: Mapping[str, int]) -> KindWork:
    """An analytic kind's *work* (*kind* of *spec*, a :class:`~ndcost.values.ModelSpec`) as the runtime's attention
    *kernel* runs it at *seq* tokens: an SDPA call handed a mask (:meth:`KindWork.masked_sdpa`), or Transformers'
    eager attention (``"eager"``: :meth:`KindWork.eager_attention`, the family's *kernel_launches*
    ``["eager_attention"]`` more kernels, else :data:`EAGER_ATTENTION_LAUNCHES`); the key-value heads repeated to the
    query heads where fewer. A census's work is what ran: returned as it is."""
    info = spec.kind(kind)
    if not work.has_attention or not work.source.startswith(ANALYTIC_FLOPS) or info.linear:
        return work
    heads = spec.num_attention_heads
    repeats_kv = info.attention_class == "softmax" and (spec.num_key_value_heads or heads) < heads
    if kernel == "sdpa" and info.sdpa_masked(seq):
        return work.masked_sdpa(seq, repeats_kv)
    if kernel == "eager" and info.attention_class in ("softmax", "latent"):
        return work.eager_attention(kernel_launches.get("eager_attention", EAGER_ATTENTION_LAUNCHES),
                                    repeats_kv=repeats_kv)
    return work


@attrs.frozen(kw_only=True)
class ModelWork:
    """A model's work for the time model: each kind's, the layer order, and the embedding and head."""

    name: str
    hidden_size: int
    vocab_size: int
    kinds: Tuple[str, ...]
    work: Mapping[str, KindWork] = attrs.field(converter=frozen_mapping)
    layer_runs: Tuple[Tuple[str, int], ...]  # the non-MTP layers in model order, as (kind, count) runs
    mtp_kinds: Tuple[str, ...] = ()        # MTP layers, placed after the last layer
    embedding_parameters: int = 0
    head_parameters: int = 0               # 0 where tied (the head still runs its matmul)
    final_norm_parameters: int = 0
    head_flops_per_token: float = 0.0
    loss_bytes_per_token: Optional[float] = None  # the output layer's elementwise bytes (census); else analytic
    source: str = ""
    attention_kernel: str = ""             # the runtime's attention kernel (attention_kernel/<name>); "": unknown
    routed_experts: int = 0                # each MoE layer's routed experts (0: none)
    experts_per_token: int = 0             # the routed experts a token takes
    expert_groups: int = 1                 # group-limited routing: a token's experts from expert_groups_per_token
    expert_groups_per_token: int = 1       # of expert_groups equal groups (ModelSpec's; 1 and 1: not limited)
    # the layer collectives (resolver.LAYER_COLLECTIVE_OPS' keys) recompute=selective runs again in its recompute
    selective_rerun_collectives: Tuple[str, ...] = ()
    # the order the runtime's own attention tries the kernels, by the least compute capability it applies from
    # (RuntimeProfile.attention_backends; empty: SDPA's, the hardware's), and whether its pointwise ops run fused
    # (RuntimeProfile.pointwise: priced as Strategy.compile prices the elementwise bytes), whether its rotary
    # embedding multiplies complex numbers (RuntimeProfile.rotary: torch.compile leaves it unfused), and how its
    # Float8 linears cast (RuntimeProfile.float8_casts)
    attention_backends: Mapping[str, Tuple[str, ...]] = attrs.field(factory=dict, converter=frozen_mapping)
    fused_pointwise: bool = False
    complex_rotary: bool = False
    float8_casts: str = "torchao"

    @property
    def num_layers(self) -> int:
        """The non-MTP layers."""
        return sum(count for _, count in self.layer_runs)

    def layer_counts(self) -> Dict[str, int]:
        """Each kind's layers, MTP ones included."""
        counts = dict.fromkeys(self.kinds, 0)
        for kind, count in self.layer_runs:
            counts[kind] += count
        for kind in self.mtp_kinds:
            counts[kind] += 1
        return counts

    def _layers_forward_flops(self, seq, all_pairs: bool):
        return sum(count * self.work[kind].forward_flops(seq, all_pairs=all_pairs)
                   for kind, count in self.layer_counts().items() if count)

    def forward_flops_per_sequence(self, seq, *, all_pairs: bool = False):
        """The whole model's forward FLOPs on one sequence (every layer, MTP layers and their heads)."""
        heads = 1 + len(self.mtp_kinds)
        return (self._layers_forward_flops(seq, all_pairs)
                + heads * self.head_flops_per_token * np.asarray(seq, dtype=np.float64))

    def training_flops_per_sequence(self, seq, *, recompute: str = "none", all_pairs: bool = False):
        """FLOPs a training step runs on one sequence: forward, a backward of twice it (less the forward-only
        work's), and recompute.

        Full recompute runs every layer's forward again (not the head's, whose
        output the loss consumes at once); ``all_pairs`` counts the scores at
        every pair of tokens as Narayanan et al. do. Selective recompute
        depends on the census's shares and is priced by :func:`step_time`.
        """
        if recompute not in ("none", "full"):
            raise InvalidValue(f"training_flops_per_sequence prices recompute none or full, not {recompute!r}")
        layers = sum(count * self.work[kind].training_flops(seq, all_pairs=all_pairs)
                     for kind, count in self.layer_counts().items() if count)
        if recompute == "full":
            layers = layers + self._layers_forward_flops(seq, all_pairs)
        heads = (1 + len(self.mtp_kinds)) * self.head_flops_per_token * np.asarray(seq, dtype=np.float64)
        return layers + 3.0 * heads
