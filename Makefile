# The two commands of the README: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

DIST ?= dist

.PHONY: setup demo test lint bench dist
setup:
	@VENV=$(VENV) scripts/setup.sh

demo: setup
	$(VENV)/bin/mindwatch demo $(ARGS)

# CI runs this: everything `make lint` checks (ruff, the import contracts, the format, mypy; eslint and prettier on the
# JavaScript), then the tests (tests/test_javascript.py runs the JavaScript's `node --test` suite), in three
# pytest-xdist workers, a module to a worker, the slow modules first (tests/conftest.py). Three on a 2-core machine: the
# suite mostly waits (msrun jobs paced by their data, browsers, servers), and with two workers the cores were ~55 % busy. The checkout's bytecode is
# written first: where PYTHONDONTWRITEBYTECODE is set, each of the suite's hundreds of processes would compile it again.
PYTEST_WORKERS ?= -n 3 --dist loadfile --no-loadscope-reorder
test: lint
	@$(PY) -m compileall -q mindwatch tests bench >/dev/null
	$(PY) -m pytest -q $(PYTEST_WORKERS) $(ARGS)

lint: setup
	$(VENV)/bin/ruff check mindwatch tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff format --check mindwatch tests bench
	$(VENV)/bin/mypy
	npm run --silent lint

bench: setup
	$(PY) -m bench $(ARGS)

# The wheel and sdist (ECharts inside) into $(DIST)/: needs npm and `pip install build`, not MindSpore.
dist: node_modules
	$(PY) -m build --outdir $(DIST)

node_modules: package.json package-lock.json
	@command -v npm >/dev/null || { echo "make dist: npm not found: install Node.js and npm (Debian: apt-get install npm), then run make dist again" >&2; exit 1; }
	npm ci --no-audit --no-fund
	touch node_modules
