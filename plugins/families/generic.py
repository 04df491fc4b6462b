"""The generic decoder: what a config of a model type nobody registered is counted as (with a warning).

It reads the common Transformers fields (``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``) and, where the
config states them, the biases, the norm kind and routed experts. Its
parameters are Transformers' own where the installed Transformers has the
model type's modules (read once on the meta device and cached:
:mod:`ndcost.plugins.census.modules`), since a config does not state every
bias, norm or fused projection its modeling code builds. Elsewhere what the
config leaves unstated follows the formulas' bias convention (HyperParallel's
``_bias``, cited in ``plugins/formulas/common.py``): a bias of the hidden width
on each projection, two vectors per norm; the parts so guessed are listed in
``ParameterCount.uncounted`` and the fallback warning. The model types below
are known by their Transformers modules to differ from a Llama-shaped decoder:
an ungated two-matrix MLP, learned absolute positions.
"""
from __future__ import annotations

import attrs

from ndcost.errors import CensusUnavailable
from ndcost.plugins.census import modules
from ndcost.plugins.families._base import DecoderFamily, check_experts, read_attention, register_family

KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}, "moe": {"attention": "gqa", "mlp": "moe"}}
# Transformers' model types whose MLP is up and down projections only (no gate).
PLAIN_MLP_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2", "codegen",
    "gpt_neo", "biogpt", "xglm", "mpt",
})
# Model types with learned absolute positions (no rotary on the queries and keys).
ABSOLUTE_POSITION_MODEL_TYPES = frozenset({"gpt2", "gpt_bigcode", "opt", "biogpt", "xglm", "bloom", "mpt"})


class GenericDecoderFamily(DecoderFamily):
    name = "generic_decoder"
    model_types = ("generic_decoder",)

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        vocab = r.int("vocab_size")
        tie = r.bool("tie_word_embeddings", False)
        attention_bias = r.bool("attention_bias", None)
        mlp_bias = r.bool("mlp_bias", None)
        if r.has("rms_norm_eps"):
            r.get("rms_norm_eps")
            norm_bias = False
        elif r.has("layer_norm_eps") or r.has("layer_norm_epsilon"):
            norm_bias = True
        else:
            norm_bias = None
        experts = None
        for field in ("num_experts", "num_local_experts", "n_routed_experts"):
            if r.has(field):
                experts = r.int(field, minimum=0)
                break
        fields = {}
        kind = "dense"
        if experts:
            kind = "moe"
            top_k = r.int("num_experts_per_tok", None)
            check_experts(r, experts, top_k)
            width = r.int("moe_intermediate_size", None) or r.int("intermediate_size")
            fields = dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width)
        intermediate = r.int("intermediate_size", None) if kind == "moe" else r.int("intermediate_size")
        model_type = str(config.get("model_type"))
        extra = {"norm_bias": norm_bias, "ffn_matrices": 2 if model_type in PLAIN_MLP_MODEL_TYPES else 3,
                 "absolute_positions": model_type in ABSOLUTE_POSITION_MODEL_TYPES}
        extra.update(_module_count(config, model_type, attention_bias, mlp_bias, norm_bias))
        return self.build(
            r, name, model_type, [kind] * n, KINDS, extra=extra,
            vocab_size=vocab, intermediate_size=intermediate, tie_word_embeddings=tie,
            attention_bias=attention_bias, mlp_bias=mlp_bias, **fields, **att)


    def layer_kind(self, config, extra, info):
        described = super().layer_kind(config, extra, info)
        return attrs.evolve(described, rotary=not extra["absolute_positions"])

    # -- parameters: Transformers' modules where they were read, else the formulas' convention --------
    def layer_parameters(self, spec, kind):
        counted = spec.extra.get("module_parameters")
        return dict(counted["layer"]) if counted else super().layer_parameters(spec, kind)

    def embedding_parameters(self, spec):
        counted = spec.extra.get("module_parameters")
        return int(counted["embedding"]) if counted else super().embedding_parameters(spec)

    def head_parameters(self, spec):
        counted = spec.extra.get("module_parameters")
        return int(counted["head"]) if counted else super().head_parameters(spec)

    def final_norm_parameters(self, spec):
        counted = spec.extra.get("module_parameters")
        return int(counted["final_norm"]) if counted else super().final_norm_parameters(spec)

    def other_parameters(self, spec):
        counted = spec.extra.get("module_parameters")
        return int(counted["other"]) if counted else 0

    def uncounted_parts(self, spec):
        return tuple(spec.extra.get("uncounted", ()))


def _module_count(config, model_type, attention_bias, mlp_bias, norm_bias):
    """``{"module_parameters": ...}`` read off Transformers' modules where they can be, else ``{"uncounted": ...}``.

    A config does not state every tensor its modeling code builds (biases
    where no ``attention_bias`` is given, QK-norms, extra norms, fused
    projections); where Transformers' modules cannot be read, the parts the
    formulas' convention stands in for are listed, with why.
    """
    try:
        counted = modules.module_parameters(config)
    except CensusUnavailable as exc:
        why = str(exc)
    except Exception as exc:  # a config Transformers refuses to build: counted by convention, said so
        why = f"Transformers could not build it on the meta device ({type(exc).__name__}: {exc})"
    else:
        layers = counted.pop("layers")
        differ = [i for i, parts in enumerate(layers) if parts != layers[0]]
        if not differ:
            return {"module_parameters": {**counted, "layer": layers[0]}}
        why = (f"its layers {', '.join(map(str, differ))} differ from layer 0, which one generic layer kind "
               f"cannot stand for")
    guesses = ["norms: two of the hidden width a layer and a final one assumed (no QK-norm or extra norm)"]
    for part, stated, field in (("attention biases", attention_bias, "attention_bias"),
                                ("MLP biases", mlp_bias, "mlp_bias")):
        if stated is None:
            guesses.append(f"{part}: the config states no {field}; one on each projection assumed")
    if norm_bias is None:
        guesses.append("norm biases: the config states no rms_norm_eps or layer_norm_eps; one on each norm assumed")
    return {"uncounted": tuple(f"{guess} [{why}]" for guess in guesses)}


ndcost_register = register_family(GenericDecoderFamily())
