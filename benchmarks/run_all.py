"""Run every speed benchmark in this folder and report each one's outcome (``make bench``).

The benchmarks are run on demand, never as timed tests: a shared machine's
load would make such tests flaky. ``measure_cuda.py`` needs a CUDA GPU and is
not run here.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = ("bench_census.py", "bench_resolver.py", "bench_time.py")


def main() -> int:
    here = Path(__file__).parent
    failed = []
    for name in BENCHMARKS:
        print(f"== {name}", flush=True)
        if subprocess.call([sys.executable, str(here / name)]) != 0:
            failed.append(name)
    if failed:
        print(f"missed their targets or failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
