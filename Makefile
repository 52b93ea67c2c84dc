# The README's commands. `make demo` is the main job; `make test` is what CI runs.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch stays a range in pyproject.toml. Here we prefer the CPU build that this kind of machine keeps on
# disk (2.13.0+cpu) over a multi-GB CUDA download; on a GPU box run `make setup TORCH=torch`.
TORCH ?= torch>=2.2,<2.14
STAMP := $(VENV)/.setup-stamp
# pip's notes about this machine's local package mirrors are noise; errors still show and still fail.
QUIET := { grep -v -e "^WARNING: Location" -e "^\s*$$" || true; }
# pip's resolver complains that metaworld wants mujoco==3.3.0: the unpinned install is deliberate (see setup).
PIN_NOTE := { grep -v -e "dependency resolver does not currently" -e "requires mujoco==3.3.0" || true; }
export MUJOCO_GL ?= egl

.PHONY: setup demo test lint bench clean-demo help metaworld metaworld-mt50
help:
	@echo "make demo   collect demos, train, evaluate and deploy the demo policy (CPU, ~30 min on 2 cores)"
	@echo "make test   run the test suite (what CI runs)"
	@echo "make lint   ruff check"
	@echo "make bench  vla-bench: latency, train, data and collect figures side by side with peers"
	@echo "make metaworld  Meta-World MT10: collect, train, evaluate into runs/metaworld/ (resumable)"
	@echo "make metaworld-mt50  Meta-World MT50 on LeRobot's protocol, beside SmolVLA and pi0 (resumable, hours)"

setup: $(STAMP)

# OS packages for offscreen rendering: EGL (Mesa, software) and OSMesa as the fallback.
# Installed only when missing, so re-running is free.
$(STAMP): pyproject.toml
	@if ! ldconfig -p | grep -q 'libEGL.so.1' || ! ldconfig -p | grep -q 'libOSMesa.so'; then \
	  echo "installing offscreen GL libraries (libegl1, libgl1, libosmesa6)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libegl1 libgl1 libgl1-mesa-dri libosmesa6 >/dev/null; \
	fi
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 2>&1 | $(QUIET)
	$(BIN)/python -m pip install -q "$(TORCH)" 2>&1 | $(QUIET)
	$(BIN)/python -m pip install -q -e ".[dev,bench,export,text,vision]" 2>&1 | $(QUIET)
	@# Meta-World (the [metaworld] extra) without its mujoco==3.3.0 pin: 3.3.0 breaks the tabletop suite's
	@# bit-exact replay tests, and metaworld runs on the current MuJoCo 3 (envs/metaworld.py bridges the one
	@# difference). Its other requirements are ours already, or scipy.
	$(BIN)/python -m pip install -q "scipy>=1.4.1" 2>&1 | $(QUIET)
	$(BIN)/python -m pip install -q --no-deps "metaworld==3.1.1" 2>&1 | $(QUIET) | $(PIN_NOTE)
	@# openpi's robot client, which the serving tests drive vla-serve with, without its numpy<2 pin (it runs on
	@# numpy 2; its other requirements are in the [dev] extra).
	$(BIN)/python -m pip install -q --no-deps "openpi-client==0.1.2" 2>&1 | $(QUIET) | $(PIN_NOTE)
	@touch $@

demo: setup
	@PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

test: setup
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	@PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/bench.sh

metaworld: setup
	@PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/metaworld.sh

# Settings and per-stage estimates: `bash scripts/metaworld_mt50.sh --help`.
metaworld-mt50: setup
	@PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/metaworld_mt50.sh

clean-demo:
	rm -rf runs/demo data/demo.hdf5
