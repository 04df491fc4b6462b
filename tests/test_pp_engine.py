"""``Strategy.pp_engine``: torch.distributed.pipelining's receive buffers beside the real engine and hand derivations.

``torch/distributed/pipelining/stage.py`` gives every local stage but the first a receive buffer per input for each
micro-batch of the step (``_setup_forward_recv_info``) and every one but the last a buffer per output gradient
(``_create_grad_recv_info``), made once and kept across steps. A buffer is ``[micro_batch, seq / cp, hidden]`` (the
sequence split by tp under sp) in the residual stream's dtype; it is the micro-batch's input itself, so where the
stage's first layer keeps its input the activations count it already for the micro-batches in flight, and the
last layer's backward working figure holds the arriving gradient: ``ndcost.compose.memory._pipeline_buffers``.

The slow tests build real ``PipelineStage``s (CPU, gloo, two processes, four under FSDP) and sum the bytes of the
buffers they made; the others check the composition on Llama-3.1-8B's shapes (``test_mesh``'s hand count and
hand-made records, whose layer keeps its input: ``working_input_per_token`` unset).
"""
from __future__ import annotations

import json
import os

import pytest
from test_memory import records
from test_mesh import EMB, LAYER, H, S, llama8b_model

from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.models import ParameterCount
from ndcost.resolver import CostModel
from ndcost.values import LayerGroup, ModelSpec, Strategy

B = S * H * 2  # one micro-batch's stage boundary at micro_batch 1: 4096 tokens x 4096 wide in bf16


_llama8b = llama8b_model


@pytest.fixture(scope="module")
def llama8b():
    return _llama8b()


def _stages(cm, text):
    return cm.evaluate(Strategy.parse(text)).stages


def _communication(cm, text):
    """Each stage's (moment it peaks at, communication bytes there)."""
    return [(s.provenance["moment"], s.bytes_by_category["communication"]) for s in _stages(cm, text)]


# moments (compose/memory.py MOMENTS), short
LOSS, LAST, END, EMBEDDING, STEP = ("output backward", "last layer backward", "end of backward",
                                    "embedding backward", "optimizer step")


@pytest.mark.parametrize("text", ["pp=4,num_micro_batches=8", "pp=2,vpp=2,schedule=interleaved,num_micro_batches=4",
                                  "pp=2,schedule=gpipe,num_micro_batches=4,recompute=full",
                                  "pp=2,fsdp=2,num_micro_batches=4,gradient_sync=last_micro_batch", "tp=2,sp=true"])
def test_auto_is_megatron_and_todays_figures(llama8b, text):
    """auto and megatron price alike, as the strategy without the field (a receive tensor a transfer that becomes
    the micro-batch's input: Megatron-LM's p2p_communication.py, nothing beyond the activations)."""
    plain = llama8b.evaluate(Strategy.parse(f"{text},seq={S}"))
    for engine in ("auto", "megatron"):
        cost = llama8b.evaluate(Strategy.parse(f"{text},seq={S},pp_engine={engine}"))
        assert [s.bytes_by_category for s in cost.stages] == [s.bytes_by_category for s in plain.stages]
        assert cost.peak_bytes == plain.peak_bytes


def test_no_pipeline_no_buffers(llama8b):
    assert _communication(llama8b, f"fsdp=2,seq={S},pp_engine=torch") == \
        _communication(llama8b, f"fsdp=2,seq={S}")


def test_1f1b_four_stages(llama8b):
    """1F1B, pp 4, 8 micro-batches of one: stage s holds min(4 - s, 8) in flight, each peaking at its last layer's
    backward (the head's at the loss). Stage 0 receives no input (the embedding's), so it holds 8 gradient
    buffers, less the one its last layer's backward holds as the arriving gradient: 7 B. Stages 1 and 2 hold 8 of
    each, 16 B, less their 3 and 2 micro-batches in flight (their first layer keeps the received input) and the
    arriving gradient: 12 B and 13 B. Stage 3, the last, sends no output: 8 input buffers, less its 1 in flight.
    Beside the buffers each stage's ``fwd_cache`` holds the outputs of its micro-batches in flight to their
    backward (activations): a boundary each on stages 0 to 2 (4, 3 and 2 B), and on the last stage its micro-batch's
    16-bit logits (tests/test_pp_return_outputs.py): 4,096 tokens x the 128,256-word vocabulary x 2 bytes."""
    got = _communication(llama8b, f"pp=4,num_micro_batches=8,seq={S},pp_engine=torch")
    assert got == [(LAST, 7 * B), (LAST, 12 * B), (LAST, 13 * B), (LOSS, 7 * B)]
    # the buffers and the held outputs add to the peak exactly that (nothing else moves)
    auto = _stages(llama8b, f"pp=4,num_micro_batches=8,seq={S}")
    torch = _stages(llama8b, f"pp=4,num_micro_batches=8,seq={S},pp_engine=torch")
    logits = S * 128256 * 2
    assert [t.peak_bytes - a.peak_bytes for t, a in zip(torch, auto, strict=True)] == [(7 + 4) * B, (12 + 3) * B,
                                                                                        (13 + 2) * B, 7 * B + logits]


