# Djinn build. `make` builds ./djinn and ./convert/convert (the converter's sources live in convert/, so its
# binary sits beside them); `make test` builds and runs the Criterion suite
# (installing libcriterion-dev first when missing and running as root); `make test SAN=1` runs it under
# ASan+UBSan; `make demo` converts and runs the tiny real model from $(DATA).
# Builds run one job a core unless -j says otherwise, one short line a file (V=1: the commands).
# Without the CUDA toolkit (no nvcc at $(CUDA), or make CUDA=/nowhere) the build is CPU-only, with cc alone, in
# build-cpu/: the GPU engine's files are left out (DJINN_NO_GPU) and gpu_none.c stands in for them.

DATA ?= ../shared
CUDA ?= /usr/local/cuda
NVCC ?= $(CUDA)/bin/nvcc
CC ?= cc

ifeq ($(filter -j% j%,$(MAKEFLAGS))$(filter fuzz-run%,$(MAKECMDGOALS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)  # fuzz-run: one target at a time unless -j asks for more
endif
V ?= 0
ifeq ($(V),1)
Q :=
show :=
else
Q := @
show = @printf '  %-5s %s\n' '$(1)' '$(2)'
MAKEFLAGS += --no-print-directory
endif

HAVE_CUDA := $(if $(and $(wildcard $(NVCC)),$(wildcard $(CUDA)/include/cuda_runtime_api.h)),1,0)
ifeq ($(HAVE_CUDA),1)
GPU_CFLAGS := -I$(CUDA)/include
CPU_ONLY :=
else
GPU_CFLAGS := -DDJINN_NO_GPU
CPU_ONLY := -cpu
endif

SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san$(CPU_ONLY)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD ?= build$(CPU_ONLY)
SANFLAGS :=
endif
ifeq ($(HAVE_CUDA)$(MAKELEVEL),00)
$(info make: no CUDA toolkit at $(CUDA) (no $(NVCC)): a CPU-only djinn, without the GPU engine, in $(BUILD)/)
endif

CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -pthread \
          $(GPU_CFLAGS) -MMD -MP $(SANFLAGS) $(CEXTRA)
CEXTRA ?=
NVEXTRA ?=
# sm_90 code with a PTX fallback; qgemm.cu's Hopper kernel (wgmma) needs the arch-specific sm_90a target, with the
# same compute_90 PTX (where that kernel is compiled out) as the fallback.
NVARCH = -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
$(BUILD)/qgemm.o: NVARCH = -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
NVFLAGS = $(NVEXTRA) -O3 -std=c++17 $(NVARCH) \
           -Xcompiler -Wall,-Werror -MMD -MP
ifeq ($(HAVE_CUDA),1)
LDLIBS := -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lcublas -lcudart -lstdc++ -lm -lpthread -ldl
else
LDLIBS := -lm -lpthread -ldl
endif
# What reads and writes model.bin without running it (the converter, the fuzz targets): no CUDA.
FORMAT_OBJ := $(BUILD)/model.o $(BUILD)/tokenizer.o $(BUILD)/util.o
LDFLAGS := $(SANFLAGS)

# GPU objects: every top-level .cu (kernels.cu and the op families beside it, one C API: kernels.h).
# The GPU engine's C files: those that include the CUDA runtime's API (kernels.h, or gpu_impl.h, kernels_impl.h).
# Its test files: those that include them or trace.h. Without CUDA, gpu_none.c and tests/test_gpu_none.c stand in.
GPU_C_SRC := $(shell grep -l '^\#include "\(kernels\|gpu_impl\|kernels_impl\)\.h"' *.c)
GPU_TEST_SRC := $(shell grep -l '^\#include "\.\./\(kernels\|gpu_impl\|kernels_impl\|trace\)\.h"' tests/test_*.c)
ifeq ($(HAVE_CUDA),1)
KERNEL_SRC := $(wildcard *.cu)
NOT_BUILT := gpu_none.c tests/test_gpu_none.c
else
KERNEL_SRC :=
NOT_BUILT := $(GPU_C_SRC) $(GPU_TEST_SRC)
endif
KERNEL_OBJ := $(KERNEL_SRC:%.cu=$(BUILD)/%.o)
# Engine objects: every top-level .c except the CLI's main, plus the GPU objects.
ENGINE_SRC := $(filter-out djinn.c $(NOT_BUILT),$(wildcard *.c))
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o) $(KERNEL_OBJ)
# Converter objects: everything in convert/ except its main.
CONVERT_SRC := $(filter-out convert/main.c,$(wildcard convert/*.c))
CONVERT_OBJ := $(CONVERT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(filter-out $(NOT_BUILT),$(wildcard tests/test_*.c)) tests/common.c
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all test demo clean criterion npm-client fuzz

all: djinn convert/convert

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(call show,CC,$<)
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(call show,NVCC,$<)
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/bin/djinn: $(BUILD)/djinn.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(call show,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bin/convert: $(BUILD)/convert/main.o $(CONVERT_OBJ) $(FORMAT_OBJ) $(BUILD)/json.o $(BUILD)/fileio.o \
                      $(BUILD)/pool.o $(BUILD)/quant.o
	@mkdir -p $(dir $@)
	$(call show,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ -lm -lpthread

# Copied whenever they differ from this build's (phony): a build with CUDA and one without each put theirs here.
.PHONY: djinn convert/convert
djinn: $(BUILD)/bin/djinn
	$(Q)cmp -s $< $@ || cp $< $@

convert/convert: $(BUILD)/bin/convert
	$(Q)cmp -s $< $@ || cp $< $@

# ---- tests
# CRITERION=DIR: a Criterion unpacked in DIR (include/, lib/) instead of the system's, for machines that
# cannot install packages (the GPU machine).
CRITERION ?=
ifneq ($(CRITERION),)
TEST_CFLAGS := -I$(abspath $(CRITERION))/include
TEST_LIBS := -L$(abspath $(CRITERION))/lib -Wl,--disable-new-dtags,-rpath,$(abspath $(CRITERION))/lib
endif

# valgrind and curl are optional: without them cli::valgrind_clean_cpu_generation and server::curl_client skip with
# the reason.
criterion:
	@if [ -n "$(CRITERION)" ]; then \
	  [ -f "$(CRITERION)/include/criterion/criterion.h" ] || { echo "make: no Criterion in $(CRITERION)" >&2; exit 1; }; \
	elif [ ! -f /usr/include/criterion/criterion.h ] || ! command -v valgrind >/dev/null \
	     || ! command -v curl >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make test: installing with apt-get: libcriterion-dev (the test framework), valgrind and curl (two" \
	         "tests use them)" >&2; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libcriterion-dev valgrind curl) >&2 \
	      || [ -f /usr/include/criterion/criterion.h ] || exit 1; \
	  elif [ ! -f /usr/include/criterion/criterion.h ]; then \
	    echo "make: Criterion is missing: run 'sudo apt-get install libcriterion-dev'" >&2; exit 1; \
	  fi; \
	fi

$(BUILD)/run_tests: $(TEST_OBJ) $(CONVERT_OBJ) $(ENGINE_OBJ)
	$(call show,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(TEST_LIBS) -lcriterion

$(TEST_OBJ): | criterion
$(TEST_OBJ): CFLAGS += $(TEST_CFLAGS)
$(BUILD)/tests/test_gpu_none.o: CFLAGS += -DDJ_GPU_TESTS='"$(GPU_TEST_SRC)"'

# OpenAI's own npm client, which server::openai_node_client drives: installed into tests/npm when node and npm are
# there and it is not (package.json pins its version). Without npm's registry the test skips and says why.
npm-client:
	@if [ ! -f tests/npm/node_modules/openai/package.json ] && command -v node >/dev/null \
	     && command -v npm >/dev/null; then \
	  echo "make test: installing with npm: the openai package into tests/npm (server::openai_node_client)" >&2; \
	  (cd tests/npm && npm install --no-audit --no-fund --fetch-retries=1 --fetch-timeout=30000 >/dev/null 2>&1) \
	    || echo "make: npm could not install it ('npm install' in tests/npm says why): server::openai_node_client" \
	            "will skip" >&2; \
	fi

# Tests find the shared data and the binaries under test through the environment. The log is kept
# ($(BUILD)/test.log); the last line adds the skipped tests to Criterion's count (each [SKIP] line says why); after a
# failure tests/failures.sh repeats its failures at the end.
test: criterion npm-client
	$(Q)$(MAKE) $(BUILD)/run_tests $(BUILD)/bin/djinn $(BUILD)/bin/convert $(BUILD)/bin/repeat_layers
	@{ DJINN_DATA=$(abspath $(DATA)) DJINN_BIN=$(abspath $(BUILD))/bin DJINN_TESTS=$(abspath tests) \
	   ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	   $(BUILD)/run_tests --verbose $(TESTFLAGS) 2>&1; echo $$? > $(BUILD)/test.rc; } | tee $(BUILD)/test.log; \
	echo "make test: $$(grep -o 'Tested: .*' $(BUILD)/test.log | tail -1 | sed 's/ *$$//') | Skipped:" \
	     "$$(grep '^\[SKIP\]' $(BUILD)/test.log | grep -vc ': Test is disabled$$') (grep SKIP $(BUILD)/test.log:" \
	     "each says why)"; \
	rc=$$(cat $(BUILD)/test.rc); [ "$$rc" = 0 ] || tests/failures.sh $(BUILD)/test.log; exit $$rc

# A minute of hostile and well-behaved clients against `djinn serve` on loopback (tests/soak.py says what it checks);
# CI runs it on the sanitized build (make soak SAN=1).
SOAK_S ?= 45
.PHONY: soak
soak: $(BUILD)/bin/djinn $(BUILD)/bin/convert
	python3 tests/soak.py $(abspath $(BUILD))/bin/djinn $(abspath $(BUILD))/bin/convert \
	  $(abspath $(DATA))/models/stories260K $(abspath $(BUILD))/soak $(SOAK_S)

# ---- mutation testing: `make mutate` breaks each check listed in tests/mutations.tsv in a scratch copy of the tree
# and runs the suites named for it (tools/mutate.py; docs/testing.md). MUTATE_SAMPLE=N runs N of them, chosen by
# MUTATE_SEED; MUTATE_TIMEOUT limits each mutation's suites (seconds).
MUTATE_SAMPLE ?= 0
MUTATE_SEED ?=
MUTATE_TIMEOUT ?= 180
.PHONY: mutate
mutate: criterion
	$(MAKE) $(BUILD)/run_tests $(BUILD)/bin/djinn $(BUILD)/bin/convert $(BUILD)/bin/repeat_layers
	DJINN_DATA=$(abspath $(DATA)) MUTATE_BUILD=$(BUILD) MUTATE_SAMPLE=$(MUTATE_SAMPLE) MUTATE_SEED=$(MUTATE_SEED) \
	  MUTATE_TIMEOUT=$(MUTATE_TIMEOUT) python3 tools/mutate.py

# ---- the README's first command: convert the tiny real model and generate from it
demo: djinn convert/convert
	./convert/convert $(DATA)/models/stories260K stories260K.bin --dtype f32
	./djinn stories260K.bin -p "Once upon a time" -n 200 -t 0

# The chat on the tiny model, which has no template of its own: Llama 2's, two turns from stdin.
.PHONY: demo-chat
demo-chat: djinn convert/convert
	./convert/convert $(DATA)/models/stories260K stories260K.bin --dtype f32
	printf 'Tell me about a cat.\nAnd then?\n' | ./djinn stories260K.bin --chat --chat-template llama2 -n 60 -t 0

clean:
	rm -rf build build-san build-cpu build-san-cpu build-fuzz djinn convert/convert stories260K.bin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- bench
# Tokenizer throughput (MB/s) on ~1 MB of generated English with the real Llama tokenizers from $(DATA).
.PHONY: bench-tokenizer
bench-tokenizer: $(BUILD)/bin/bench_tokenizer
	$(BUILD)/bin/bench_tokenizer $(abspath $(DATA)) $(BUILD)/bench_tokenizer.json

$(BUILD)/bin/bench_tokenizer: $(BUILD)/bench/bench_tokenizer.o $(BUILD)/tokenizer.o $(BUILD)/util.o \
                              $(BUILD)/convert/tokjson.o $(BUILD)/json.o $(BUILD)/fileio.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lm -lpthread

# ---- bench: the hardware ceilings (HBM, PCIe, host memory, tensor cores) and the decode GEMV against them; GPU
# machine only. (A bench/X.cu compiles by the rule for every .cu, its headers from the .d files.)
CEILINGS_JSON ?= $(BUILD)/ceilings.json
.PHONY: bench-ceilings
$(BUILD)/bin/ceilings: $(BUILD)/bench/ceilings.o $(BUILD)/bench/host_read.o $(BUILD)/bench/host_matvec.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lcublasLt $(LDLIBS)

$(BUILD)/bin/qp_probe: $(BUILD)/bench/qp_probe.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

bench-ceilings: $(BUILD)/bin/ceilings
	$(BUILD)/bin/ceilings $(CEILINGS_JSON)

# ---- bench: several GPUs' ceilings (each link, all links at once, the host's reads beside them, peer copies and
# the all-reduce's sum); the two-GPU machine
$(BUILD)/bin/peer_ceilings: $(BUILD)/bench/peer_ceilings.o $(BUILD)/bench/host_read.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: the quantized product for T > 1, every qgemm.cu tile shape against dequantize + cuBLAS and f16 cuBLAS
$(BUILD)/bin/qgemm_bench: $(BUILD)/bench/qgemm_bench.o $(KERNEL_OBJ) $(BUILD)/model.o $(BUILD)/util.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: f16 and bf16 products of 2-16 tokens, dense_rows.cu's kernel against cuBLAS
$(BUILD)/bin/drow_bench: $(BUILD)/bench/drow_bench.o $(KERNEL_OBJ) $(BUILD)/model.o $(BUILD)/util.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: the register kernel's memory pattern alone, with stand-in work between its copies (self-contained)
$(BUILD)/bin/qreg_read: bench/qreg_read.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $< -o $@

# ---- bench: decode attention for many rows (gpu_attention_decode_rows) against the D2D ceiling
$(BUILD)/bin/attn_bench: $(BUILD)/bench/attn_bench.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: whether dequantizing the next matrix hides behind the GEMM of this one (two streams, cuBLASLt's SM target)
$(BUILD)/bin/overlap_bench: $(BUILD)/bench/overlap_bench.o $(KERNEL_OBJ) $(BUILD)/model.o $(BUILD)/util.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lcublasLt $(LDLIBS)

# ---- bench: picking the next token on a 128k vocabulary, on the GPU (gpu_pick) and on the host; GPU machine only
$(BUILD)/bin/pick_bench: $(BUILD)/bench/pick_bench.o $(KERNEL_OBJ) $(BUILD)/sampler.o $(BUILD)/util.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: speculative decoding's parts, a verification pass of T rows against a decode step and the draft's step
# (bench/spec_bench.sh); GPU machine only
$(BUILD)/bin/spec_bench: $(BUILD)/bench/spec_bench.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: a decode step deep into the context for each KV cache type (bench/depth_bench.sh); GPU machine only
$(BUILD)/bin/depth_bench: $(BUILD)/bench/depth_bench.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: a server's decode turn of N slots without the server (its ncu profile: STEP_PROFILE=1); GPU machine only
$(BUILD)/bin/step_bench: $(BUILD)/bench/step_bench.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- fuzz: libFuzzer targets (clang, ASan+UBSan) for every parser of untrusted bytes; sources in tests/fuzz/.
# `make fuzz` builds them into $(FUZZ_BUILD)/bin; `make fuzz-run FUZZ_SECONDS=600` (add -j2 for two at once)
# runs each on a scratch copy of its committed corpus tests/fuzz/corpus/<target>/, merges the inputs that
# add coverage back into it (minimised, -merge=1) and prints executions and coverage. Crashes are saved in
# $(FUZZ_BUILD)/crashes/. `make fuzz-seeds` rewrites the generated seeds (seed_*).
FUZZ_CC ?= clang
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_FLAGS ?=
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS := -std=c11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -pthread \
               -I$(CUDA)/include -MMD -MP $(FUZZ_SAN)
FUZZ_TARGETS := fuzz_model fuzz_safetensors fuzz_json fuzz_tokenizer fuzz_http fuzz_api fuzz_hfconfig fuzz_tokjson
FUZZ_DEPS_fuzz_model := model.o tokenizer.o util.o
FUZZ_DEPS_fuzz_safetensors := convert/safetensors.o json.o util.o
FUZZ_DEPS_fuzz_json := json.o util.o
FUZZ_DEPS_fuzz_tokenizer := tokenizer.o convert/tokjson.o json.o fileio.o util.o
FUZZ_DEPS_fuzz_http := http.o
FUZZ_DEPS_fuzz_api := api.o chat.o sampler.o buf.o tokenizer.o convert/tokjson.o json.o fileio.o util.o
FUZZ_DEPS_fuzz_hfconfig := convert/hfconfig.o model.o tokenizer.o json.o util.o
FUZZ_DEPS_fuzz_tokjson := convert/tokjson.o tokenizer.o json.o fileio.o util.o
# Longest input per target: keeps the committed corpus small (model inputs are in fuzz_model's compact form).
FUZZ_MAXLEN_fuzz_model := 1024
FUZZ_MAXLEN_fuzz_safetensors := 4096
FUZZ_MAXLEN_fuzz_json := 4096
FUZZ_MAXLEN_fuzz_tokenizer := 2048
FUZZ_MAXLEN_fuzz_http := 2048
FUZZ_MAXLEN_fuzz_api := 4096
FUZZ_MAXLEN_fuzz_hfconfig := 4096
FUZZ_MAXLEN_fuzz_tokjson := 12800
# Merged units a target's committed corpus keeps only under this size (bytes; its seeds always): fuzz_tokjson's
# inputs are whole tokenizer files, and all it merges runs to megabytes.
FUZZ_KEEP_UNDER_fuzz_tokjson := 2048

# `make fuzz-replay` (in CI): every committed corpus input and every crash file once through its target, under
# clang's ASan+UBSan, which catch what gcc's sanitizers in `make test SAN=1` do not (NULL + 0, for one). As root
# it installs clang and its fuzzer runtime when missing.
# Crash files are named after their target: json_* -> fuzz_json, safetensors_* -> fuzz_safetensors, ...
.PHONY: fuzz fuzz-run fuzz-seeds fuzz-replay fuzz-tools $(addprefix fuzz-run-,$(FUZZ_TARGETS))
.SECONDARY: $(addprefix $(FUZZ_BUILD)/tests/fuzz/,$(addsuffix .o,$(FUZZ_TARGETS) gen_seeds)) \
            $(addprefix $(FUZZ_BUILD)/,$(sort $(foreach t,$(FUZZ_TARGETS),$(FUZZ_DEPS_$(t)))))
fuzz: $(addprefix $(FUZZ_BUILD)/bin/,$(FUZZ_TARGETS))

fuzz-tools:
	@if ! command -v $(FUZZ_CC) >/dev/null || ! echo 'int LLVMFuzzerTestOneInput(const char*d,long n){return 0;}' | \
	    $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make: installing clang and libclang-rt-dev (libFuzzer)" >&2; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev) >&2 || exit 1; \
	  else \
	    echo "make: clang with libFuzzer is missing: run 'sudo apt-get install clang libclang-rt-dev'" >&2; exit 1; \
	  fi; \
	fi

fuzz-replay: fuzz-tools
	$(MAKE) fuzz
	@for t in $(FUZZ_TARGETS); do \
	  files=$$(ls -d tests/fuzz/corpus/$$t/* tests/fuzz/crashes/$${t#fuzz_}_* 2>/dev/null); \
	  [ -n "$$files" ] || { echo "fuzz-replay: no inputs for $$t" >&2; exit 1; }; \
	  DJINN_DATA=$(abspath $(DATA)) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    $(FUZZ_BUILD)/bin/$$t -runs=1 $$files > $(FUZZ_BUILD)/replay_$$t.log 2>&1 \
	    || { tail -30 $(FUZZ_BUILD)/replay_$$t.log; echo "fuzz-replay: $$t FAILED" >&2; exit 1; }; \
	  echo "fuzz-replay: $$t: $$(echo "$$files" | wc -l) inputs, no crash, no UB, no leak"; \
	done

# Library sources get coverage instrumentation without libFuzzer's main; the targets link it.
$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

.SECONDEXPANSION:
$(FUZZ_BUILD)/bin/%: $(FUZZ_BUILD)/tests/fuzz/%.o $$(addprefix $(FUZZ_BUILD)/,$$(FUZZ_DEPS_$$*))
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer $(filter %.o,$^) -o $@ -lm -lpthread

$(FUZZ_BUILD)/bin/gen_seeds: $(FUZZ_BUILD)/tests/fuzz/gen_seeds.o $(addprefix $(FUZZ_BUILD)/,model.o tokenizer.o util.o)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer-no-link $^ -o $@ -lm -lpthread

fuzz-seeds: $(FUZZ_BUILD)/bin/gen_seeds
	mkdir -p $(addprefix tests/fuzz/corpus/,$(FUZZ_TARGETS))
	$< tests/fuzz/corpus
	python3 tests/fuzz/json_seeds.py $(DATA) tests/fuzz/corpus

fuzz-run: $(addprefix fuzz-run-,$(FUZZ_TARGETS))

# Per target: fuzz a scratch corpus (new units land there, the committed one is only read), then merge.
$(addprefix fuzz-run-,$(FUZZ_TARGETS)): fuzz-run-%: $(FUZZ_BUILD)/bin/%
	@rm -rf $(FUZZ_BUILD)/run/$* && mkdir -p $(FUZZ_BUILD)/run/$* $(FUZZ_BUILD)/crashes tests/fuzz/corpus/$*
	@echo "fuzz: $* for $(FUZZ_SECONDS) s, log in $(FUZZ_BUILD)/run/$*.log"
	@DJINN_DATA=$(abspath $(DATA)) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $< $(FUZZ_BUILD)/run/$* tests/fuzz/corpus/$* -max_total_time=$(FUZZ_SECONDS) -timeout=10 -max_len=$(FUZZ_MAXLEN_$*) \
	  -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/$*- \
	  $(if $(wildcard tests/fuzz/$*.dict),-dict=tests/fuzz/$*.dict) $(FUZZ_FLAGS) \
	  > $(FUZZ_BUILD)/run/$*.log 2>&1; rc=$$?; \
	  DJINN_DATA=$(abspath $(DATA)) $< -merge=1 tests/fuzz/corpus/$* $(FUZZ_BUILD)/run/$* \
	  > $(FUZZ_BUILD)/run/$*.merge.log 2>&1 || rc=1; \
	  $(if $(FUZZ_KEEP_UNDER_$*),find tests/fuzz/corpus/$* -type f ! -name 'seed_*' -size +$$(($(FUZZ_KEEP_UNDER_$*) - 1))c -delete;) \
	  echo "fuzz: $*: $$(grep -E '^#[0-9]+' $(FUZZ_BUILD)/run/$*.log | tail -1)"; \
	  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
	    $(FUZZ_BUILD)/run/$*.log | sed 's/^/fuzz: $*: /'; \
	  echo "fuzz: $*: committed corpus $$(ls tests/fuzz/corpus/$* | wc -l) files, $$(cat tests/fuzz/corpus/$*/* | wc -c) bytes"; \
	  if [ $$rc != 0 ]; then echo "fuzz: $*: FAILED (crash or error): see $(FUZZ_BUILD)/run/$*.log" >&2; exit 1; fi

-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)

# ---- bench: the CPU share's matvec (f16, q8, q4) against the host memory bandwidth, measured in the same run
.PHONY: bench-cpu-matvec
$(BUILD)/bin/cpu_matvec: $(BUILD)/bench/cpu_matvec.o $(BUILD)/bench/host_read.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

bench-cpu-matvec: $(BUILD)/bin/cpu_matvec
	$(BUILD)/bin/cpu_matvec $(CPU_MATVEC_JSON)

# ---- bench: a model of N layers from a donor's (bench/repeat_layers.c): real sizes the disk cannot hold in f16
$(BUILD)/bin/repeat_layers: $(BUILD)/bench/repeat_layers.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# ---- bench: the CPU share against a sweep of fixed shares, per rows in a pass (bench/share_sweep.c); GPU machine
$(BUILD)/bin/share_sweep: $(BUILD)/bench/share_sweep.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
