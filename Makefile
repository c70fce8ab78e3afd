# shoal — the two commands: `make demo` and `make test` (each sets itself up).
.PHONY: soak fuzz all setup setup-python setup-test setup-bench build build-test build-asan test test-cpp test-launcher test-python test-tensorflow test-netbed test-bench test-package test-asan test-fuzz demo demo-perf bench clean

BUILD      ?= build
# One clang AddressSanitizer tree serves the ASan test run and the fuzzers.
SAN_BUILD  ?= build-san
JOBS       ?= 2
CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

all: build

setup:
	@tools/setup/deps.sh

# .venv with what `make demo` needs (the pinned torch, numpy, scikit-learn);
# setup-test adds what the tests need (TensorFlow, transformers, accelerate,
# torchft, pytest-xdist ...), setup-bench what `make bench` plots with.
setup-python:
	@tools/setup/deps.sh --python

setup-test:
	@tools/setup/deps.sh --test

setup-bench:
	@tools/setup/deps.sh --bench

# The main build includes the torch backend (python/shoal/_C*.so), so it needs
# the virtual environment with PyTorch first. Configuring again is cheap. The
# editable install builds nothing (setup.py): it points .venv at python/, and
# its console script .venv/bin/shoalrun runs $(BUILD)/bin/shoalrun.
define build_main
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS) -DSHOAL_BUILD_TORCH=ON > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }
	cmake --build $(BUILD) -j $(JOBS)
	@cd /tmp && $(CURDIR)/.venv/bin/python -c "import shoal.torch" 2>/dev/null || \
	  $(CURDIR)/.venv/bin/pip install -q --no-build-isolation --no-deps -e $(CURDIR)
endef

build: setup-python
	$(build_main)

# The tests' build: the same tree once .venv has the test dependencies, so
# that the TensorFlow ops get built too (after `make demo`, only they compile).
build-test: setup-test
	$(build_main)

# The sanitizer tree builds only what runs there: libshoal (at -O1, a unity
# build: CMakeLists.txt), the executables CTest runs (the target shoal-tests,
# tests/cpp/CMakeLists.txt) and the fuzzers; not shoalrun, shoal-perf or the
# examples.
$(SAN_BUILD)/build.ninja: | setup
	CC=clang CXX=clang++ cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=address \
	  -DSHOAL_BUILD_FUZZERS=ON -DSHOAL_BUILD_BENCH=OFF -DSHOAL_BUILD_TENSORFLOW=OFF -DSHOAL_UNITY_BUILD=ON > $(SAN_BUILD).configure.log 2>&1 || \
	  { cat $(SAN_BUILD).configure.log; exit 1; }

build-asan: setup $(SAN_BUILD)/build.ninja
	cmake --build $(SAN_BUILD) -j $(JOBS) --target shoal-tests $(FUZZERS)

# Tests leave nothing in /tmp: their temporary files and flight-recorder
# dumps go to a scratch folder of the build tree, made afresh by each target.
SCRATCH = $(CURDIR)/$(BUILD)/test-scratch
scratch = rm -rf $(SCRATCH)/$(1) && mkdir -p $(SCRATCH)/$(1) && export TMPDIR=$(SCRATCH)/$(1) SHOAL_TRACE_DIR=$(SCRATCH)/$(1) &&

# pytest on PYTEST_WORKERS workers (pytest-xdist; ports come from
# tests/ports.py, so workers never collide), then, alone, the tests marked
# serial (timing bounds that a second worker's load would stretch). pytest's
# exit code 5 (nothing selected) fails only when both parts have it.
PYTEST_WORKERS ?= 2
pytest = .venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) -m "not serial" $(1); a=$$?; \
	.venv/bin/python -m pytest -q -m serial $(1); b=$$?; \
	[ $$a -eq 0 -o $$a -eq 5 ] && [ $$b -eq 0 -o $$b -eq 5 ] && [ $$a -eq 0 -o $$b -eq 0 ]

test-launcher: build-test
	$(call scratch,launcher) $(call pytest,tests/launcher)

test-python: build-test
	$(call scratch,python) $(call pytest,tests/python tests/gpu)

# TensorFlow 2: the ops and both APIs.
test-tensorflow: build-test
	$(call scratch,tensorflow) $(call pytest,tests/tensorflow)

# The C++ suite runs once. Its default set runs under AddressSanitizer
# (test-asan); the plain tree runs what ASan does not: the same tests over the
# other transports (shm_copy., tcp.), the fault harness (fault.ci, whose
# bounds a sanitizer's slowness would need slack for, and fault.recover), and
# the full-size transfer that SHOAL_TEST_QUICK trims under ASan.
PLAIN_ONLY = ^(shm_copy|tcp)\.|^fault\.|^Faults\.SigkillMidAllreduce4Ranks$$

test-cpp: build-test
	$(call scratch,cpp) cd $(BUILD) && ctest --output-on-failure -j 1 -R '$(PLAIN_ONLY)'

# Multi-host tests on a net bed (tools/netbed: network namespaces; skipped, with the reason, without root).
test-netbed: build-test
	$(call scratch,netbed) .venv/bin/python -m pytest -q tests/netbed

