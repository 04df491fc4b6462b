"""``Strategy.loss_engine``: the output layer's backward peak as each trainer's cross-entropy runs it.

Bytes a logit at the loss's backward peak, 16-bit logits (``ndcost.compose.memory._LOSS_PEAK_BYTES_PER_LOGIT``):

- torch's ``F.cross_entropy`` on fp32 logits (Transformers' ``ForCausalLMLoss``, torchtitan without loss
  parallelism): the kept fp32 log-softmax, the incoming and the outgoing fp32 gradients: 12;
- torch's ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py): ``_nll_loss_and_log_softmax_backward``
  holds the kept log-softmax, ``zeros_like`` of it, ``exp`` of it (then their sum) and the product: 16;
- Megatron-LM's ``vocab_parallel_cross_entropy`` (megatron/core/tensor_parallel/cross_entropy.py): its fp32 copy
  of the logits becomes the softmax in place and the gradient in place, cast to 16 bits beside it: 4 + 2 = 6;
- the loss under ``torch.compile`` (torchtitan's ``build_cross_entropy_loss``): Inductor's partitioner keeps the
  16-bit logits and a row's logsumexp, recomputing the fp32 cast and the softmax inside the backward's one
  kernel, which writes the 16-bit gradient: 2 kept, 2 + 2 = 4 at the peak.

The torch ones are measured here on torch itself (CPU, the profiler's allocation events, a one-rank gloo mesh for
DTensor, Inductor's CPU backend for the compiled loss); Megatron-LM is not installed, so its figure is the
derivation above from its source.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import ndcost
from ndcost.errors import NdcostError
from ndcost.trainers import to_config

# the bytes a logit at the backward's peak, derived from the sources named above (not read from ndcost)
TORCH_PLAIN, TORCH_LOSS_PARALLEL, MEGATRON, COMPILED = 12, 16, 6, 4
COMPILED_KEPT, TORCH_KEPT = 2, 4

_MEASURE = textwrap.dedent("""
    import json, torch, torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    N, V, H = 512, 4096, 8
    x = distribute_tensor(torch.randn(N, H, dtype=torch.bfloat16), mesh, [Replicate()])
    w = distribute_tensor(torch.randn(H, V, dtype=torch.bfloat16), mesh, [Shard(1)]).requires_grad_()
    labels = distribute_tensor(torch.randint(0, V, (N,)), mesh, [Replicate()])

    def most_live(prof):
        events = []

        def walk(node):
            if node.tag == torch._C._profiler._EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
            for child in node.children:
                walk(child)

        for root in prof.profiler.kineto_results.experimental_event_tree():
            walk(root)
        live = most = 0
        for _, delta in sorted(events):
            live += delta
            most = max(most, live)
        return most

    def peak(parallel):
        w.grad = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            pred = x @ w  # the head's 16-bit logits, split by vocabulary
            if parallel:
                with loss_parallel():
                    loss = F.cross_entropy(pred.float(), labels)
                    del pred  # as torchtitan's train step drops them before the backward
                    loss.backward()
            else:
                local = pred.to_local()
                loss = F.cross_entropy(local.float(), labels.to_local())
                del pred, local
                loss.backward()
        return most_live(prof)

    def peak_compiled():
        # torchtitan's cross_entropy_loss under torch.compile (components/loss.py), compiled before the profile
        loss_fn = torch.compile(lambda pred, labels: F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)))
        local_x, local_labels = x.to_local()[None], labels.to_local()[None]
        local_w = w.to_local().detach().requires_grad_()
        loss_fn(local_x @ local_w, local_labels).backward()
        local_w.grad = None
        kept = []
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            pred = local_x @ local_w
            with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.nbytes) or t, lambda t: t):
                loss = loss_fn(pred, local_labels)
            del pred
            loss.backward()
        return most_live(prof), sum(kept)

    compiled, compiled_kept = peak_compiled()
    print(json.dumps({"plain": peak(False), "loss_parallel": peak(True), "compiled": compiled,
                      "compiled_kept": compiled_kept, "logits": N * V, "head": H * V * 2}))
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def measured():
    out = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torch_losses_peak_as_derived(measured):
    """The step's peak is the derived bytes a logit, give or take what is not the loss's logits."""
    logits, head = measured["logits"], measured["head"]
    for name, per_logit in (("plain", TORCH_PLAIN), ("loss_parallel", TORCH_LOSS_PARALLEL), ("compiled", COMPILED)):
        # beside the logits' tensors: a token's scalars (labels, the max, the sum: under 64 bytes a token) and
        # at most the head's 16-bit weight gradient
        assert per_logit * logits <= measured[name] <= per_logit * logits + 64 * 512 + head, (
            name, measured[name] / logits)


def test_the_compiled_loss_keeps_its_16_bit_logits(measured):
    """What the compiled loss saves for its backward: the 16-bit logits, beside a token's scalars (the labels, the
    max and the logsumexp: under 64 bytes a token)."""
    logits = measured["logits"]
    assert COMPILED_KEPT * logits <= measured["compiled_kept"] <= COMPILED_KEPT * logits + 64 * 512


@pytest.fixture(scope="module")
def llama8b():
    return ndcost.resolve("llama-3.1-8b", census="off")


def _output_bytes(model, text):
    cost = model.evaluate(text)
    stage = cost.stages[0]
    assert stage.provenance["moment"] == "output backward", stage.provenance
    return stage.bytes_by_category["output"]


