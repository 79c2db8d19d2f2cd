# One-command setup: `make demo` (main job) and `make test` (test suite) on a machine with python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow lint docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# the paper-faithful setting (docs/concepts/active-learning.md#paper-faithful): the truth's own
# Gamma hyper-parameters per node (slow X1, X3: Gamma(1/5, 1); fast X2, X4: Gamma(5, 1))
demo: $(STAMP)
	$(BIN)/jaxctbn run structure --alpha 0.2,5,0.2,5 --beta 1 --out run_structure

# jemalloc where it is installed (Debian's libjemalloc2; .ci/run installs it): the suite is
# compile-bound, XLA's compiler allocates and frees millions of small objects, and glibc's
# malloc took ~18% of a compile-bound file's CPU time (perf); with jemalloc the suite took 8-9%
# less (pytest 770.8 -> 711.6 s on 2 cores). Allocation changes no result.
JEMALLOC := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
	/usr/lib/aarch64-linux-gnu/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2 /usr/lib/libjemalloc.so.2))
PRELOAD := $(if $(JEMALLOC),LD_PRELOAD=$(JEMALLOC))

# The suite writes bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE):
# the CLI subprocesses, the notebook kernel and the checked run of the suite then load
# jaxctbn's compiled modules instead of compiling its sources again each, and a second run
# loads pytest's rewritten test modules (~2.5 s per worker).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright --pythonpath $(BIN)/python
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	PYTHONDONTWRITEBYTECODE= $(PRELOAD) $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q tests

# the tests marked slow (a second, costlier route through code that `make test` also covers)
test-slow: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PRELOAD) $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m slow tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright --pythonpath $(BIN)/python

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/master_equation/bench_master_equation.py
	$(BIN)/python benchmarks/paths/bench_sampling.py
	$(BIN)/python benchmarks/learning/bench_structure.py
	$(BIN)/python benchmarks/learning/bench_structure_large.py  # needs the CTBN-RLE driver for the peer rows (benchmarks/_ctbnrle.py)
	$(BIN)/python benchmarks/criteria/bench_criteria.py
	$(BIN)/python benchmarks/master_equation/bench_mean_field.py
	$(BIN)/python benchmarks/criteria/bench_kl_estimators.py
	$(BIN)/python benchmarks/cli/bench_cli.py
	$(BIN)/python benchmarks/active_learning/bench_active_learning.py  # the paper's experiments at full size (~30 min)

clean:
	rm -rf $(VENV) demo_output run_structure site
