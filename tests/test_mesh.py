"""The trainers' sharding vocabulary against figures derived here by hand: ``shard_mesh`` (dp_cp, dp, fsdp_cp:
torchtitan's dp_shard_cp mesh), HSDP over the cp ranks, ``reshard_after_forward=false``'s bytes and seconds,
and the refusals (zero with fsdp_cp, reshard_after_forward=false with zero=3, a vocab_parallel tp that does
not divide the vocabulary).

Bytes are checked on Llama-3.1-8B's shapes, its parameters counted tensor by tensor below (8,030,261,248,
Meta's published 8.03B), priced from hand-made activation records (``CostModel.from_records``): the
persistent categories are parameter count x bytes / ways, whatever the records. Seconds are checked on
``test_time_step``'s toy model and hardware (every efficiency 1, no latency).
"""
from __future__ import annotations

import math

import pytest
from test_memory import records
from test_time_step import BASE, STEP, WITHIN, toy_hardware, toy_parameters, toy_spec

from ndcost.compose import time as ct
from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.plugins.estimators import flops as analytic
from ndcost.values import LayerGroup, ModelSpec, Strategy

# Llama-3.1-8B: 32 layers, hidden 4096, 32 query heads and 8 KV heads of 128, intermediate 14336, vocabulary 128256
H, A, KV, DH, I, V, L = 4096, 32, 8, 128, 14336, 128256, 32
ATTN = H * A * DH + 2 * H * KV * DH + A * DH * H      # q, k, v, o (no biases)
FFN = 3 * H * I                                       # gate, up, down
NORMS = 2 * H                                         # the two RMSNorm weights of a layer
LAYER = ATTN + FFN + NORMS
EMB = HEAD = V * H                                    # untied
FINAL = H
P = L * LAYER + EMB + HEAD + FINAL
S = 4096
PERSISTENT = ("parameters", "gradients", "master", "optimizer_states")
# bytes a parameter of each persistent category: bf16 parameters, gradients and AdamW's two moments, fp32 master
WIDTH = {"parameters": 2, "gradients": 2, "master": 4, "optimizer_states": 2 * 2}


def test_hand_count_is_meta_s_eight_billion():
    assert P == 8_030_261_248


def llama8b_model(**record):
    """Llama-3.1-8B's shapes counted by hand above, priced from hand-made records (*record*: their fields)."""
    from ndcost.models import ParameterCount
    from ndcost.resolver import CostModel
    spec = ModelSpec(name="llama-3.1-8b-shapes", model_type="llama", family="llama", hidden_size=H, vocab_size=V,
                     layers=(LayerGroup(kind="dense", count=L),), num_attention_heads=A,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, num_key_value_heads=KV,
                     head_dim=DH, intermediate_size=I)
    counts = ParameterCount(by_kind={"dense": {"attention": ATTN, "ffn": FFN, "norm": NORMS}},
                            layer_counts={"dense": L}, embedding=EMB, head=HEAD, final_norm=FINAL, mtp=0, buffers=0,
                            total=P, by_part={"attention": L * ATTN, "ffn": L * FFN, "norm": L * NORMS + FINAL,
                                              "embedding": EMB, "head": HEAD})
    return CostModel.from_records(spec, counts, {S: records(S, **record)})


@pytest.fixture(scope="module")
def llama8b():
    return llama8b_model()


def _stage(cm, text, stage=0):
    cost = cm.evaluate(Strategy.parse(text))
    return cost.stages[stage]


def _persistent(cm, text, master_dtype="fp32"):
    # two micro-batches: the second backward finds every gradient made, so each category is whole at any moment
    held = _stage(cm, f"{text},num_micro_batches=2,seq={S},master_dtype={master_dtype}").bytes_by_category
    return {name: held[name] for name in PERSISTENT}


def _split(ways, sharded=PERSISTENT):
    """The persistent bytes of the whole model on one device, each category in *sharded* split *ways* ways."""
    return {name: WIDTH[name] * (math.ceil(P / ways) if name in sharded else P) for name in PERSISTENT}


# ---------------------------------------------------------------------------
# shard_mesh: dp_cp (the default) against dp
# ---------------------------------------------------------------------------
ZERO_SHARDS = {1: ("master", "optimizer_states"), 2: ("master", "optimizer_states", "gradients"), 3: PERSISTENT}


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_over_dp_times_cp_or_dp_alone(llama8b, zero):
    # dp 2 x cp 4: ZeRO shards over the 8 ranks (dp_cp), or over the 2 dp ranks, the 4 cp ranks replicating (dp)
    text = f"dp=2,cp=4,zero={zero}"
    assert _persistent(llama8b, text) == _split(8, ZERO_SHARDS[zero])
    assert _persistent(llama8b, text + ",shard_mesh=dp") == _split(2, ZERO_SHARDS[zero])


