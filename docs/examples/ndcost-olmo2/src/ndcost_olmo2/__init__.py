"""A third-party ndcost plugin: the OLMo-2 family (Transformers ``model_type`` "olmo2").

OLMo-2 (Transformers' ``models/olmo2/modeling_olmo2.py``) is a Llama-shaped
decoder with three differences:

- its QK-norm is an RMSNorm over the *whole* query and key projections
  (``heads * head_dim`` and ``kv_heads * head_dim`` wide), not one per head
  as in Qwen3; this plugin adds that count as its own formula slot,
  ``formula/olmo2.params.qk_norm``;
- its two layer norms sit after the attention and after the MLP
  (``post_attention_layernorm``, ``post_feedforward_layernorm``) instead of
  before them: the same two hidden-wide weights, so the shared
  ``norm.params.layer`` slot counts them;
- its MLP has no biases, whatever the config says.

Every layer is one kind, ``dense``: full GQA attention with that QK-norm,
rotary positions and a gated MLP. The census builds Transformers' own
``Olmo2DecoderLayer`` (SDPA is supported, and one layer runs alone, so no
stack census). The module is the distribution's one entry point (group
``ndcost.plugins``, see pyproject.toml); ndcost calls its ``ndcost_register``
hook once when it loads the plugins. Nothing here imports torch or
transformers.
"""
from __future__ import annotations

from importlib import resources
from typing import Any, Dict, Mapping

import ndcost
from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.models import formula
from ndcost.plugins.families._base import DecoderFamily, read_attention
from ndcost.values import ModelSpec

__version__ = "0.1.0"
__all__ = ["Olmo2Family", "qk_norm", "spec_path", "ndcost_register"]

# The layer kinds, in the table DecoderFamily.build turns into the LayerKinds every estimator reads
# (ModelSpec.kind_specs): one kind, full GQA attention and a dense MLP.
KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}}


# ---------------------------------------------------------------------------
# a formula slot
# ---------------------------------------------------------------------------
def qk_norm(*, heads: int, kv_heads: int, head_dim: int) -> int:
    """OLMo-2's QK-norm: one RMSNorm weight over the query projection and one over the key projection."""
    for field, value in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidValue(f"olmo2.params.qk_norm: {field} must be an integer >= 0, got {value!r}")
    return (heads + kv_heads) * head_dim


# ---------------------------------------------------------------------------
# the family
# ---------------------------------------------------------------------------
class Olmo2Family(DecoderFamily):
    """Reads an OLMo-2 config into a ModelSpec, and counts one layer by part from formula slots."""

    name = "olmo2"
    model_types = ("olmo2",)
    stack_census = False  # one Olmo2DecoderLayer runs alone
    supports_sdpa = True  # Olmo2PreTrainedModel._supports_sdpa: hf-cuda runs SDPA
    # What its modules keep beside the op records' Llama defaults (specs/op_records.yaml), from
    # modeling_olmo2.py: Olmo2RMSNorm returns (weight * x).to(dtype), so its weight multiply keeps the fp32
    # normalized tensor (4 bytes an element beside the fp32 input's 4); q_norm and k_norm normalize the whole
    # projections (a row a token each); Olmo2RotaryEmbedding returns cos and sin in fp32, which q * cos keeps.
    # Its layer makes the calls the op records list (separate q, k, v, o, gate, up, down projections), so the
    # formulas price an op-level checkpoint policy on it (calls_known).
    op_record_values: Mapping[str, float] = {"norm_bytes": 8, "qk_norm_per_head": 0, "rotary_bytes": 4,
                                             "calls_known": 1}
    # Their traffic in 2-byte elements an element (Llama's: 18 and 10, ndcost.plugins.estimators.flops). The
    # norm: to(float32) 3, pow 4, mean 2, x * rsqrt 4, the fp32 weight multiply 4, to(dtype) 3: 20. The
    # rotary, q * cos promoting to fp32: q * cos 3, rotate_half's neg 1 and cat 2, times sin 3, their fp32
    # sum 6, to(dtype) 3: 18; and each fp32 table element read is two 2-byte elements.
    elementwise_elements: Mapping[str, int] = {"norm": 20, "rotary": 18, "rotary_table": 2}
    # Olmo2Config's defaults (transformers/models/olmo2/configuration_olmo2.py), so a
    # config.json that states only what differs reads the same as Transformers reads it.
    defaults: Mapping[str, Any] = dict(
        vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False,
        hidden_act="silu", attention_dropout=0.0)

    def spec(self, config: Mapping[str, Any], name: str) -> ModelSpec:
        r = self.reader(config)
        att = read_attention(r)  # num_key_value_heads unstated: one KV head a head, as Olmo2Config reads it
        return self.build(
            r, name, "olmo2", ["dense"] * r.int("num_hidden_layers"), KINDS,
            extra={"qk_norm": True, "qk_norm_scope": "projection", "norm_bias": False},  # RMSNorm: no bias
            vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
            tie_word_embeddings=r.bool("tie_word_embeddings"),
            attention_bias=r.bool("attention_bias"),  # q, k, v and o alike
            mlp_bias=False,  # Olmo2MLP has no biases
            max_position_embeddings=r.int("max_position_embeddings"), **att)

    def layer_kind(self, config: Mapping[str, Any], extra: Mapping[str, Any], info: Mapping[str, Any]) -> LayerKind:
        """DecoderFamily's LayerKind, with Olmo2Config's defaults where the config leaves a field unstated."""
        stated = {key: value for key, value in config.items() if value is not None}
        return super().layer_kind({**self.defaults, **stated}, extra, info)

    def layer_parameters(self, spec: ModelSpec, kind: str) -> Dict[str, int]:
        if kind not in KINDS:
            raise InvalidValue(f"family {self.name}: model {spec.name!r} has no layer kind {kind!r}; "
                               f"kinds: {', '.join(KINDS)}")
        h, heads, d = spec.hidden_size, spec.num_attention_heads, spec.resolved_head_dim
        kv_heads = spec.num_key_value_heads or heads
        return {
            "attention": formula("attention.params.gqa")(
                hidden=h, heads=heads, kv_heads=kv_heads, head_dim=d,
                qkv_bias=spec.attention_bias, o_bias=spec.attention_bias),
            "norm": (formula("norm.params.layer")(hidden=h, norms=2, bias=False)
                     + formula("olmo2.params.qk_norm")(heads=heads, kv_heads=kv_heads, head_dim=d)),
            "ffn": formula("ffn.params.dense")(hidden=h, intermediate=spec.intermediate_size, matrices=3,
                                               bias=False),
        }
    # The embedding, the head (none where tied) and the final norm: Family's defaults.


OLMO2 = Olmo2Family()


def spec_path(name: str = "olmo-2-1124-7b"):
    """The spec YAML this distribution ships for *name*; pass it to ``ndcost.models.load_model``."""
    path = resources.files(__name__) / "specs" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[:-5] for p in (resources.files(__name__) / "specs").iterdir()
                       if p.name.endswith(".yaml"))
        raise InvalidValue(f"ndcost-olmo2 ships no spec {name!r}; it ships: {', '.join(known)}")
    return path


@ndcost.hookimpl
def ndcost_register(register):
    register("formula/olmo2.params.qk_norm", qk_norm)
    for model_type in OLMO2.model_types:
        register(f"family/{model_type}", OLMO2)
