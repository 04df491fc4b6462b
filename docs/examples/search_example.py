"""A searcher's loop over ndcost (docs/guides/searchers.md): resolve once, price a columnar table, read it.

Run: python docs/examples/search_example.py   (tests/test_search.py runs it)
"""
import numpy as np

import ndcost
from ndcost.search import search

# 1. Resolve once: the model's tables, records and work are built here and reused by every call below.
model = ndcost.resolve("llama-3.1-8b", runtime="hf-cuda", hardware="h200", census="off")

# 2. A columnar table of candidates: field -> array, one row a strategy (fields left out take Strategy's
#    defaults). Here: 8 devices as tp x fsdp, a global batch of 16 sequences, two recompute modes.
tp = np.array([1, 2, 4, 8, 3] * 2)
rows = len(tp)
table = {
    "tp": tp,
    "fsdp": np.maximum(8 // tp, 1),
    "seq": np.full(rows, 4096),
    "micro_batch": np.ones(rows, dtype=np.int64),
    "num_micro_batches": 16 // np.maximum(8 // tp, 1),
    "recompute": np.array(["none"] * 5 + ["full"] * 5),
}

# 3. One evaluate_many call prices every row; an invalid row never fails the batch.
batch = model.evaluate_many(table)
step = batch.time["step_seconds"]  # NaN where a row is invalid

# 4. Invalid rows say why (tp=3 divides neither the 32 heads nor the 8 KV heads).
for i in np.flatnonzero(~batch.valid):
    print(f"refused: tp={tp[i]}: {batch.reason[i]}")

# 5. batch.reserved_bytes (-1 where not claimed) is what the simulated caching allocator reserves, a lower
#    bound on max_memory_reserved; batch.fits judges it (the peak where not claimed, batch.fits_basis says
#    which) plus the hardware's CUDA context against its memory (docs/guides/searchers.md, section 6).
fits = batch.fits
best = np.flatnonzero(fits)[np.argmin(step[fits])]
print(f"best of the table: row {best}, tp={tp[best]}, recompute={table['recompute'][best]}: "
      f"{batch.peak_bytes[best] / 2**30:.1f} GiB, {step[best]:.3f} s a step")

# 6. evaluate in a loop: one strategy at a time, with its breakdown by stage and category.
for text in ("tp=2,fsdp=4,seq=4096,num_micro_batches=4", "tp=8,seq=4096,num_micro_batches=16,recompute=full"):
    cost = model.evaluate(ndcost.Strategy.parse(text))
    print(f"{text}: {cost.peak_bytes:,} bytes, parameters {cost.stages[0].bytes_by_category['parameters']:,}, "
          f"{cost.time.step_seconds:.3f} s")

# 7. Or let ndcost.search enumerate, prune and rank the whole space for the devices.
result = search(model, devices=8, global_batch=16, seq=4096, top=3)
for c in result.candidates:
    print(f"best: {c.strategy} {c.peak_bytes / 2**30:.1f} GiB {c.step_seconds:.3f} s "
          f"(reserved: {c.reserved_bytes}, None where not simulated)")
