# Djinn build. `make` builds ./djinn and ./convert/convert (the converter's sources live in convert/, so its
# binary sits beside them); `make test` builds and runs the Criterion suite
# (installing libcriterion-dev first when missing and running as root); `make test SAN=1` runs it under
# ASan+UBSan; `make demo` converts and runs the tiny real model from $(DATA).

DATA ?= ../shared
CUDA ?= /usr/local/cuda
NVCC ?= $(CUDA)/bin/nvcc
CC ?= cc

SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD ?= build
SANFLAGS :=
endif

CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -pthread \
          -I$(CUDA)/include -MMD -MP $(SANFLAGS)
NVFLAGS := -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
           -Xcompiler -Wall,-Werror -MMD -MP
LDLIBS := -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lcublasLt -lcublas -lcudart -lstdc++ -lm -lpthread -ldl
LDFLAGS := $(SANFLAGS)

# Engine objects: every top-level .c except the CLI's main, plus kernels.cu.
ENGINE_SRC := $(filter-out djinn.c,$(wildcard *.c))
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o) $(BUILD)/kernels.o
# Converter objects: everything in convert/ except its main.
CONVERT_SRC := $(filter-out convert/main.c,$(wildcard convert/*.c))
CONVERT_OBJ := $(CONVERT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all test demo clean criterion fuzz

all: djinn convert/convert

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/kernels.o: kernels.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/bin/djinn: $(BUILD)/djinn.o $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bin/convert: $(BUILD)/convert/main.o $(CONVERT_OBJ) $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

djinn: $(BUILD)/bin/djinn
	cp $< $@

convert/convert: $(BUILD)/bin/convert
	cp $< $@

# ---- tests
# CRITERION=DIR: a Criterion unpacked in DIR (include/, lib/) instead of the system's, for machines that
# cannot install packages (the GPU machine).
CRITERION ?=
ifneq ($(CRITERION),)
TEST_CFLAGS := -I$(abspath $(CRITERION))/include
TEST_LIBS := -L$(abspath $(CRITERION))/lib -Wl,--disable-new-dtags,-rpath,$(abspath $(CRITERION))/lib
endif

criterion:
	@if [ -n "$(CRITERION)" ]; then \
	  [ -f "$(CRITERION)/include/criterion/criterion.h" ] || { echo "make: no Criterion in $(CRITERION)" >&2; exit 1; }; \
	elif [ ! -f /usr/include/criterion/criterion.h ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make: installing libcriterion-dev" >&2; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libcriterion-dev) >&2 || exit 1; \
	  else \
	    echo "make: Criterion is missing: run 'sudo apt-get install libcriterion-dev'" >&2; exit 1; \
	  fi; \
	fi

$(BUILD)/run_tests: $(TEST_OBJ) $(CONVERT_OBJ) $(ENGINE_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(TEST_LIBS) -lcriterion

$(TEST_OBJ): | criterion
$(TEST_OBJ): CFLAGS += $(TEST_CFLAGS)

# Tests find the shared data and the binaries under test through the environment.
test: criterion
	$(MAKE) $(BUILD)/run_tests $(BUILD)/bin/djinn $(BUILD)/bin/convert
	DJINN_DATA=$(abspath $(DATA)) DJINN_BIN=$(abspath $(BUILD))/bin \
	ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	$(BUILD)/run_tests --verbose $(TESTFLAGS)

# ---- the README's first command: convert the tiny real model and generate from it
demo: djinn convert/convert
	./convert/convert $(DATA)/models/stories260K stories260K.bin --dtype f32
	./djinn stories260K.bin -p "Once upon a time" -n 200 -t 0

clean:
	rm -rf build build-san djinn convert/convert stories260K.bin

-include $(shell find build build-san -name '*.d' 2>/dev/null)

# ---- bench
# Tokenizer throughput (MB/s) on ~1 MB of generated English with the real Llama tokenizers from $(DATA).
.PHONY: bench-tokenizer
bench-tokenizer: $(BUILD)/bin/bench_tokenizer
	$(BUILD)/bin/bench_tokenizer $(abspath $(DATA)) $(BUILD)/bench_tokenizer.json

$(BUILD)/bin/bench_tokenizer: $(BUILD)/bench/bench_tokenizer.o $(BUILD)/tokenizer.o $(BUILD)/util.o \
                              $(BUILD)/convert/tokjson.o $(BUILD)/convert/json.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lm -lpthread

# ---- bench: the hardware ceilings (HBM, PCIe, tensor cores) and the decode GEMV against them; GPU machine only
CEILINGS_JSON ?= $(BUILD)/ceilings.json
.PHONY: bench-ceilings
$(BUILD)/bench/ceilings.o: bench/ceilings.cu kernels.h util.h model.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/bin/ceilings: $(BUILD)/bench/ceilings.o $(BUILD)/kernels.o $(BUILD)/util.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

bench-ceilings: $(BUILD)/bin/ceilings
	$(BUILD)/bin/ceilings $(CEILINGS_JSON)
