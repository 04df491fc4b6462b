#!/usr/bin/env bash
# One command for a lent CUDA machine (an H200): whole training steps, then the kernel tables, all under $OUT.
#
#   OUT=/some/folder bash benchmarks/device_run.sh [TOTAL_SECONDS]      (default 540: under a 600 s command limit)
#
# 1. the environment: nvidia-smi, Python, torch, Transformers, CUDA (environment.txt); without torch and a GPU
#    nothing can be measured and it stops (exit 2);
# 2. ndcost importable (measure_kernels.py reads the h200 spec through it): as found, else through
#    benchmarks/ndcost_shim.py's link tree on PYTHONPATH (what `pip install --no-deps -e .` would give, without the
#    build backend pyproject.toml asks for, which a machine with no network may lack, and without touching
#    site-packages); measure_steps.py needs none of it;
# 3. benchmarks/measure_steps.py --out $OUT/h200_steps.json under what is left less KERNEL_SECONDS (120), the
#    JSON rewritten after every case (a run killed at the limit keeps its finished cases);
# 4. benchmarks/measure_kernels.py --quick --out $OUT/h200_kernels.json with what is left (if 30 s or more).
# Everything printed goes to $OUT/device_run.log too. DRY_RUN=1 runs both scripts' --dry-run on the CPU (no GPU
# needed: what CI checks); STEPS_ONLY=GLOB passes measure_steps.py --only. Back home: copy h200_steps.json to
# tests/data/ (benchmarks/validate_h200.py reads it there, or give --steps FILE) and run
# `ndcost calibrate --kernels h200_kernels.json --hardware h200`.
set -u
cd "$(dirname "$0")/.."
TOTAL=${1:-540}
KERNEL_SECONDS=${KERNEL_SECONDS:-120}
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/.device-out}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
exec > >(tee -a "$OUT/device_run.log") 2>&1

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi 2>&1 || echo "nvidia-smi: not found"
  "$PY" -c 'import platform, sys; print("python", platform.python_version(), sys.executable)'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
             "available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")' \
    2>&1 | tail -1
  "$PY" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1
  echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-(unset)}"
} > "$OUT/environment.txt"
cat "$OUT/environment.txt"
DRY=()
[ "${DRY_RUN:-0}" = 1 ] && DRY=(--dry-run)
ONLY=()
[ -n "${STEPS_ONLY:-}" ] && ONLY=(--only "$STEPS_ONLY")
if ! "$PY" -c "import torch, transformers; assert torch.cuda.is_available() or ${#DRY[@]}" 2>/dev/null; then
  echo "device_run: torch with CUDA and Transformers are needed and not importable here (environment.txt)"
  exit 2
fi

ndcost_ok() { "$PY" -c 'from ndcost import manager; manager.registry().get("hardware/h200")' >/dev/null 2>&1; }
if ndcost_ok; then
  echo "ndcost: importable as installed"
else
  SHIM="$(mktemp -d)/ndcost_shim"
  "$PY" benchmarks/ndcost_shim.py "$SHIM" >/dev/null && export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
  if ndcost_ok; then echo "ndcost: importable through benchmarks/ndcost_shim.py ($SHIM)"; else
    echo "ndcost: not importable (its dependencies pluggy, attrs, PyYAML, numpy?): measure_kernels.py will be skipped"
  fi
fi

STEPS_BUDGET=$(( $(left) - KERNEL_SECONDS ))
echo "measure_steps.py: budget ${STEPS_BUDGET} s"
"$PY" benchmarks/measure_steps.py --out "$OUT/h200_steps.json" --budget-seconds "$STEPS_BUDGET" ${DRY[@]+"${DRY[@]}"} \
  ${ONLY[@]+"${ONLY[@]}"}

KERNELS_LEFT=$(( $(left) - 5 ))
if [ "$KERNELS_LEFT" -ge 30 ] && ndcost_ok; then
  echo "measure_kernels.py --quick: ${KERNELS_LEFT} s left"
  timeout "$KERNELS_LEFT" "$PY" benchmarks/measure_kernels.py --quick --hardware h200 --out "$OUT/h200_kernels.json" \
    ${DRY[@]+"${DRY[@]}"} || echo "measure_kernels.py: exit $? (124: out of time; its JSON is written only at the end)"
else
  echo "measure_kernels.py: skipped (${KERNELS_LEFT} s left, or ndcost not importable)"
fi
echo "device_run: done in $(( $(date +%s) - START )) s; under $OUT:"
ls -l "$OUT"
