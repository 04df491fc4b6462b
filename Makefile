PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install demo test bench lint

# torch is pinned first: the project's machines hold a CPU wheel of torch 2.13.0, while an unpinned
# torch pulls a CUDA build of several GB.
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[census,test,lint,plot,dask]'

demo: install
	$(PYTHON) -m ndcost estimate llama-3.1-8b --strategy "fsdp=8,tp=1,seq=4096,micro_batch=1,recompute=full" --hardware h200

# pytest's exit 5 (no tests collected) is a failure too.
test: install
	@$(PYTHON) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# ruff on framework/ and registry/, then mypy whatever ruff found (its files in pyproject.toml). mypy names modules by their folders,
# so build/mypy/ndcost is first made the installed layout of links (framework/* with registry, plugins, specs
# inside) for the `ndcost.*` imports to resolve.
lint: install
	@rm -rf build/mypy && mkdir -p build/mypy/ndcost
	@for entry in framework/*; do ln -s "../../../$$entry" build/mypy/ndcost/; done
	@for folder in registry plugins specs; do ln -s "../../../$$folder" "build/mypy/ndcost/$$folder"; done
	@$(PYTHON) -m ruff check framework registry; ruff=$$?; $(PYTHON) -m mypy && exit $$ruff

bench: install
	$(PYTHON) benchmarks/run_all.py
