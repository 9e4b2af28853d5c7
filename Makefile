# Every user-facing target installs what it needs first, so a fresh clone needs no earlier step.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RB     := $(VENV)/bin/replaybench
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(PY) -m harness.demo

# pytest-xdist, one worker per core (TEST_WORKERS=0: serial, in one process). --dist loadscope keeps a module's tests on
# one worker, so each module-scoped fixture (a vLLM check run, a simulated experiment) is still built once.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope

bench: setup
	$(PY) -m bench

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
