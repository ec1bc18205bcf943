# One-command entry points. Each target sets up .venv/ first (quick when already done).
PY := .venv/bin/python
PYTEST_ARGS ?=
# test processes (pytest-xdist), each test file whole in one: most tests wait on a child
# process, a JVM or a timeout for part of their time, so two share two cores well
TEST_WORKERS ?= 2

.PHONY: setup test demo demo-wd demo-sim demo-retrieval bench clean

setup:
	@bash tools/setup_env.sh

# pytest exits 5 when it collected no test; make treats any non-zero exit as failure.
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests $(PYTEST_ARGS)

demo: setup
	@bash tools/demo.sh

# SIM vs DIEN (and DIN) on synthetic data with a long-history signal (sim/README.md)
demo-sim: setup
	@bash tools/demo_sim.sh

# SASRec and HSTU on Amazon Beauty beside the published figures (retrieval/README.md)
demo-retrieval: setup
	@bash tools/demo_retrieval.sh

# Wide & Deep on synthetic Outbrain-shaped data (wide_and_deep/README.md)
demo-wd: setup
	@bash tools/demo_wd.sh

bench: setup
	$(PY) bench/loader_throughput.py
	$(PY) bench/train_throughput.py
	$(PY) bench/wd_train_throughput.py
	$(PY) bench/sim_train_throughput.py

clean:
	rm -rf .venv build .pytest_cache
