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
export PYTHON VENV USE_SYSTEM_TORCH SETUP_DRY_RUN

# Folder a class shares (make workshop-prep); WORKSHOP_REPORT=1 adds a reference report.
WORKSHOP_DIR ?=
WORKSHOP_REPORT ?= 0

.PHONY: setup report test lab compare clean-reports check-notebooks workshop-prep

setup:
	@bash scripts/setup.sh

## Run every notebook with the `default` profile into reports/<run-id>/ (index.html inside).
report: setup
	$(PY) -m helpers.run --profile $(PROFILE) $(ARGS)

## Unit tests, then every notebook executed with the `quick` profile.
test: setup
	$(PY) -m pytest $(ARGS)

## Several runs on one page: make compare RUNS="reports/a reports/b" -> reports/compare-<id>/index.html
RUNS ?=
compare: setup
	$(PY) -m helpers.compare $(RUNS) $(ARGS)

## JupyterLab on the notebooks with the project's kernel (workshops, ModelArts).
lab: setup
	$(PY) -m jupyter lab --notebook-dir=notebooks $(ARGS)

## Prepare a class folder once: venv, converted model cache, workshop.env (README "Running a workshop").
workshop-prep:
	@test -n "$(WORKSHOP_DIR)" || { echo "error: name the class folder, e.g. make workshop-prep WORKSHOP_DIR=/srv/class" >&2; exit 2; }
	VENV="$(WORKSHOP_DIR)/venv" bash scripts/setup.sh
	"$(WORKSHOP_DIR)/venv/bin/python" -m helpers.workshop prepare "$(WORKSHOP_DIR)" $(if $(filter 1,$(WORKSHOP_REPORT)),--report --profile $(PROFILE))

clean-reports:
	rm -rf reports
