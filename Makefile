PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install demo test bench

# torch is pinned first: the project's machines hold a CPU wheel of torch 2.13.0, while an unpinned
# torch pulls a CUDA build of several GB.
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'

demo: install
	$(PYTHON) -m ndcost estimate llama-3.1-8b --strategy "fsdp=8,tp=1,seq=4096,micro_batch=1,recompute=full" --hardware h200

# pytest's exit 5 (no tests collected) is a failure too.
test: install
	@$(PYTHON) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: install
	$(PYTHON) benchmarks/run_all.py
