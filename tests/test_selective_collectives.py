"""An op-level selective checkpoint decides on a layer's TP and EP collectives as on any op: it keeps the outputs
of those its policy saves and runs the others again in its recompute.

torchtitan's ``_save_list`` (torchtitan/distributed/activation_checkpoint.py) names
``_c10d_functional.reduce_scatter_tensor`` and no other collective; HyperParallel's adds ``all_to_all_single``.
DTensor's SP runs an all-gather into the attention and the MLP and a reduce-scatter out of each; without SP an
all-reduce out of each.
"""
import attrs
import pytest

import ndcost

SEQ = 8192


def _with_kept(model, kept):
    """*model* with the layer collectives its selective policy keeps replaced by *kept* (nothing else changed)."""
    model.resolved = attrs.evolve(model.resolved, tables=attrs.evolve(model.tables, selective_kept_collectives=kept))
    return model


@pytest.mark.parametrize("runtime, kept, rerun", [
    ("torchtitan-cuda", ("reduce_scatter",), ("all_gather", "all_reduce", "all_to_all")),
    ("hf-cuda", ("reduce_scatter",), ("all_gather", "all_reduce", "all_to_all")),
    ("hf-npu", ("reduce_scatter", "all_to_all"), ("all_gather", "all_reduce")),
])
def test_the_policy_decides_on_the_collectives(runtime, kept, rerun):
    model = ndcost.resolve("llama-3.1-8b", runtime=runtime, census="off")
    assert model.tables.selective_kept_collectives == kept
    assert model.model_work(SEQ).selective_rerun_collectives == rerun


def test_selective_keeps_the_reduce_scatters_outputs_under_sp():
    """Llama-3.1-70B, TP 8 with SP, one stage of 80 layers, one micro-batch of 8,192 tokens: two reduce-scatter
    outputs a layer of 8,192 bf16 elements a token, each rank holding 1/8 of the tokens: 80 x 8,192 x 2 x 8,192
    x 2 / 8 bytes more than a policy keeping none."""
    strategy = f"tp=8,sp=true,fsdp=4,seq={SEQ},recompute=selective"
    kept = ndcost.resolve("llama-3.1-70b", runtime="torchtitan-cuda", census="off").evaluate(strategy)
    none = _with_kept(ndcost.resolve("llama-3.1-70b", runtime="torchtitan-cuda", census="off"), ()).evaluate(strategy)
    extra = 80 * SEQ * 2 * 8192 * 2 // 8
    assert kept.stages[0].bytes_by_category["activations"] - none.stages[0].bytes_by_category["activations"] == extra
    # without SP the all-reduced outputs are whole on every rank and no policy keeps them: nothing more
    plain = strategy.replace("sp=true", "sp=false")
    assert ndcost.resolve("llama-3.1-70b", runtime="torchtitan-cuda", census="off").evaluate(plain).peak_bytes == \
        _with_kept(ndcost.resolve("llama-3.1-70b", runtime="torchtitan-cuda", census="off"), ()).evaluate(
            plain).peak_bytes


def _communication(model, strategy):
    return model.evaluate(strategy).time.communication_seconds


@pytest.mark.parametrize("sp, rerun_share", [
    # SP: the two all-gathers run again, the two reduce-scatters (as many bytes, NCCL's ring alike) are kept
    (True, 0.5),
    # no SP: both all-reduces run again, as a full recompute runs them
    (False, 1.0),
])
def test_selective_recompute_reruns_the_collectives_it_does_not_keep(sp, rerun_share):
    """Over a core-attention recompute (whose rerun holds no TP collective), selective adds that share of what a
    full recompute adds: the forward's TP collectives."""
    model = ndcost.resolve("llama-3.1-8b", runtime="torchtitan-cuda", census="off")
    base = f"tp=8,sp={str(sp).lower()},dp=2,seq={SEQ},micro_batch=1,num_micro_batches=2"
    core = _communication(model, base + ",recompute=core_attention")
    full = _communication(model, base + ",recompute=full")
    selective = _communication(model, base + ",recompute=selective")
    assert full - core > 0
    assert selective - core == pytest.approx(rerun_share * (full - core), rel=1e-9)


def test_a_kept_all_to_all_is_not_run_again():
    """EP's dispatch and combine: torchtitan's policy runs them again, as a full recompute does; a policy keeping
    them (HyperParallel's decision, on torchtitan's records: hf-npu's selective figures are the census's) does not."""
    base = "ep=8,dp=8,seq=4096,recompute="
    for rerun in (("all_gather", "all_reduce", "all_to_all"), ("all_gather", "all_reduce")):
        model = ndcost.resolve("qwen3-30b-a3b", runtime="torchtitan-cuda", census="off")
        assert model.model_work(4096).selective_rerun_collectives == ("all_gather", "all_reduce", "all_to_all")
        model.resolved.model_work[4096] = attrs.evolve(model.model_work(4096), selective_rerun_collectives=rerun)
        core = _communication(model, base + "core_attention")
        full = _communication(model, base + "full")
        selective = _communication(model, base + "selective")
        assert full - core > 0
        assert selective - core == pytest.approx(full - core if "all_to_all" in rerun else 0.0, abs=1e-12)