def test_interleaved_chunks_are_stages_of_their_own(llama8b):
    """Interleaved 1F1B, pp 2, vpp 2, 4 micro-batches: rank 0 holds virtual stages 0 and 2, rank 1 stages 1 and 3.
    Rank 0: stage 0 its 4 gradient buffers, stage 2 4 input and 4 gradient ones, 12 B; rank 1: stage 1's 8 and the
    last stage's 4 input ones, 12 B. In flight (schedules.py's count: rank 0 [3, 2], rank 1 [2, 1] by chunk): of
    rank 0 only stage 2 receives its input, 2 micro-batches, and its last layer's backward holds an arriving
    gradient: 12 - 2 - 1 = 9 B; rank 1 both chunks receive, 2 + 1, and its last layer's backward is the head's
    chunk's (the loss's gradient, no buffer): 12 - 3 = 9 B. At the end of the backward the micro-batch whose
    backward runs is out of the activations: 11 B on each."""
    expected = [{LAST: 9 * B, END: 11 * B, EMBEDDING: 11 * B, STEP: 12 * B},
                {LOSS: 9 * B, LAST: 9 * B, END: 11 * B, STEP: 12 * B}]
    got = _communication(llama8b, f"pp=2,vpp=2,schedule=interleaved,num_micro_batches=4,seq={S},pp_engine=torch")
    for (moment, communication), by_moment in zip(got, expected, strict=True):
        assert communication == by_moment[moment], moment


def test_a_layer_keeping_no_input_aliases_nothing_but_a_checkpoint_does():
    """A layer whose ops save none of its input (``working_input_per_token`` > 0): the buffers are all extra, 4 a
    stage of pp 2 over 4 micro-batches, less the arriving gradient on stage 0 at its last layer's backward. Under
    full recompute the checkpoint keeps the layer's input, the received buffer: 1F1B's 2 and 1 in flight off."""
    cm = _llama8b(working_input_per_token=float(H * 2))
    plain = _communication(cm, f"pp=2,num_micro_batches=4,seq={S},pp_engine=torch")
    assert plain == [(LAST, 3 * B), (LOSS, 4 * B)]
    full = _communication(cm, f"pp=2,num_micro_batches=4,seq={S},pp_engine=torch,recompute=full")
    # stage 0 receives nothing: only the arriving gradient comes off, at its last layer's backward alone
    by_moment = [{LAST: 3 * B, END: 4 * B, EMBEDDING: 4 * B, STEP: 4 * B}, {LOSS: 3 * B, LAST: 3 * B, END: 4 * B}]
    assert [c for _, c in full] == [expected[m] for (m, _), expected in zip(full, by_moment, strict=True)]
    assert full[1][0] in (LOSS, LAST)  # the head's stage peaks with its micro-batch in flight


def test_offloaded_activations_leave_the_buffers_whole(llama8b):
    """save_on_cpu copies the saved input to the host; the buffer stays on the device: no input aliases. pp 2, 4
    micro-batches: stage 0's 4 gradient buffers (less the arriving one at its last layer's backward, which the
    working figure on the device holds), stage 1's 4 input buffers whole."""
    text = f"pp=2,num_micro_batches=4,seq={S},offload_activations=true"
    torch, auto = _communication(llama8b, text + ",pp_engine=torch"), _communication(llama8b, text)
    assert [m for m, _ in torch] == [m for m, _ in auto]
    expected = [{LAST: 3 * B, END: 4 * B, EMBEDDING: 4 * B, STEP: 4 * B}, {LOSS: 4 * B, LAST: 4 * B, END: 4 * B}]
    assert [t - a for (_, t), (_, a) in zip(torch, auto, strict=True)] == \
        [by_moment[m] for (m, _), by_moment in zip(torch, expected, strict=True)]


