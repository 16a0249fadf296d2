# The two commands of the README: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench
setup:
	@VENV=$(VENV) scripts/setup.sh

demo: setup
	$(VENV)/bin/mindwatch demo $(ARGS)

test: setup
	$(VENV)/bin/ruff check mindwatch tests bench
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(ARGS)

lint: setup
	$(VENV)/bin/ruff check mindwatch tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff format --check mindwatch tests bench
	$(VENV)/bin/mypy

bench: setup
	$(PY) -m bench $(ARGS)
