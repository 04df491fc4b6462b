"""Llama, Mistral and Phi-3: GQA with optional biases, a SwiGLU FFN, two RMSNorms a layer; every layer ``dense``.

Phi-3 fuses the query, key and value projections (``qkv_proj``) and the gate and up projections
(``gate_up_proj``), none with a bias (Transformers' ``models/phi3/modeling_phi3.py``): the same parameters as
a Llama layer without biases. Mistral's and Phi-3's every layer attends within the config's ``sliding_window``
where one is set (their models' masks).
"""
from __future__ import annotations

from typing import Any, Mapping

from ndcost.plugins.families._base import DecoderFamily, read_attention, register_family

DENSE = {"dense": {"attention": "gqa", "mlp": "dense"}}


class LlamaFamily(DecoderFamily):
    """Llama (``attention_bias`` and ``mlp_bias`` as stated, False by default), Mistral and Phi-3 (no biases)."""

    def __init__(self, name: str, model_types, defaults: Mapping[str, Any], biases: bool, fused: bool = False,
                 sliding: bool = False):
        self.name = name
        self.sliding = sliding
        self.model_types = tuple(model_types)
        self.defaults = dict(defaults)
        self.biases = biases
        # separate q, k, v and gate, up projections make the calls the op records list (specs/op_records.yaml)
        self.op_record_values = {} if fused else {"calls_known": 1}

    def spec(self, config, name):
        table = DENSE
        if self.sliding:
            # MistralModel and Phi3Model mask every layer by config.sliding_window where it is set
            # (create_sliding_window_causal_mask); a config leaving it out has its config class's default (Mistral's
            # 4,096, Phi-3's none); a null attends to every earlier token
            if "sliding_window" not in config:
                config = {**config, "sliding_window": self.defaults.get("sliding_window")}
            if config["sliding_window"]:
                table = {"dense": {**DENSE["dense"], "sliding": True}}
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        attention_bias = r.bool("attention_bias") if self.biases else False
        mlp_bias = r.bool("mlp_bias") if self.biases else False
        return self.build(
            r, name, r.get("model_type", self.model_types[0]), ["dense"] * n, table,
            vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=attention_bias, mlp_bias=mlp_bias,
            max_position_embeddings=r.int("max_position_embeddings"), **att)


LLAMA = LlamaFamily("llama", ["llama"], dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False, mlp_bias=False), biases=True)
MISTRAL = LlamaFamily("mistral", ["mistral"], dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=4096 * 32, tie_word_embeddings=False, sliding_window=4096),
    biases=False, sliding=True)

PHI3 = LlamaFamily("phi3", ["phi3"], dict(  # Transformers 5.24's Phi3Config defaults
    vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
    max_position_embeddings=4096, tie_word_embeddings=False), biases=False, fused=True, sliding=True)

ndcost_register = register_family(LLAMA, MISTRAL, PHI3)
