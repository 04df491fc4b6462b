"""GPT-2: the GPT the published activation formulas assume.

Fused QKV and output projections with biases, a 4h GELU MLP (``n_inner``) with
biases, two LayerNorms (weight and bias) a layer, learned position
embeddings, and a head tied to the token embedding.
"""
from __future__ import annotations

from ndcost.models import check_heads, formula
from ndcost.plugins.families._base import DecoderFamily, register_family

KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}}


class GPT2Family(DecoderFamily):
    name = "gpt2"
    model_types = ("gpt2",)
    rotary = False  # learned absolute positions (wpe)
    default_dropout = 0.1  # GPT2Config's attn_pdrop and resid_pdrop
    default_activation = "gelu_new"  # GPT2Config's activation_function
    # nn.LayerNorm (native_layer_norm) keeps its 16-bit input and an fp32 mean and rstd a token
    op_record_values = {"norm_bytes": 2, "norm_row_bytes": 8, "softmax_upcast": 0}  # its softmax: compute dtype
    defaults = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                    tie_word_embeddings=True)

    def spec(self, config, name):
        r = self.reader(config)
        hidden = r.int("n_embd")
        heads = r.int("n_head")
        check_heads(self.name, hidden, heads, heads, False)
        n = r.int("n_layer")
        inner = r.int("n_inner", 4 * hidden)
        positions = r.int("n_positions")
        return self.build(
            r, name, "gpt2", ["dense"] * n, KINDS,
            extra={"norm_bias": True, "ffn_matrices": 2, "position_embeddings": positions},
            hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
            vocab_size=r.int("vocab_size"), intermediate_size=inner,
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=True, mlp_bias=True,
            max_position_embeddings=positions)

    def embedding_parameters(self, spec):
        return formula("embedding.params")(vocab=spec.vocab_size, hidden=spec.hidden_size,
                                           positions=spec.extra["position_embeddings"])


ndcost_register = register_family(GPT2Family())
