"""The stack census beside the layer census, on a family whose layers can run alone (Qwen3-MoE).

The stack census (plugins/census/stack.py) measures a family whose layers cannot run alone (DeepSeek-V4) over
the model's whole forward and backward; its selective figures, recomputed shares, gradient share and the
tensors the model hands every layer are checked here against the layer census of the same layer
(plugins/census/records.py), an independent path: one layer built apart, checkpointed and measured alone.
"""
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ndcost.values import LayerGroup  # noqa: E402

S, D = 32, 16


def _config():
    return transformers.AutoConfig.for_model(
        "qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=D, num_hidden_layers=2,
        vocab_size=100, decoder_sparse_step=1, mlp_only_layers=[])


@pytest.mark.slow
def test_stack_census_states_the_layer_census_selective_figures_gradient_share_and_shared_tables():
    from ndcost.plugins.census.records import census_kind, runtime_profile
    from ndcost.plugins.census.stack import stack_kind_records

    runtime = runtime_profile("hf-cuda")
    alone = census_kind(_config(), 0, S, runtime, "moe")
    stack = stack_kind_records(_config(), [LayerGroup(kind="moe", count=2)], S, runtime)["moe"]
    assert stack.source == "census-stack"
    # under torchtitan's policy, each layer checkpointed as a trainer wraps it
    # the working figures too: the stack's counts what the backward makes beyond every layer's saves, not what
    # was live when the forward ended (the final norm's, the head's: freed before the layers' backward runs)
    for field in ("saved_per_token", "saved_tp_per_token", "working_per_token", "working_tp_per_token", "ops",
                  "ops_tp", "flops_by_part", "selective_per_token", "selective_tp_per_token", "recomputed_attention_mm_share",
                  "recomputed_other_mm_share", "recomputed_scores_share", "working_grad_share",
                  "reserved_working_per_token",
                  "reserved_working_tp_per_token", "reserved_per_layer_tp_per_token",
                  "reserved_selective_working_per_token", "reserved_selective_working_tp_per_token",
                  "reserved_core_attention_working_per_token", "reserved_core_attention_working_tp_per_token"):
        assert getattr(alone, field) is not None and getattr(stack, field) == getattr(alone, field), field
    assert 0 < stack.working_grad_share < 1
    # the layer census's replay allocates the rotary cos and sin in each copy's forward (their storages, made
    # before it, are first seen there), the model once for the whole stack: at 32 tokens, in the small pool's
    # segments, their 2 S D 2 bytes a layer are all the per-layer excess differs by
    per_layer_difference = (stack.reserved_per_layer_per_token - alone.reserved_per_layer_per_token) * S
    assert per_layer_difference == 2 * S * D * 2
    # the rotary cos and sin every layer saves: bf16 [1, 1, S, D] each, once for the stack
    assert dict(stack.shared_saved_per_token) == dict(alone.shared_saved_per_token) == {
        "position_embeddings": 2 * D * 2}


@pytest.mark.slow
def test_stack_layers_get_no_mask_for_one_sequence_as_a_real_run(monkeypatch):
    """The model's mask builders take fake position ids for packed sequences unless told they are one sequence.

    Transformers' ``find_packed_sequence_indices`` cannot read a fake tensor
    and answers "packed": the model then builds a ``[1, 1, s, s]`` mask where a
    real run of one sequence hands SDPA none. Each layer then saved, by hand
    (bf16): k and v expanded to every head by ``repeat_kv`` in place of their
    ``KV`` heads, ``2 * 2 (H - KV) s d``, and the kernel's bias of the mask,
    ``2 s^2``: 6,144 bytes a layer here, which the layer census (its mask built
    without position ids) does not keep.
    """
    import contextlib

    from ndcost.plugins.census import stack as St
    from ndcost.plugins.census.records import _measure_plain, runtime_profile

    runtime = runtime_profile("hf-cuda")
    config = _config()
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    alone = _measure_plain(config, 0, S, runtime)
    unpacked = St.census_stack(config, S, runtime)
    assert [layer.kept_bytes for layer in unpacked] == [alone.saved_bytes - sum(alone.shared_saved_bytes.values())] * 2
    monkeypatch.setattr(St, "one_unpacked_sequence", contextlib.nullcontext)
    packed = St.census_stack(config, S, runtime)
    by_hand = 2 * 2 * (heads - kv_heads) * S * D + 2 * S * S
    assert by_hand == 6_144
    assert [p.kept_bytes - u.kept_bytes for p, u in zip(packed, unpacked, strict=True)] == [by_hand] * 2


@pytest.mark.slow
def test_stack_census_replays_each_layers_allocations_as_the_layer_census_does():
    """Each layer's reserved-over-allocated figures, from its windows of the whole stack's events, equal the layer
    census's replay of the same layer built apart, at TP 1 and TP 2, plain, checkpointed under torchtitan's
    policy and with its attention function checkpointed (the recomputation in its backward): at 16,384 tokens, where its tensors take the large pool's blocks
    (over 1 MiB), so a storage missing from or added to a window moves the figures."""
    from ndcost.plugins.census import stack as St
    from ndcost.plugins.census.records import (_measure_plain, _measure_selective, core_attention_policy,
                                               policy_for, runtime_profile)

    runtime, seq = runtime_profile("hf-cuda"), 16_384
    policy = policy_for(runtime)
    for tp in (1, 2):
        config = St.stack_tp_config(_config(), tp)
        alone = _measure_plain(config, 0, seq, runtime).stack_excess
        stacked = [layer.stack_excess for layer in St.census_stack(config, seq, runtime)]
        assert alone.per_layer_bytes != 0 and alone.working_bytes > 0
        assert stacked == [alone, alone], tp
        for each in (policy, core_attention_policy()):  # the whole layer checkpointed; its attention alone
            checkpointed = _measure_selective(config, 0, seq, runtime, each, False)[0].stack_excess
            assert checkpointed != alone, each.name
            assert [layer.stack_excess for layer in St.census_stack(config, seq, runtime, each)] == \
                [checkpointed] * 2, each.name
