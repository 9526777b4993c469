# Lineage: two commands on a fresh machine. Only python3 is assumed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint check bench manage clean-data help

help:
	@echo "make run    start Lineage (embedded Postgres + Redis, web, worker, beat) on http://127.0.0.1:8000"
	@echo "make test   run the whole test suite against its own embedded services"
	@echo "make lint   ruff + makemigrations --check"
	@echo "make bench NAME=durable_steps   run one benchmark"
	@echo "make manage ARGS='shell'        run manage.py with the embedded services up"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	rm -f $(VENV)/.installed-*
	touch $@

run: $(STAMP)
	$(PY) -m config.services run

test: $(STAMP)
	$(PY) -m config.services --data .data/test exec --fast -- $(PY) -m pytest $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m config.services --data .data/test exec --fast -- $(PY) manage.py makemigrations --check --dry-run

bench: $(STAMP)
	$(PY) -m config.services --data .data/bench exec -- $(PY) -m bench $(NAME)

manage: $(STAMP)
	$(PY) -m config.services exec -- $(PY) manage.py $(ARGS)

clean-data:
	rm -rf .data