@pytest.mark.parametrize("sp, boundary", [(True, B // 2), (False, B)])
def test_sequence_parallel_splits_the_boundary(llama8b, sp, boundary):
    """torchtitan's TP plan hands each block a plain tensor sharded on the sequence (``use_local_output``): under
    sp a buffer is 1/tp of the boundary; without sp the replicated boundary. pp 2, 4 micro-batches: stage 1 (the
    head's) holds 4, less its 1 in flight, beside what TP's own buffers hold (the row without the field)."""
    text = f"pp=2,tp=2,sp={str(sp).lower()},num_micro_batches=4,seq={S}"
    _, (moment, torch1) = _communication(llama8b, text + ",pp_engine=torch")
    _, (auto_moment, auto1) = _communication(llama8b, text)
    assert moment == auto_moment == LOSS and torch1 - auto1 == 3 * boundary


def test_fsdp_under_last_micro_batch_adds_the_buffers_to_its_gathers(llama8b):
    """torchtitan's PP with FSDP (test_gradient_sync's PP_FSDP): the stage's layers gathered in bf16 and no gradient
    in a reduce-scatter buffer under gradient_sync=last_micro_batch; the receive buffers come beside them, in the
    bf16 residual stream (FSDP2's param_dtype: no autocast). Stage 0 at its last layer's backward: 4 gradient
    buffers less the arriving one; stage 1 at the loss: 4 input buffers less its 1 in flight."""
    text = (f"pp=2,fsdp=2,num_micro_batches=4,seq={S},param_dtype=fp32,compute_dtype=bf16,"
            "reshard_after_forward=false,gradient_sync=last_micro_batch")
    torch, auto = _communication(llama8b, text + ",pp_engine=torch"), _communication(llama8b, text)
    assert [m for m, _ in torch] == [m for m, _ in auto] == [LAST, LOSS]
    assert auto[0][1] == EMB * 2 + 16 * LAYER * 2  # test_gradient_sync's figure, unchanged beside the buffers
    assert [t - a for (_, t), (_, a) in zip(torch, auto, strict=True)] == [3 * B, 3 * B]


def test_an_unknown_engine_is_refused_by_name():
    with pytest.raises(InvalidValue, match="pp_engine.*deepspeed.*auto, megatron, torch"):
        Strategy.parse("pp=2,pp_engine=deepspeed")


# --------------------------------------------------------------------------- the real engine
MICRO_BATCH, SEQ, WIDTH, MICRO_BATCHES = 2, 8, 16, 4
BOUNDARY = MICRO_BATCH * SEQ * WIDTH * 4  # fp32


def _buffers(stage):
    """{data_ptr: bytes} of the receive buffers a PipelineStage holds (inputs and output gradients)."""
    out = {}
    for infos in list(stage.args_recv_info.values()) + list(stage.grad_recv_info.values()):
        for info in infos:
            if not info.is_root_arg and info.buffer is not None:
                out[info.buffer.untyped_storage().data_ptr()] = info.buffer.numel() * info.buffer.element_size()
    return out


def _pipeline_worker(rank, folder, chunks):
    """One pipeline rank: a Linear a local stage, two steps of 1F1B (or interleaved 1F1B over *chunks*)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 2), rank=rank, world_size=2)
    torch.manual_seed(0)
    inputs = [[] for _ in range(chunks)]  # the storage each local stage's forward reads, by stage
    stages = []
    for c in range(chunks):
        layer = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH))
        layer.register_forward_pre_hook(lambda _, args, c=c: inputs[c].append(args[0].untyped_storage().data_ptr()))
        stages.append(PipelineStage(layer, rank + 2 * c, 2 * chunks, torch.device("cpu")))

    def loss(out, target):
        return (out - target).pow(2).mean()

    schedule = (Schedule1F1B(stages[0], n_microbatches=MICRO_BATCHES, loss_fn=loss) if chunks == 1 else
                ScheduleInterleaved1F1B(stages, n_microbatches=MICRO_BATCHES, loss_fn=loss))
    sent_held = []  # at each backward's start: the bytes of the outputs the rank's non-last stages' fwd_cache holds

    def held_outputs():
        return sum(t.numel() * t.element_size() for stage in stages if not stage.is_last
                   for output, _ in stage.fwd_cache.values() for t in output if isinstance(t, torch.Tensor))

    for stage in stages:
        backward = stage.backward_one_chunk

        def recording(*args, backward=backward, **kwargs):
            sent_held.append(held_outputs())
            return backward(*args, **kwargs)
        stage.backward_one_chunk = recording
    shape = (MICRO_BATCH * MICRO_BATCHES, SEQ, WIDTH)
    x, target = torch.randn(shape), torch.randn(shape)
    steps = []
    for _ in range(2):
        for seen in inputs:
            seen.clear()
        schedule.step(*((x,) if rank == 0 else ()), **(dict(target=target, losses=[]) if rank == 1 else {}))
        held = {}
        for stage in stages:
            held.update(_buffers(stage))
        steps.append({"buffers": held, "sent_first": sent_held[0],  # at the first backward, ndcost's peak
                      "stages": [{"first": stage.is_first, "last": stage.is_last, "inputs": seen[:]}
                                 for stage, seen in zip(stages, inputs, strict=True)]})
        sent_held.clear()
    with open(os.path.join(folder, f"{rank}.json"), "w") as f:
        json.dump(steps, f)
    dist.destroy_process_group()


def _toy(layers):
    """ndcost's figure for the same shapes: a stack of *layers* of width WIDTH (records whose layer keeps its input,
    as nn.Linear saves it for its weight's gradient)."""
    spec = ModelSpec(name="toy", model_type="llama", family="llama", hidden_size=WIDTH, vocab_size=64,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=2,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, num_key_value_heads=2, head_dim=8,
                     intermediate_size=32)
    layer = WIDTH * WIDTH + WIDTH
    counts = ParameterCount(by_kind={"dense": {"ffn": layer}}, layer_counts={"dense": layers}, embedding=0, head=0,
                            final_norm=0, mtp=0, buffers=0, total=layers * layer, by_part={"ffn": layers * layer})
    return CostModel.from_records(spec, counts, {SEQ: records(SEQ)})


@pytest.mark.slow
@pytest.mark.parametrize("chunks, text, alias, sent", [
    # 1F1B over 2 ranks, 4 micro-batches: rank 0 in flight 2, rank 1 (the head's) 1; rank 0 receives no input;
    # rank 0's fwd_cache holds its 2 outputs in flight, the head's rank sends none on
    (1, "pp=2", [{LAST: BOUNDARY, END: 0, EMBEDDING: 0, STEP: 0},
                 {LOSS: BOUNDARY, LAST: BOUNDARY, END: 0, STEP: 0}], [2 * BOUNDARY, 0]),
    # interleaved, 2 chunks a rank: in flight rank 0 [3, 2], rank 1 [2, 1] by chunk (test_interleaved_... above);
    # rank 0's two chunks send 3 + 2 outputs on, rank 1's first chunk 2 (its second holds the head)
    (2, "pp=2,vpp=2,schedule=interleaved", [{LAST: 3 * BOUNDARY, END: BOUNDARY, EMBEDDING: BOUNDARY, STEP: 0},
                                           {LOSS: 3 * BOUNDARY, LAST: 3 * BOUNDARY, END: BOUNDARY, STEP: 0}],
     [5 * BOUNDARY, 2 * BOUNDARY]),
])
def test_pipeline_stages_buffers_beside_ndcost(tmp_path, chunks, text, alias, sent):
    """Real PipelineStages on gloo: each local stage but the first holds a buffer per micro-batch for its input,
    each but the last one for its output's gradient, the same storages over two steps; the input a non-first
    stage's forward runs on is one of them (no copy). ndcost's communication at each rank's peak is those bytes less
    what its activations and working figure count of them at that moment (*alias*, derived in the docstrings
    above). At each rank's first backward (where ndcost counts its micro-batches in flight) the non-last stages'
    fwd_cache holds the outputs of those in flight (*sent*, counted above): what ndcost's activations add to
    Megatron-LM's engine's where both peak at the same moment."""
    torch = pytest.importorskip("torch")
    torch.multiprocessing.spawn(_pipeline_worker, args=(str(tmp_path), chunks), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    text = f"{text},micro_batch={MICRO_BATCH},seq={SEQ},num_micro_batches={MICRO_BATCHES},param_dtype=fp32"
    cost = _toy(2 * chunks).evaluate(Strategy.parse(f"{text},pp_engine=torch"))
    megatron = _toy(2 * chunks).evaluate(Strategy.parse(f"{text},pp_engine=megatron"))
    compared = 0
    for steps, stage, other, held_out in zip(ranks, cost.stages, megatron.stages, sent, strict=True):
        assert [step["sent_first"] for step in steps] == [held_out, held_out]
        if stage.provenance["moment"] == other.provenance["moment"]:
            compared += 1
            added = stage.bytes_by_category["activations"] - other.bytes_by_category["activations"]
            assert added == held_out, stage.provenance
    assert compared
    for steps, stage, aliased in zip(ranks, cost.stages, alias, strict=True):
        first, second = steps
        assert first["buffers"] == second["buffers"]  # made once, kept across steps
        held = MICRO_BATCHES * BOUNDARY * sum((not s["first"]) + (not s["last"]) for s in second["stages"])
        assert sum(second["buffers"].values()) == held
        buffers = {int(p) for p in second["buffers"]}
        for local in second["stages"]:
            assert len(local["inputs"]) == MICRO_BATCHES
            # a non-first stage's forward runs on its receive buffer itself; the first on the micro-batch's split
            assert all((p in buffers) != local["first"] for p in local["inputs"])
        assert stage.bytes_by_category["communication"] == held - aliased[stage.provenance["moment"]]


def _fsdp_worker(rank, folder):
    """One of 4 ranks: pp 2 x FSDP 2, fp32 parameters gathered in bf16 (FSDP2's MixedPrecisionPolicy, as torchtitan's
    apply_fsdp sets it), a Linear a stage, two steps of 1F1B; the receive buffers' bytes and dtypes."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 4), rank=rank, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pp_rank = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH))
    fully_shard(layer, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                         reduce_dtype=torch.float32))
    stage = PipelineStage(layer, pp_rank, 2, torch.device("cpu"), group=mesh["pp"].get_group())

    def loss(out, target):
        return (out.float() - target).pow(2).mean()

    schedule = Schedule1F1B(stage, n_microbatches=MICRO_BATCHES, loss_fn=loss)
    shape = (MICRO_BATCH * MICRO_BATCHES, SEQ, WIDTH)
    x, target = torch.randn(shape), torch.randn(shape)
    steps = []
    for _ in range(2):
        schedule.step(*((x,) if pp_rank == 0 else ()), **(dict(target=target, losses=[]) if pp_rank == 1 else {}))
        infos = [i for infos in list(stage.args_recv_info.values()) + list(stage.grad_recv_info.values())
                 for i in infos if not i.is_root_arg and i.buffer is not None]
        steps.append({"pp_rank": pp_rank, "bytes": sum(i.buffer.numel() * i.buffer.element_size() for i in infos),
                      "dtypes": sorted({str(i.buffer.dtype) for i in infos})})
    with open(os.path.join(folder, f"{rank}.json"), "w") as f:
        json.dump(steps, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_mixed_precision_buffers_are_the_compute_dtype(tmp_path):
    """Under FSDP2's mixed precision the stage computes with bf16 parameters, so its output, and the buffers made
    from its metadata (the output gradient's too), are bf16 though the parameters are fp32: ndcost's residual
    stream without autocast (param_dtype=fp32, compute_dtype=bf16 under FSDP). Each stage holds 4 buffers of a
    bf16 boundary; beside the same strategy under pp_engine=auto, ndcost's communication at each stage's peak
    differs by those less the one its moment counts already (1F1B pp 2: stage 0's arriving gradient at its last
    layer's backward, stage 1's micro-batch in flight at the loss). FSDP's own buffers are the same at every
    backward moment here, the stage's layers and root gathered (reshard_after_forward=false, no gradient waiting
    under gradient_sync=last_micro_batch: test_gradient_sync), so the two peaks compare where their moments
    differ (the buffers move the toy's first stage from its last layer's backward to the end of the backward)."""
    torch = pytest.importorskip("torch")
    torch.multiprocessing.spawn(_fsdp_worker, args=(str(tmp_path),), nprocs=4, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    boundary = BOUNDARY // 2  # bf16
    for first, second in ranks:
        assert first == second and second["dtypes"] == ["torch.bfloat16"]
        assert second["bytes"] == MICRO_BATCHES * boundary
    text = (f"pp=2,fsdp=2,micro_batch={MICRO_BATCH},seq={SEQ},num_micro_batches={MICRO_BATCHES},param_dtype=fp32,"
            "compute_dtype=bf16,reshard_after_forward=false,gradient_sync=last_micro_batch")
    torch_cost, auto = (_toy(2).evaluate(Strategy.parse(text + extra)) for extra in (",pp_engine=torch", ""))
    for pp_rank, (t, a) in enumerate(zip(torch_cost.stages, auto.stages, strict=True)):
        assert {t.provenance["moment"], a.provenance["moment"]} <= {LOSS, LAST, END}
        measured = next(r[1]["bytes"] for r in ranks if r[1]["pp_rank"] == pp_rank)
        aliased = {LAST: boundary, LOSS: boundary}.get(t.provenance["moment"], 0)
        assert t.bytes_by_category["communication"] - a.bytes_by_category["communication"] == measured - aliased