def test_fsdp_over_fsdp_times_cp_or_fsdp_alone(llama8b):
    # HSDP dp 2 x fsdp 2 with cp 2: shards over fsdp * cp = 4 (dp_cp and fsdp_cp alike), or fsdp = 2 (dp)
    text = "dp=2,fsdp=2,cp=2"
    assert _persistent(llama8b, text) == _split(4)
    assert _persistent(llama8b, text + ",shard_mesh=fsdp_cp") == _split(4)
    assert _persistent(llama8b, text + ",shard_mesh=dp") == _split(2)


def test_shard_mesh_changes_nothing_without_cp(llama8b):
    for text in ("dp=8,zero=1", "fsdp=8", "dp=2,fsdp=4"):
        base = llama8b.evaluate(Strategy.parse(f"{text},seq={S}"))
        for mesh in ("dp", "fsdp_cp"):
            if "zero" in text and mesh == "fsdp_cp":
                continue
            other = llama8b.evaluate(Strategy.parse(f"{text},seq={S},shard_mesh={mesh}"))
            assert other.peak_bytes == base.peak_bytes
            assert other.time.step_seconds == base.time.step_seconds


# ---------------------------------------------------------------------------
# torchtitan's meshes: (dp_replicate, dp_shard, cp)
# ---------------------------------------------------------------------------
def test_torchtitan_fsdp_1_cp_8_shards_over_the_cp_ranks(llama8b):
    """torchtitan's "FSDP 1, CP 8" (docs/performance.md, Table 2: Llama 3.1 8B, 8 GPUs) applies FSDP over its
    dp_shard_cp mesh of 8 ranks: fsdp=1,cp=8,shard_mesh=fsdp_cp. Plain fsdp=1,cp=8 shards nothing: the issue's
    168 GiB. In torchtitan's precision (fp32 parameters, gradients and AdamW moments, bf16 compute) a device
    held 16 bytes a parameter, and autocast's bf16 copies of the matmul weights (the layers' attention and MLP,
    the head); sharded, 16 bytes of an eighth of them (FSDP's mixed precision gathers bf16: no autocast)."""
    torchtitan = "param_dtype=fp32,compute_dtype=bf16,optimizer_dtype=fp32"
    whole = _persistent(llama8b, f"cp=8,{torchtitan}", master_dtype="none")
    copies = L * (ATTN + FFN) + HEAD
    assert whole == {"parameters": 4 * P + 2 * copies, "gradients": 4 * P, "master": 0, "optimizer_states": 8 * P}
    assert sum(whole.values()) == 143_493_496_832                     # 133.6 GiB
    sharded = _persistent(llama8b, f"cp=8,shard_mesh=fsdp_cp,{torchtitan}", master_dtype="none")
    share = math.ceil(P / 8)
    assert sharded == {"parameters": 4 * share, "gradients": 4 * share, "master": 0, "optimizer_states": 8 * share}
    assert sum(sharded.values()) == 16_060_522_496                    # 15.0 GiB
    # ZeRO-3 over dp * cp shards as many ways
    assert _persistent(llama8b, f"cp=8,zero=3,{torchtitan}", master_dtype="none") == sharded
    # the rest of the peak: FSDP2 keeps the root (embedding, final norm, head) gathered in bf16 for the step
    held = _stage(llama8b, f"cp=8,shard_mesh=fsdp_cp,{torchtitan},seq={S}").bytes_by_category
    assert held["communication"] >= (EMB + HEAD + FINAL) * 2


def test_torchtitan_hsdp_over_the_cp_ranks_alone(llama8b):
    """dp_replicate 2, dp_shard 1, cp 2: HSDP whose shard group is the 2 cp ranks, 2 replicas of it
    (dp=2,cp=2,shard_mesh=fsdp_cp); ZeRO-3 over dp * cp would split 4 ways, so it cannot say this."""
    assert _persistent(llama8b, "dp=2,cp=2,shard_mesh=fsdp_cp") == _split(2)
    assert _persistent(llama8b, "dp=2,cp=2,zero=3") == _split(4)
    # dp_replicate 2, dp_shard 1, cp 1: plain DDP over the 2 replicas, nothing sharded
    assert _persistent(llama8b, "dp=2,shard_mesh=fsdp_cp") == _split(1)


