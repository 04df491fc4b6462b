"""Qwen2: GQA with biases on the query, key and value projections (never the output), SwiGLU, RMSNorm."""
from __future__ import annotations

from ndcost.plugins.families._base import ATTENTION_KINDS, DecoderFamily, dense_kinds, read_attention, register_family


class Qwen2Family(DecoderFamily):
    name = "qwen2"
    model_types = ("qwen2",)
    op_record_values = {"calls_known": 1}  # its layers make the calls specs/op_records.yaml lists
    defaults = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32768,
                    tie_word_embeddings=False)

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        return self.build(
            r, name, "qwen2", dense_kinds(r, n), ATTENTION_KINDS,
            extra={"qkv_bias": True, "o_bias": False},
            vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=True, mlp_bias=False,
            max_position_embeddings=r.int("max_position_embeddings"), **att)


ndcost_register = register_family(Qwen2Family())
