# dtrain-tui — set-up, run and test. `make run` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch that this machine kind serves locally in seconds; override for CUDA, e.g.
#   make TORCH_SPEC='torch==2.6.0' test
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test check lint types format install system-deps test-snapshot-update golden-update bench docs screenshots clean

install: $(STAMP)

# The last step byte-compiles the editable sources once: where PYTHONDONTWRITEBYTECODE is set (as
# on this machine kind) every `dtrain-tui` process would otherwise compile them again (~0.1 s).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[all,dev]"
	$(BIN)/python -m compileall -q cli engine tui profiles >/dev/null
	touch $(STAMP)

# Programs the end-to-end tests drive for real: sshd (two or eight of them on 127.0.0.1), tmux, and
# a two-node Slurm on this host (slurmctld, two slurmd, munge; started and stopped by the tests).
system-deps:
	@if ! command -v tmux >/dev/null || ! { command -v sshd >/dev/null || test -x /usr/sbin/sshd; } \
	    || ! test -x /usr/sbin/slurmctld || ! test -x /usr/sbin/slurmd || ! command -v sbatch >/dev/null \
	    || ! test -x /usr/sbin/munged; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client tmux \
	      slurmctld slurmd slurm-client munge >/dev/null; \
	  else \
	    echo "system-deps: install openssh-server, tmux, slurmctld, slurmd, slurm-client and munge (tests that need them will be skipped)"; \
	  fi; \
	fi

run: $(STAMP)
	$(BIN)/dtrain-tui

lint: $(STAMP)
	$(BIN)/ruff check cli engine tui profiles tests benchmarks
	$(BIN)/ruff format --check cli engine tui profiles tests benchmarks
	$(BIN)/lint-imports

types: $(STAMP)
	$(BIN)/mypy cli engine tui profiles

format: $(STAMP)
	$(BIN)/ruff format cli engine tui profiles tests benchmarks
	$(BIN)/ruff check --fix cli engine tui profiles tests benchmarks

test: $(STAMP) system-deps lint types
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

check: format test

test-snapshot-update: $(STAMP)
	$(BIN)/python -m pytest -q tests/tui tests/profiles --snapshot-update

golden-update: $(STAMP)
	DTRAIN_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/engine -k golden

# The documentation site (mkdocs.yml, docs/): the CLI reference is generated from the parser first.
# Offline: no plugin fetches anything. `make test` builds it too, with --strict (tests/test_docs.py).
docs: $(STAMP)
	$(BIN)/python docs/gen_cli.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict
	@echo "site: site/index.html"

# The README's and the docs' pictures, made by the app itself under run_test (docs/images/*.svg).
screenshots: $(STAMP)
	$(BIN)/python docs/screenshots.py docs/images

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info site