# ---------------------------------------------------------------------------
# reshard_after_forward=false: bytes
# ---------------------------------------------------------------------------
def test_reshard_after_forward_false_keeps_the_stage_s_layers_gathered(llama8b):
    """fsdp 4 x pp 2, 16 layers a stage, bf16 gathers. Resharding, the first stage's last-layer backward holds the
    embedding (FSDP2's root, gathered for the step), the layer and the next one prefetched (two layers, bf16)
    and the layer's gradient before its reduce-scatter. Keeping them, all 16 layers are gathered since their
    forward (the prefetched one among them): 16 - 2 layers more. The head's stage peaks at the loss, where the
    root (final norm, head) and all 16 layers are held gathered: 16 layers more than resharding's root alone."""
    text = f"fsdp=4,pp=2,num_micro_batches=4,seq={S}"
    first, first_kept = _stage(llama8b, text), _stage(llama8b, text + ",reshard_after_forward=false")
    assert first.provenance["moment"] == first_kept.provenance["moment"] == "last layer backward"
    assert first.bytes_by_category["communication"] == EMB * 2 + LAYER * (2 * 2 + 2)
    assert first_kept.bytes_by_category["communication"] == EMB * 2 + 16 * LAYER * 2 + LAYER * 2
    assert first_kept.peak_bytes - first.peak_bytes == (16 - 2) * LAYER * 2
    last_kept = _stage(llama8b, text + ",reshard_after_forward=false", stage=1)
    assert last_kept.provenance["moment"] == "output backward"
    assert last_kept.bytes_by_category["communication"] == (HEAD + FINAL) * 2 + 16 * LAYER * 2


@pytest.mark.parametrize("text", ["dp=4", "dp=4,zero=1", "dp=4,zero=2", "cp=2"])
def test_reshard_after_forward_false_changes_nothing_where_nothing_gathers(llama8b, text):
    base = llama8b.evaluate(Strategy.parse(f"{text},seq={S},num_micro_batches=2"))
    kept = llama8b.evaluate(Strategy.parse(f"{text},seq={S},num_micro_batches=2,reshard_after_forward=false"))
    assert [s.bytes_by_category for s in kept.stages] == [s.bytes_by_category for s in base.stages]
    assert kept.time.step_seconds == base.time.step_seconds


# ---------------------------------------------------------------------------
# seconds, on the toy model: a ring gather or scatter of B bytes over n ranks sends (n - 1) / n * B
# ---------------------------------------------------------------------------
def _time(*texts):
    spec = toy_spec()
    return ct.step_time(analytic.model_work(spec, 512), [Strategy.parse(t) for t in texts], toy_hardware())


def test_reshard_after_forward_false_drops_the_backward_gather():
    """FSDP 2, three micro-batches, bf16: each gathers the parameters for its forward and its backward and
    reduce-scatters the gradients, half of each sent (``test_fsdp_and_zero1_volumes``), a layer at a time
    (each a 1-step Simple ring, BASE + STEP), the root (embedding, head, norm) gathered once; kept gathered,
    the backward's 2 layer gathers go."""
    spec = toy_spec()
    one = (1 / 2) * toy_parameters(spec) * 2 / WITHIN
    root = (1 / 2) * (2 * spec.vocab_size * spec.hidden_size + spec.hidden_size) * 2 / WITHIN
    r = _time("seq=512,fsdp=2,num_micro_batches=3", "seq=512,fsdp=2,num_micro_batches=3,reshard_after_forward=false")
    assert r.communication_seconds[0] == pytest.approx(3 * (3 * one - root + 8 * (BASE + STEP)), rel=1e-12)
    assert r.communication_seconds[1] == pytest.approx(3 * (2 * one + 6 * (BASE + STEP)), rel=1e-12)


def test_gradients_reduced_over_every_replica_under_shard_mesh_dp():
    """ZeRO-1, dp 2 x cp 2 (toy parameters P, bf16 gradients 2P bytes). dp_cp: one reduce-scatter over the 4
    ranks, 3/4 of 2P sent. dp: a reduce-scatter over the 2 dp ranks (1/2 of 2P), then the cp pair all-reduces
    its half (a ring all-reduce of P bytes over 2 sends 2 (1/2) P). Each a Simple ring: BASE and a STEP each of
    its 3, 1 and 2 steps."""
    P_toy = toy_parameters(toy_spec())
    r = _time("seq=512,dp=2,cp=2,zero=1", "seq=512,dp=2,cp=2,zero=1,shard_mesh=dp")
    assert r.detail["grad_sync_seconds"][0] == pytest.approx((3 / 4) * 2 * P_toy / WITHIN + BASE + 3 * STEP,
                                                             rel=1e-12)
    assert r.detail["grad_sync_seconds"][1] == pytest.approx(((1 / 2) * 2 * P_toy + P_toy) / WITHIN
                                                             + 2 * BASE + 3 * STEP, rel=1e-12)


