# Developer shortcuts; each target runs what its comment says, from the repository root.
PYTHON ?= python

.PHONY: test test-fast examples docs bench ci

test:        ## the whole test suite, as CI runs it
	$(PYTHON) -m pytest

test-fast:   ## everything but the slow tests (multi-process runs, fault injection, wheels)
	$(PYTHON) -m pytest -m "not slow"

examples:    ## full run and checks of every shipped example (several minutes)
	$(PYTHON) scripts/run_examples.py

docs:        ## the documentation site, strictly (a broken link fails)
	$(PYTHON) -m mkdocs build --strict

bench:       ## the benchmarks of bench/
	$(PYTHON) bench/run_all.py

ci:          ## what CI does: fresh venv, install, lint, tests
	bash .ci/run
