"""Helpers (no tests): Transformers' own parameters of a config, built on the meta device and summed by part.

The classification below reads parameter names only, independently of
ndcost's families: it is the reference the exactness tests compare against.
"""
from __future__ import annotations

import re
from collections import Counter


def classify(name: str) -> str:
    """The part a Transformers parameter name belongs to."""
    if re.search(r"(embed_tokens|\.wte\.|\.wpe\.)", name):
        return "embedding"
    if name.startswith("lm_head."):
        return "head"
    if re.search(r"(^|\.)(hc_head)\.", name) or re.search(r"\.(attn_hc|ffn_hc)\.", name):
        return "other"
    if ".experts." in name:
        return "routed"
    if re.search(r"\.shared_experts?\.|\.shared_expert_gate\.", name):
        return "shared"
    if re.search(r"\.mlp\.(gate|router)\.", name):
        return "router"
    if re.search(r"\.(self_attn|attn|linear_attn)\.", name):
        # a QK-norm counts as a norm; norms inside the attention's own paths (MLA latents,
        # the gated delta net, the indexer, the compressors) belong to the attention
        if re.search(r"\.(self_attn|attn)\.(q_norm|k_norm)\.", name):
            return "norm"
        return "attention"
    if re.search(r"(layernorm|\.ln_\d|\.ln_f\.|^model\.norm\.|(^|\.)norm\.)", name):
        return "norm"
    if re.search(r"\.mlp\.", name):
        return "ffn"
    return "unclassified"


def build(config):
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def hf_parts(config):
    """(by_part Counter, total, model) of Transformers' model built from *config* on the meta device."""
    model = build(config)
    parts: Counter = Counter()
    for name, p in model.named_parameters():
        parts[classify(name)] += p.numel()
    total = sum(p.numel() for p in model.parameters())
    return {k: v for k, v in parts.items() if v}, total, model


def hf_buffers(model) -> int:
    """The routers' score-correction biases Transformers keeps as buffers."""
    return sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
