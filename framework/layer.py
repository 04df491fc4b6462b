"""What a layer kind is: the typed description every estimator reads.

A family describes each kind of layer its model stacks (``ModelSpec.layer_kinds``):
which attention mechanism it runs, which MLP, and the small choices that change
what it computes and keeps (QK-norm, an output gate, rotary positions, a sliding
window, dropout). The estimators (op records, analytic FLOPs, the memory and
time composition) read only this, never a model type or a kind's name, so a
third-party family is priced exactly as a built-in one.
"""
from __future__ import annotations

from typing import Optional

import attrs

from ndcost.errors import InvalidValue

# Attention mechanisms by the class of computation they run. ``softmax``: multi-head attention over
# keys and values of its own heads (MHA, GQA, MQA); ``latent``: multi-head latent attention (DeepSeek-AI
# 2024, "DeepSeek-V2"), ``dsa`` with the V3.2 indexer; ``linear``: a linear recurrence (the gated delta
# net of Yang et al. 2025). A family may name a mechanism of its own and state its class
# (``LayerKind.mechanism_class``); unstated, its class is ``other``, which only a census prices.
ATTENTION_CLASSES = {"mha": "softmax", "gqa": "softmax", "mqa": "softmax",
                     "mla": "latent", "dsa": "latent", "gated_delta_net": "linear"}
MECHANISM_CLASSES = ("softmax", "latent", "linear", "other")
# MLPs: ``dense`` (one feed-forward), ``none``, or routed to experts (GPT-OSS's clamped SwiGLU experts,
# DeepSeek-V4's hash-routed layers); a family's own name counts as routed.
DENSE_MLPS = ("dense",)
NO_MLPS = ("none",)

_NAME = attrs.validators.matches_re(r"^[a-z][a-z0-9_]*$")


def _non_negative(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValue(f"LayerKind.{attribute.name} must be an integer >= 0, got {value!r}")


def _matrices(instance, attribute, value):
    if value not in (2, 3):
        raise InvalidValue(f"LayerKind.mlp_matrices must be 2 (up, down) or 3 (gate, up, down), got {value!r}")


def _dropout(instance, attribute, value):
    if not 0.0 <= value < 1.0:
        raise InvalidValue(f"LayerKind.{attribute.name} must be a probability in [0, 1), got {value!r}")


def _mechanism_class(instance, attribute, value):
    if value is not None and value not in MECHANISM_CLASSES:
        raise InvalidValue(f"LayerKind.mechanism_class must be one of {', '.join(MECHANISM_CLASSES)} (or None for "
                           f"a known mechanism), got {value!r}")


def _optional_count(instance, attribute, value):
    if value is not None:
        _non_negative(instance, attribute, value)


@attrs.frozen(kw_only=True)
class LayerKind:
    """One kind of layer: its attention, its MLP and what changes their cost.

    Widths (heads, head dims, expert counts) are the model's and live on
    :class:`~ndcost.values.ModelSpec`; a kind says which of them it uses.
    ``sliding_window`` is the keys a query sees (0: every earlier token);
    ``masked`` that its model hands the attention an explicit mask at every
    length (DeepSeek-V3.2's, its indexer's selection folded into the causal
    mask); ``layer_norms`` the norms of the layer where they differ from two.
    ``mechanism_class`` states the class of a mechanism the family names
    itself (GPT-OSS's attention with sinks is ``softmax``).
    """

    attention: str = attrs.field(validator=_NAME)
    mlp: str = attrs.field(validator=_NAME)
    mtp: bool = False
    qk_norm: bool = False
    output_gate: bool = False
    sinks: bool = False
    rotary: bool = True
    sliding_window: int = attrs.field(default=0, validator=_non_negative)
    masked: bool = False
    mlp_matrices: int = attrs.field(default=3, validator=_matrices)
    activation: str = "silu"
    attention_dropout: float = attrs.field(default=0.0, converter=float, validator=_dropout)
    hidden_dropout: float = attrs.field(default=0.0, converter=float, validator=_dropout)
    layer_norms: Optional[int] = attrs.field(default=None, validator=_optional_count)
    mechanism_class: Optional[str] = attrs.field(default=None, validator=_mechanism_class)

    @property
    def attention_class(self) -> str:
        """``softmax``, ``latent``, ``linear`` or ``other`` (see ``ATTENTION_CLASSES``)."""
        return self.mechanism_class or ATTENTION_CLASSES.get(self.attention, "other")

    def sdpa_masked(self, seq: int) -> bool:
        """Whether Transformers hands this kind's SDPA call a mask at *seq* tokens, where it otherwise passes none
        and ``is_causal``: a sliding window the sequence reaches (transformers/masking_utils.py
        ``_ignore_causal_mask_sdpa``: ``kv_length >= local_attention_size``), or a model that always builds one
        (``masked``). The kernel then keeps the mask as a bias, scores every pair of the sequence, and on CUDA takes
        the keys and values repeated to every query head (transformers/integrations/sdpa_attention.py
        ``use_gqa_in_sdpa``)."""
        return self.masked or 0 < self.sliding_window <= seq

    @property
    def linear(self) -> bool:
        """A linear recurrence: no scores, no keys and values a context-parallel ring passes."""
        return self.attention_class == "linear"

    @property
    def latent(self) -> bool:
        return self.attention_class == "latent"

    @property
    def has_mlp(self) -> bool:
        return self.mlp not in NO_MLPS

    @property
    def routed(self) -> bool:
        """Whether the layer routes its tokens to experts."""
        return self.mlp not in DENSE_MLPS + NO_MLPS

    @property
    def gated_mlp(self) -> bool:
        return self.mlp_matrices == 3
