# shoal — the two commands: `make demo` and `make test` (each sets itself up).
.PHONY: all setup setup-python build build-asan venv-tools test test-cpp test-launcher test-asan demo bench clean

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= 2
CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

all: build

setup:
	@tools/setup/deps.sh

setup-python:
	@tools/setup/deps.sh --python

$(BUILD)/build.ninja: | setup
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(ASAN_BUILD)/build.ninja: | setup
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=address -DSHOAL_BUILD_BENCH=OFF

build-asan: setup $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# The launcher on the virtual environment's PATH.
venv-tools: build setup-python
	ln -sfn "$(CURDIR)/$(BUILD)/bin/shoalrun" .venv/bin/shoalrun

test-launcher: venv-tools
	.venv/bin/python -m pytest -q tests/launcher

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j 1

# The whole suite again under AddressSanitizer (the larger sweeps are trimmed
# by SHOAL_TEST_QUICK to keep CI inside its budget).
test-asan: build-asan
	cd $(ASAN_BUILD) && SHOAL_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 1

test: test-cpp test-launcher test-asan

demo: build
	@tools/demo.sh

bench: build setup-python
	bench/compare

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
