# The README's two set-up commands: `make bench` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := all,dev,sdk

.PHONY: bench test test-slow check install lint proto clean results profiles

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setup.py builds the optional C++ decoders (impl/decode/_native/: their sources, headers and
# the table generator) during the install.
NATIVE := $(wildcard impl/decode/_native/*.py impl/decode/_native/*/*.cpp impl/decode/_native/*/*.h)
$(STAMP): pyproject.toml setup.py $(NATIVE) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

bench: $(STAMP)
	$(BIN)/hotpath bench $(ARGS)

# Test tiers (docs/ci.md): `make check` lint and the fast tier (no test marked heavy or slow),
# `make test` everything but the tests that need minutes (marked `slow`), `make test-slow` those.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow $(ARGS)

check: lint
	$(BIN)/python -m pytest -m "not slow and not heavy" -q $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check impl benchmarks tests profiles perf
	$(BIN)/ruff format --check impl benchmarks tests profiles perf

# The committed results sample, the figures and the README's tables, from one quiet run.
results: $(STAMP)
	$(BIN)/python -m impl.analysis.results $(ARGS)

# Every committed profile recorded again at HEAD, one after another, and profiles/README.md's
# table of them rewritten (profiles/record.py; ARGS="--only server" for a part).
profiles: $(STAMP)
	$(BIN)/python profiles/record.py $(ARGS)

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. impl/encode/sample.proto

clean:
	rm -rf $(VENV) .asv .benchmarks .pytest_cache .sanitize

# The compiled decoders' own checks (docs/native.md): the differential fuzzer for SECONDS, and
# a build with ASan and UBSan (in .sanitize/) running their tests and SECONDS of the fuzzer.
SECONDS ?= 60
.PHONY: fuzz sanitize

fuzz: $(STAMP)
	$(BIN)/python -m impl.decode.fuzz --seconds $(SECONDS) $(ARGS)

sanitize: $(STAMP)
	$(BIN)/python -m impl.ci.sanitize --seconds $(SECONDS) $(ARGS)

# asv across commits, the pytest-benchmark quick loop, the CI regression gate (benchmarks/README.md, docs/ci.md).
ASV := $(BIN)/python -m asv
ASV_MACHINE ?= hotpath-ci
N ?= 20
.PHONY: asv asv-history dashboard dashboard-local perf gate gate-demo

asv: $(STAMP)
	$(ASV) machine --yes --machine $(ASV_MACHINE)
	$(ASV) run --machine $(ASV_MACHINE) $(if $(findstring -b,$(ARGS)),,--bench '^bench_') $(ARGS) HEAD^!

# The history subset (benchmarks/history.py) over the N newest first-parent commits of main,
# skipping the commits already measured; results go to benchmarks/results/ (committed) under
# the machine name hotpath-history (asv.history.json). ccache, where installed, keeps the
# native decoders' objects between commits. COMMITS=FILE measures the hashes listed in FILE.
HISTORY_ASV := $(ASV) --config asv.history.json
HISTORY_MACHINE := hotpath-history
CCACHE := $(if $(shell command -v ccache),CC="ccache gcc" CXX="ccache g++",)
COMMITS ?=
asv-history: $(STAMP)
	$(HISTORY_ASV) machine --yes --machine $(HISTORY_MACHINE)
	mkdir -p .asv
	$(if $(COMMITS),cp $(COMMITS),git rev-list --first-parent -n $(N) main >) .asv/history-commits.txt
	@# exit 2 = some benchmark failed on some commit (old commits may lack what it uses)
	$(CCACHE) $(HISTORY_ASV) run --machine $(HISTORY_MACHINE) --bench '^history\.' \
		--skip-existing-commits --launch-method spawn $(ARGS) \
		HASHFILE:.asv/history-commits.txt || [ $$? -eq 2 ]

# The committed history (benchmarks/results/) published into .asv/history-html, offline;
# nothing is measured. dashboard-local: the same for this clone's own .asv/results.
dashboard: $(STAMP)
	$(HISTORY_ASV) publish
	$(BIN)/python -m impl.ci.dashboard .asv/history-html
	@echo "open: $(BIN)/python -m http.server --bind 127.0.0.1 8080 -d .asv/history-html  ->  http://127.0.0.1:8080/"

dashboard-local: $(STAMP)
	$(ASV) publish
	$(BIN)/python -m impl.ci.dashboard .asv/html
	@echo "open: $(BIN)/python -m http.server --bind 127.0.0.1 8080 -d .asv/html  ->  http://127.0.0.1:8080/"
	@echo "  (or $(BIN)/asv preview, which listens on every interface)"

perf: $(STAMP)
	$(BIN)/python -m pytest perf -p no:cacheprovider --benchmark-columns=min,median,iqr,ops,rounds $(ARGS)

gate: $(STAMP)
	$(BIN)/python -m impl.ci.gate $(ARGS)

gate-demo: $(STAMP)
	$(BIN)/python -m impl.ci.gate_demo $(ARGS)
