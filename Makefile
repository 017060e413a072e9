# hai-airflow: everything works on a fresh machine with nothing but Python 3.11.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install provision test test-fast lint demo bench chaos up docs docs-serve clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[all,dev,docs]'
	@touch $(STAMP)

# Chromium, a Docker engine and its image, Horovod and a kube-apiserver for the outer test tiers (skipped
# where impossible). Horovod goes into this venv.
provision:
	@bash .ci/provision $(PY)

# The suite runs in WORKERS processes: most tests wait (servers starting, jobs ending), so more workers than
# cores pay. Tests that share the Docker engine and the cluster, or a module's server, stay in one worker
# (tests/conftest.py marks their xdist groups).
WORKERS ?= 4
XDIST := -n $(WORKERS) --dist loadgroup

test: install provision
	$(PY) -m pytest $(XDIST)

# The inner loop, before every commit (at most 5 minutes): the tests that start no slow service. Out of it:
# the outer tiers' markers, Airflow (tests/airflow), real torch and Horovod training (tests/training), the
# docs' examples (tests/docs), the attacks of the security tier (tests/security), and the tests that
# restart or kill whole servers or run the benchmark scripts. `make test` stays the whole suite, and what
# CI runs.
FAST := -m "not (slow or docker or kube or browser or faults)" \
	--ignore=tests/airflow --ignore=tests/training --ignore=tests/docs --ignore=tests/security \
	--deselect=tests/server/test_live.py --deselect=tests/sim/test_benchmarks.py

test-fast: install
	$(PY) -m pytest $(XDIST) $(FAST)

lint: install
	$(VENV)/bin/ruff check hai_airflow tests benchmarks dev
	$(VENV)/bin/mypy hai_airflow
	$(VENV)/bin/lint-imports

demo: install
	$(PY) -m dev.demo

# Benchmarks print figures; the README's table comes from them.
bench: install
	$(PY) benchmarks/plan_bench.py
	$(PY) benchmarks/decisions.py --check --large
	$(PY) benchmarks/sim_bench.py
	$(PY) benchmarks/forecast_bench.py
	$(PY) benchmarks/forecast_accuracy.py
	$(PY) benchmarks/resize_sim.py
	$(PY) benchmarks/cycle_bench.py
	$(PY) benchmarks/server_bench.py
	$(PY) benchmarks/standby_bench.py
	$(PY) benchmarks/airflow_bench.py
	$(PY) benchmarks/hvd_init_bench.py
	$(PY) benchmarks/cli_bench.py
	bash benchmarks/vs_slurm.sh 1000 16

# The faults tier (part of `make test`) CHAOS_ROUNDS times over, each round drawing its random faults
# from another seed, then its figures as tables.
CHAOS_ROUNDS ?= 5
chaos: install provision
	rm -f .artifacts/faults.jsonl
	for round in $$(seq 1 $(CHAOS_ROUNDS)); do HAI_CHAOS_SEED=$$round $(PY) -m pytest -m faults -p no:randomly || exit 1; done
	$(PY) -m tests.faults.figures .artifacts/faults.jsonl

up: install
	$(PY) -m dev.demo --up

# The site (into .artifacts/site), references generated from the code by docs/hooks/reference.py;
# a broken link or a page missing from the nav fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .artifacts/site
