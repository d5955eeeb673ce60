# Developer shortcuts; each target runs what its comment says, from the repository root.
#
# Every target runs in the virtual environment $(VENV), which the first one to need it creates
# and fills with the README's install; later runs skip that until pyproject.toml changes.
# `train` needs only torch and the package; every other target installs the extras too, so
# `make test` after `make train` completes the environment. VENV=DIR uses another environment
# (CI passes its fresh one); PYTHON creates it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Inside the environment, so that deleting it also forgets the install.
INSTALLED := $(VENV)/.gatle-ignite-installed
TRAINABLE := $(VENV)/.gatle-ignite-trainable

.PHONY: install train test test-fast examples docs bench ci

install: $(INSTALLED)  ## the set-up only: the environment and the README's install

train: $(TRAINABLE)  ## train the synthetic example again, replacing its previous run
	$(BIN)/gatle-ignite train --config=examples/synthetic/configs/synthetic_v0.py \
		--override replace_run=True

test: $(INSTALLED)  ## the whole test suite, as CI runs it
	$(BIN)/python -m pytest

test-fast: $(INSTALLED)  ## all but the slow tests (multi-process runs, fault injection, wheels)
	$(BIN)/python -m pytest -m "not slow"

examples: $(INSTALLED)  ## full run and checks of every shipped example (several minutes)
	$(BIN)/python scripts/run_examples.py

docs: $(INSTALLED)  ## the documentation site, strictly (a broken link fails)
	$(BIN)/python -m mkdocs build --strict

bench: $(INSTALLED)  ## the benchmarks of bench/
	$(BIN)/python bench/run_all.py

ci:  ## what CI does: fresh venv, install, lint, tests
	bash .ci/run

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The README's install, line for line; the stamp is written only once both succeeded. The full
# install holds the quick start's, so it writes that stamp too.
$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e ".[dev,examples,all,docs]"
	touch $@ $(TRAINABLE)

# The quick start's install: what training the synthetic example needs, and nothing more.
$(TRAINABLE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e .
	touch $@
