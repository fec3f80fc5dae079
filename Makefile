# The README's two set-up commands: `make bench` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := all,dev,sdk

.PHONY: bench test install lint proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

bench: $(STAMP)
	$(BIN)/hotpath bench $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check impl benchmarks tests profiles
	$(BIN)/ruff format --check impl benchmarks tests profiles

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iimpl/encode --python_out=impl/encode --pyi_out=impl/encode impl/encode/sample.proto

clean:
	rm -rf $(VENV) .asv .benchmarks .pytest_cache