def test_hsdp_over_the_cp_ranks_reduces_over_the_replicas():
    """dp 2, cp 2, shard_mesh=fsdp_cp: the gathers and reduce-scatters run over the cp pair, then the 2 replicas
    all-reduce their half of the gradients (P bytes, a ring over 2 sends P); FSDP 1 CP 2 (no replicas) reduces
    nothing more, and its gathers match ZeRO-3's over the same 2 ranks. The all-reduce: a 2-step Simple ring."""
    P_toy = toy_parameters(toy_spec())
    r = _time("seq=512,dp=2,cp=2,shard_mesh=fsdp_cp", "seq=512,cp=2,shard_mesh=fsdp_cp", "seq=512,cp=2,zero=3")
    all_reduce = P_toy / WITHIN + BASE + 2 * STEP
    assert r.detail["grad_sync_seconds"][0] == pytest.approx(all_reduce, rel=1e-12)
    assert r.detail["grad_sync_seconds"][1] == 0.0
    assert r.communication_seconds[1] == pytest.approx(r.communication_seconds[2], rel=1e-12)
    assert r.communication_seconds[0] - r.communication_seconds[1] == pytest.approx(all_reduce, rel=1e-12)


# ---------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------
def _refusal(cm, text):
    with pytest.raises(InvalidValue) as info:
        cm.evaluate(Strategy.parse(text))
    return str(info.value)


def test_zero_with_fsdp_cp_is_refused(llama8b):
    message = _refusal(llama8b, f"dp=2,cp=2,zero=1,shard_mesh=fsdp_cp,seq={S}")
    assert "zero=1 with shard_mesh=fsdp_cp" in message and "shard_mesh=dp_cp" in message


def test_reshard_after_forward_false_with_zero_3_is_refused(llama8b):
    message = _refusal(llama8b, f"dp=4,zero=3,reshard_after_forward=false,seq={S}")
    assert "reshard_after_forward=false" in message and "zero=3" in message and "fsdp=N" in message


def test_vocab_parallel_needs_tp_to_divide_the_vocabulary():
    from test_memory import cost_model, llama_counts, llama_spec
    cm = cost_model(llama_spec(), llama_counts(), 2048)  # vocabulary 32000: tp 2 divides it
    assert cm.evaluate(Strategy.parse("tp=2,vocab_parallel=true,seq=2048")).peak_bytes > 0
    import attrs
    odd = attrs.evolve(llama_spec(), vocab_size=32001)
    cm = cost_model(odd, llama_counts(), 2048)
    message = _refusal(cm, "tp=2,vocab_parallel=true,seq=2048")
    # Megatron-LM's padding: the next multiple of 128 * tp = 256 is 32256
    assert "tp=2 does not divide vocab_size=32001" in message and "32256" in message
    # at tp 1 there is nothing to split: the same figures as without it
    plain = cm.evaluate(Strategy.parse("seq=2048"))
    split = cm.evaluate(Strategy.parse("seq=2048,vocab_parallel=true"))
    assert split.peak_bytes == plain.peak_bytes and split.time.step_seconds == plain.time.step_seconds


# ---------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_search_tries_reshard_after_forward_false_under_fsdp_and_a_pipeline():
    """On 4 devices the only layouts with fsdp > 1 and pp > 1 are fsdp 2 x pp 2: there, and only there, each
    strategy is priced twice, resharding or keeping the layers gathered (more bytes: 16 layers a stage, no
    backward gathers: never slower), and with its reduce-scatters each micro-batch or once a step
    (gradient_sync=last_micro_batch: no backward reshards, so keeping them gathered holds as many bytes at the
    backward)."""
    import attrs

    import ndcost
    from ndcost.search import search
    model = ndcost.resolve("llama-3.1-8b", hardware="h200", census="off")
    r = search(model, devices=4, global_batch=4, seq=S, recompute_layer_fractions=(), exhaustive=True, top=100_000,
               memory_cap_bytes=10 ** 15)
    by_text = {str(c.strategy): c for c in r.candidates}
    kept = [c for c in r.candidates if not c.strategy.reshard_after_forward]
    assert kept and {(c.strategy.fsdp, c.strategy.pp) for c in kept} == {(2, 2)}
    resharding = [c for c in r.candidates if (c.strategy.fsdp, c.strategy.pp) == (2, 2)
                  and c.strategy.reshard_after_forward]
    assert len(resharding) == len(kept)
    deferred = [c for c in r.candidates if c.strategy.gradient_sync != "auto"]
    assert {(c.strategy.fsdp, c.strategy.pp, c.strategy.gradient_sync) for c in deferred} == \
        {(2, 2, "last_micro_batch")} and 2 * len(deferred) == len(kept) + len(resharding)
    for c in kept:
        twin = by_text[str(attrs.evolve(c.strategy, reshard_after_forward=True))]
        if c.strategy.gradient_sync == "auto":
            assert c.peak_bytes > twin.peak_bytes
        assert c.peak_bytes >= twin.peak_bytes and c.step_seconds <= twin.step_seconds
