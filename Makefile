# Outside an active virtual environment (VIRTUAL_ENV unset) make installs into, and runs from, .venv, which it
# creates with $(BOOTSTRAP_PYTHON) -m venv: a system Python marked externally managed (PEP 668) refuses
# `pip install`. Inside one, it uses that environment's python. PYTHON=... on the command line overrides both.
BOOTSTRAP_PYTHON ?= python3
VENV ?= .venv
ifdef VIRTUAL_ENV
PYTHON ?= $(VIRTUAL_ENV)/bin/python
else
PYTHON ?= $(VENV)/bin/python
endif
PIP ?= $(PYTHON) -m pip

.PHONY: install install-examples demo test bench lint

$(VENV)/bin/python:
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)

# torch is pinned first: the project's machines hold a CPU wheel of torch 2.13.0, while an unpinned
# torch pulls a CUDA build of several GB. editable_mode=strict installs a tree of links to the sources
# (build/__editable__.*) on sys.path, a regular package `ndcost` the import system finds there: setuptools'
# default editable finder runs after the path search, so a checkout folder named ndcost in the current
# directory (a namespace package to Python) would otherwise shadow the install. A new module needs
# `make install` again.
install: $(filter $(VENV)/bin/python,$(PYTHON))
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[census,test,lint,plot,dask,deepspeed]' --config-settings editable_mode=strict

# The example third-party family (docs/examples/ndcost-olmo2), installed as an outsider would: .ci/run runs the
# suite with it installed (tests/test_third_party_family.py checks it; a real uninstall happens in a throwaway venv).
install-examples: install
	$(PIP) install -q -e docs/examples/ndcost-olmo2

demo: install
	$(PYTHON) -m ndcost estimate llama-3.1-8b --strategy "fsdp=8,tp=1,seq=4096,micro_batch=1,recompute=full" --hardware h200

# pytest's exit 5 (no tests collected) is a failure too. The environment's scripts folder is put first on PATH,
# so the tests that run the `ndcost` console script run the one just installed.
test: install
	@PATH="$(abspath $(dir $(PYTHON))):$$PATH" $(PYTHON) -m pytest -q; rc=$$?; \
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