# The benchmark scripts' own tests and the size limit of the committed baselines (a few seconds).
test-bench: setup-test
	$(call scratch,bench) .venv/bin/python -m pytest -q bench/probes/tests

# shoal as users install it (docs/install.md): the wheel `pip wheel` makes of
# this checkout, installed into a fresh venv with the same torch and used from
# / (import, `python -m shoal.info`, a 2-rank job through its shoalrun); and
# the C++ package of `cmake --install`, which examples/cpp builds against out
# of tree. The wheel is made from $(BUILD), so nothing compiles again (about a
# minute in all; a wheel from a clean checkout compiles its own tree).
test-package: build-test
	$(call scratch,package) SHOAL_CMAKE_BUILD_DIR=$(CURDIR)/$(BUILD) CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  .venv/bin/python -m pytest -q tests/package

# The C++ suite's default set under AddressSanitizer (and LeakSanitizer);
# test-cpp runs the rest (PLAIN_ONLY). SHOAL_TEST_QUICK trims the largest
# transfer, which test-cpp runs at full size.
test-asan: build-asan
	$(call scratch,asan) cd $(SAN_BUILD) && SHOAL_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 1 -E '$(PLAIN_ONLY)'

test: test-cpp test-launcher test-python test-tensorflow test-netbed test-bench test-package test-asan test-fuzz

# The fuzzers (tests/fuzz, libFuzzer + AddressSanitizer, clang). test-fuzz
# replays each one's committed corpus (tests/fuzz/corpus/<name>: every input
# once, -runs=0); a crash, leak or sanitizer report fails it.
FUZZ_BUILD   ?= $(SAN_BUILD)
FUZZERS      := fuzz_handshake fuzz_tcp_stream fuzz_store_server

test-fuzz: build-asan
	@for f in $(FUZZERS); do \
	  ASAN_OPTIONS=detect_leaks=1 $(FUZZ_BUILD)/bin/$$f -runs=0 -close_fd_mask=2 tests/fuzz/corpus/$$f > $(FUZZ_BUILD)/$$f.log 2>&1 || \
	    { tail -n 60 $(FUZZ_BUILD)/$$f.log; echo "test-fuzz: $$f FAILED on its corpus (log: $(FUZZ_BUILD)/$$f.log)"; exit 1; }; \
	  echo "test-fuzz: $$f: the corpus ($$(ls tests/fuzz/corpus/$$f | wc -l) inputs) replayed, no crash"; \
	done

# Timed fuzzing (opt-in): each fuzzer runs for FUZZ_SECONDS on a scratch copy
# of its committed seed corpus; a crash, leak or sanitizer report fails the
# target (the input is kept as build-san/<name>-crash-*). docs/security.md has
# the results of longer runs.
FUZZ_SECONDS ?= 30

fuzz: build-asan
	@for f in $(FUZZERS); do \
	  rm -rf $(FUZZ_BUILD)/corpus/$$f && mkdir -p $(FUZZ_BUILD)/corpus/$$f || exit 1; \
	  ASAN_OPTIONS=detect_leaks=1 $(FUZZ_BUILD)/bin/$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -close_fd_mask=2 \
	    -artifact_prefix=$(FUZZ_BUILD)/$$f- $(FUZZ_BUILD)/corpus/$$f tests/fuzz/corpus/$$f > $(FUZZ_BUILD)/$$f.log 2>&1 || \
	    { tail -n 60 $(FUZZ_BUILD)/$$f.log; echo "fuzz: $$f FAILED (log: $(FUZZ_BUILD)/$$f.log)"; exit 1; }; \
	  echo "fuzz: $$f: $$(grep -o 'stat::number_of_executed_units: [0-9]*' $(FUZZ_BUILD)/$$f.log | grep -o '[0-9]*$$') runs in $(FUZZ_SECONDS) s, $$(grep -o 'cov: [0-9]* ft: [0-9]*' $(FUZZ_BUILD)/$$f.log | tail -n 1), no crash"; \
	done

# The long soaks (opt-in; tests/fault/README.md): 1,000 trials of the fault
# harness and 1,000 of its recover mode (about 35 minutes on 2 cores).
soak: build
	$(call scratch,soak) $(BUILD)/bin/shoal-fault --trials 1000 --seed 20240601 --ranks 2-5 --max-bytes 4194304
	$(call scratch,soak) $(BUILD)/bin/shoal-fault --recover --trials 1000 --seed 20240601 --ranks 2-8 --faults kill,kill2,stop

# The main job: the SageMaker-style DDP script on 2 local workers, via shoalrun.
demo: build
	SHOAL_PYTHON=$(CURDIR)/.venv/bin/python $(BUILD)/bin/shoalrun --standalone --nproc-per-node 2 examples/train_ddp.py

# A verified 2-rank benchmark of every collective with shoal-perf.
demo-perf: build
	@tools/demo.sh

# The side-by-side comparison and the torch one; raw rows and plots go to bench/out/ (bench/README.md).
bench: build setup-bench
	.venv/bin/python -m bench.compare
	.venv/bin/python bench/torch/compare_torch.py

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(SAN_BUILD).configure.log
