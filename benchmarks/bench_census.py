"""Speed of the census (the README's speed table): run on demand, not as a timed test.

    python benchmarks/bench_census.py

Targets on a 2-core machine, imports excluded: the full census of one
Llama-3-8B-shaped kind at 4096 tokens within 10 s; every kind of DeepSeek-V3
within 60 s; a cached resolve (``ndcost.resolve`` and one strategy priced
from cached census records) within 0.2 s, beside the cached lookup alone.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time


def _timed(label, function, target):
    began = time.perf_counter()
    result = function()
    took = time.perf_counter() - began
    print(f"{label}: {took:.2f} s (target {target} s){'' if took <= target else '  OVER TARGET'}", flush=True)
    return result


def main() -> int:
    os.environ["NDCOST_CACHE_DIR"] = tempfile.mkdtemp(prefix="ndcost-bench-")
    began = time.perf_counter()
    import torch  # noqa: F401
    import transformers

    from ndcost.models import load_model
    from ndcost.plugins.census import kind_records, output_record
    from ndcost.plugins.contracts import cuda_sdpa
    cuda_sdpa.implementation()
    print(f"imports: {time.perf_counter() - began:.2f} s", flush=True)

    llama = load_model(transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        num_hidden_layers=32, vocab_size=128256, max_position_embeddings=8192))
    _timed("Llama-3-8B kind at 4096 tokens (uncached)", lambda: kind_records(llama, 4096, progress=None), 10)
    deepseek = load_model(transformers.DeepseekV3Config())
    _timed("DeepSeek-V3 every kind at 4096 tokens (uncached)",
           lambda: kind_records(deepseek, 4096, progress=None), 60)
    output_record(llama, 4096, progress=None)

    def cached():
        kind_records(llama, 4096, progress=None)
        output_record(llama, 4096, progress=None)
        kind_records(deepseek, 4096, progress=None)

    _timed("cached lookup (Llama kinds and output, DeepSeek-V3 kinds)", cached, 0.2)

    import ndcost
    from ndcost.values import Strategy
    ndcost.resolve(llama, census="auto").evaluate(Strategy.parse("seq=4096"))  # the resolver's own imports

    def cached_resolve():
        return ndcost.resolve(llama, census="auto").evaluate(Strategy.parse("seq=4096"))

    cost = _timed("cached resolve (ndcost.resolve of the Llama and one strategy priced from its census)",
                  cached_resolve, 0.2)
    if "census" not in str(cost.provenance):
        print("  (the resolve priced from the formulas, not the census: check the cache)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
