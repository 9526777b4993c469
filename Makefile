# Lineage: two commands on a fresh machine. Only python3 is assumed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint check bench manage lock clean-data help

help:
	@echo "make run    start Lineage (embedded Postgres + Redis, web, worker, beat) on http://127.0.0.1:8000"
	@echo "make test   run the whole test suite against its own embedded services"
	@echo "make lint   ruff + import-linter's contracts (.importlinter) + basedpyright + makemigrations --check"
	@echo "make bench NAME=durable_steps   run one benchmark"
	@echo "make manage ARGS='shell'        run manage.py with the embedded services up"
	@echo "make lock   pin the runtime dependencies (pylock.toml, what the production image installs)"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the stamp's name is pyproject.toml's checksum: a new checkout of the same file (a second worktree, a CI clone
# with its venv cached) installs nothing, its newer modification time notwithstanding
$(STAMP): $(PY)
	$(PY) -m pip install --quiet -e ".[local,dev,bench]"
	rm -f $(VENV)/.installed-*
	touch $@

run: $(STAMP)
	$(PY) -m config.supervisor run

test: $(STAMP)
	$(PY) -m config.supervisor --data .data/test exec --fast -- $(PY) -m pytest $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/basedpyright
	$(PY) -m config.supervisor --data .data/test exec --fast -- $(PY) manage.py makemigrations --check --dry-run

bench: $(STAMP)
	$(PY) -m config.supervisor --data .data/bench exec -- $(PY) -m bench $(NAME)

manage: $(STAMP)
	$(PY) -m config.supervisor exec -- $(PY) manage.py $(ARGS)

# the runtime dependencies of pyproject.toml (no extras, not the project itself) pinned with their hashes for
# Python 3.11 on Linux x86-64: the Dockerfile installs them in a layer of their own
lock: $(STAMP)
	$(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > .lock.in
	$(PY) -m pip lock --quiet -r .lock.in -o pylock.toml; status=$$?; rm -f .lock.in; exit $$status

clean-data:
	rm -rf .data
