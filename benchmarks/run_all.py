"""Run every speed benchmark in this folder and report each one's outcome (``make bench``).

The benchmarks are run on demand, never as timed tests: a shared machine's
load would make such tests flaky. ``measure_cuda.py`` needs a CUDA GPU and is
not run here; ``bench_time.py`` runs in its CPU mode (``--speed``: how fast the
time model prices strategies), its GPU measurements being taken on demand.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = ("bench_census.py", "bench_resolver.py", "bench_evaluate.py", "bench_time.py", "bench_search.py")
# Arguments a benchmark needs to run on a CPU-only machine; {out} is a scratch file.
ARGUMENTS = {"bench_time.py": ("--speed", "100000", "--out", "{out}")}


def main() -> int:
    here = Path(__file__).parent
    failed = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in BENCHMARKS:
            print(f"== {name}", flush=True)
            out = str(Path(scratch) / f"{name}.json")
            args = [arg.format(out=out) for arg in ARGUMENTS.get(name, ())]
            if subprocess.call([sys.executable, str(here / name), *args]) != 0:
                failed.append(name)
    if failed:
        print(f"missed their targets or failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