H, V = 4096, 128256
# Llama's output layer beside the loss, bytes a token: the final LlamaRMSNorm's saves (its fp32 input and
# normalised output, 6 bytes an element, and the fp32 rsqrt, 4 a token) and the head's bf16 input
NORM_AND_HEAD = 6 * H + 4 + 2 * H
TOKENS = 4 * 8192
BASE = "micro_batch=4,seq=8192,recompute=full"


@pytest.mark.parametrize("engine, tp, vocab_parallel, per_logit", [
    ("auto", 8, True, TORCH_LOSS_PARALLEL),
    ("torch", 8, True, TORCH_LOSS_PARALLEL),
    ("megatron", 8, True, MEGATRON),
    ("torch", 1, False, TORCH_PLAIN),
    ("megatron", 1, False, MEGATRON),
    ("torch", 2, False, TORCH_PLAIN),  # the head and loss replicated on each tp rank
    ("compiled", 1, False, COMPILED),
    ("compiled", 8, True, COMPILED),
])
def test_output_peak_is_the_trainers_loss(llama8b, engine, tp, vocab_parallel, per_logit):
    sp = tp > 1
    text = f"{BASE},tp={tp},sp={str(sp).lower()},vocab_parallel={str(vocab_parallel).lower()},loss_engine={engine}"
    split = tp if vocab_parallel else 1
    if sp and vocab_parallel:  # the norm's and the head's input split over the sequence; the loss by vocabulary
        per_token = NORM_AND_HEAD / tp + per_logit * V / split
    else:
        per_token = NORM_AND_HEAD + per_logit * V / split  # without vocab_parallel the head takes every token
    assert _output_bytes(llama8b, text) == TOKENS * per_token


def test_megatron_reader_sets_it_and_writers_check_it(tmp_path):
    script = tmp_path / "pretrain.sh"
    script.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --sequence-parallel "
                      "--micro-batch-size 1 --global-batch-size 8 --seq-length 4096 --bf16 "
                      "--use-distributed-optimizer\n")
    read = ndcost.from_config("megatron", str(script), devices=8, model="llama-3.1-8b")
    assert read.strategy.loss_engine == "megatron"
    assert any("loss_engine=megatron" in d for d in read.defaults)
    megatron = "dp=4,param_dtype=bf16,grad_dtype=fp32,master_dtype=fp32,optimizer_dtype=fp32"
    for kind, base, engine in (("megatron", megatron, "torch"), ("megatron", megatron, "auto"),
                               ("torchtitan", "fsdp=4", "megatron")):
        strategy = ndcost.Strategy.parse(f"{base},tp=2,sp=true,vocab_parallel=true,seq=4096,loss_engine={engine}")
        with pytest.raises(NdcostError, match="loss_engine"):
            to_config(kind, strategy, model="llama-3.1-8b")
    assert "--tensor-model-parallel-size 2" in to_config(
        "megatron", f"{megatron},tp=2,sp=true,vocab_parallel=true,seq=4096,loss_engine=megatron", model="llama-3.1-8b")


def test_a_compiled_loss_keeps_half_as_much_for_the_micro_batches_waiting(llama8b):
    """Under GPipe the head's stage holds every micro-batch's output layer until its backward: the three waiting
    keep their loss's bytes (4 a logit eager, 2 compiled) and the fourth peaks (12 eager, 4 compiled)."""
    base = "pp=2,schedule=gpipe,num_micro_batches=4,micro_batch=4,seq=8192,recompute=full"

    def head_stage_output(engine):
        stage = llama8b.evaluate(f"{base},loss_engine={engine}").stages[-1]
        assert stage.provenance["moment"] == "output backward", stage.provenance
        return stage.bytes_by_category["output"]
    assert head_stage_output("torch") - head_stage_output("compiled") == TOKENS * V * (
        3 * (TORCH_KEPT - COMPILED_KEPT) + (TORCH_PLAIN - COMPILED))


def test_torchtitan_reads_and_writes_its_compiled_loss():
    """[compile] components with "loss": loss_engine=compiled; written back as such."""
    strategy = ndcost.Strategy.parse("fsdp=8,seq=8192,compile=true,loss_engine=compiled")
    text = to_config("torchtitan", strategy, model="llama-3.1-8b")
    assert 'components = ["model", "loss"]' in text
    assert 'components = ["model"]' in to_config("torchtitan", "fsdp=8,seq=8192,compile=true", model="llama-3.1-8b")


def test_the_compiled_losss_kernels_move_two_reads_and_a_write(llama8b):
    """The loss's time is its bytes at HBM: eager, the 16-bit logits cast to fp32 and log-softmax's reads and writes
    (w + 16 bytes a logit a pass, with the census off); compiled, two reads of the 16-bit logits forward (the max,
    then the exponentials' sum) and a read and the gradient's write backward (2 w a logit a pass)."""
    from ndcost.compose import time as time_model
    hardware = llama8b.hardware
    eff = time_model.efficiencies(hardware)[0]
    work = llama8b.model_work(8192)
    ends = {}
    for engine in ("torch", "compiled"):
        cols = time_model.strategy_columns([ndcost.Strategy.parse(f"{BASE},loss_engine={engine}")])
        ends[engine] = time_model._embedding_and_head(work, time_model._rows(cols, hardware), cols, hardware, eff)
    width, hbm = 2.0, float(hardware.hbm_bytes_per_second)
    saved_bytes = TOKENS * V * ((width + 16.0) - 2.0 * width)
    for key, memory in (("head_fwd", eff["memory"]), ("head_bwd", eff["memory_backward"])):
        assert ends["torch"][key][0] - ends["compiled"][key][0] == pytest.approx(saved_bytes / (hbm * memory))
