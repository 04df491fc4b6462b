"""DeepSpeed ZeRO's contiguous gradient bucket (``reduce_bucket_elements``, ``reduce_buckets``).

DeepSpeed itself, run on the CPU, says when its ZeRO optimizers hold the bucket (tests/_deepspeed_bucket_probe.py);
ndcost's peaks are set beside that rule on strategies whose peak moment is known, the bytes derived by hand
(elements * buffers * 2 bytes of bf16). The DeepSpeed reader's and writer's side is tests/test_trainer_deepspeed.py.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import ndcost  # noqa: F401  (the installed package first)

import ndcost as nd
from ndcost.errors import InvalidStrategy

PROBE = Path(__file__).with_name("_deepspeed_bucket_probe.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deepspeed_seen():
    pytest.importorskip("deepspeed")
    run = subprocess.run([sys.executable, str(PROBE), str(_free_port())], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_deepspeed_holds_its_bucket_as_the_rule_says(deepspeed_seen):
    # 1000 elements of bf16 a buffer, two under overlap_comm at ZeRO 1-2 (stage_1_and_2.py setup_buckets), one at
    # ZeRO-3 whatever overlap_comm says (stage3.py, made at its start)
    one = 2 * 1000
    for overlap in (0, 1):
        b = one * (1 + overlap)
        # ZeRO-1: from the step's first gradient to the boundary's reduction (the second backward's end)
        assert deepspeed_seen[f"1,{overlap}"] == {"loss": [0, b], "backward": [b, b], "after_backward": [b, 0],
                                                  "after_step": 0}
        # ZeRO-2: from each backward's first gradient to its end
        assert deepspeed_seen[f"2,{overlap}"] == {"loss": [0, 0], "backward": [b, b], "after_backward": [0, 0],
                                                  "after_step": 0}
        # ZeRO-3: always, one buffer
        assert deepspeed_seen[f"3,{overlap}"] == {"loss": [one, one], "backward": [one, one],
                                                  "after_backward": [one, one], "after_step": one}


@pytest.fixture(scope="module")
def model():
    return nd.resolve("llama-3.1-8b", census="off")


# bf16 parameters with an fp32 master copy and states; two sequences of 4,096 a micro-batch put the peak at the
# loss's backward (the 128,256-entry vocabulary's logits)
BASE = "dp=8,seq=4096,micro_batch=2,param_dtype=bf16,master_dtype=fp32,optimizer_dtype=fp32,ddp_engine=deepspeed"


def cost(model, base=BASE, **fields):
    extra = ",".join(f"{k}={v}" for k, v in fields.items())
    return model.evaluate(f"{base},{extra}")


def communication(c) -> int:
    return c.stages[0].bytes_by_category["communication"]


def moment(c) -> str:
    return c.stages[0].provenance["moment"]


@pytest.mark.parametrize("zero, micro_batches, buffers, at_loss", [
    (1, 1, 1, False),  # ZeRO-1's first micro-batch: no gradient yet at the loss
    (1, 2, 1, True),   # its later micro-batches' losses hold it (made by the first backward)
    (1, 2, 2, True),
    (2, 2, 1, False),  # ZeRO-2 frees it at every backward's end
    (2, 2, 2, False),
    (3, 1, 1, True),   # ZeRO-3: for the run
    (3, 2, 1, True),
])
def test_the_loss_moment_holds_the_bucket_where_deepspeed_does(model, zero, micro_batches, buffers, at_loss):
    elements = 1000
    plain = cost(model, zero=zero, num_micro_batches=micro_batches)
    held = cost(model, zero=zero, num_micro_batches=micro_batches, reduce_bucket_elements=elements,
                reduce_buckets=buffers)
    assert moment(plain) == moment(held) == "output backward"
    bucket = elements * buffers * 2
    assert held.peak_bytes - plain.peak_bytes == (bucket if at_loss else 0)
    assert communication(held) - communication(plain) == (bucket if at_loss else 0)


@pytest.mark.parametrize("zero, buffers", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)])
def test_a_bucket_larger_than_the_rest_peaks_in_the_backward(zero, buffers):
    # Mistral-7B's 32,000-entry vocabulary: one sequence's loss holds little more than the backward
    model = nd.resolve("mistral-7b-v0.1", census="off")
    base = BASE.replace("micro_batch=2", "micro_batch=1")
    elements = 2_000_000_000  # 4 GB a buffer, 8 GB two: the backward's moments now peak
    plain = cost(model, base, zero=zero)
    held = cost(model, base, zero=zero, reduce_bucket_elements=elements, reduce_buckets=buffers)
    bucket = elements * buffers * 2
    if zero == 3:  # held at every moment: the same moment, exactly the bucket more
        assert moment(held) == moment(plain) and held.peak_bytes - plain.peak_bytes == bucket
    else:
        assert moment(held) in ("last layer backward", "end of backward", "embedding backward")
        assert communication(held) == bucket  # the only buffer of data-parallel ZeRO-1/2 without SP
        assert plain.peak_bytes < held.peak_bytes < plain.peak_bytes + bucket  # a moment below the loss's


@pytest.mark.parametrize("fields, words", [
    (dict(reduce_bucket_elements=1000), "with zero=0: the bucket is DeepSpeed ZeRO's"),
    (dict(zero=1, pp=2, reduce_bucket_elements=1000), "with pp=2: DeepSpeed's pipeline engine"),
    (dict(zero=1, reduce_bucket_elements=1000, ddp_engine="megatron"), "ddp_engine=megatron: the bucket is "
                                                                        "DeepSpeed's"),
    (dict(zero=2, reduce_buckets=2), "reduce_buckets=2 with reduce_bucket_elements=0"),
    (dict(zero=3, reduce_bucket_elements=1000, reduce_buckets=2), "ZeRO-3 allocates one bucket"),
])
def test_a_bucket_deepspeed_would_not_make_is_refused(model, fields, words):
    fields = {"dp": 8, "seq": 4096, **fields}
    with pytest.raises(InvalidStrategy, match=words):
        model.evaluate(nd.Strategy(**fields))
