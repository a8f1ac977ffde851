# Convenience wrapper around CMake; see README.md. `make run` and `make test` are the quick start.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
MODEL ?= ../shared/models/stories260K/stories260K.gguf
PROMPT ?= Once upon a time

.PHONY: all deps build run test asan clean
all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

FLM = $(BUILD)/$(basename $(notdir $(MODEL))).flm
TEXT ?= ../shared/text/tinystories_sample.txt

# The main job, the paper's method end to end on the default model: convert it to the flash layout, calibrate its
# predictors, generate with --mode sparse printing per-token statistics (flash I/O / memory / compute ms, neurons
# predicted / read / reused), then measure naive, hybrid and sparse side by side.
run: build
	./$(BUILD)/flashlm convert $(MODEL) $(FLM) --force
	./$(BUILD)/flashlm calibrate $(FLM) --text $(TEXT) --sparsity 0.2 --chunk 64
	./$(BUILD)/flashlm run -m $(FLM) -p "$(PROMPT)" -n 48 -c 128 --mode sparse --window 2 --stats
	./$(BUILD)/flashlm bench -m $(FLM) --modes ram,naive,predictor-only,sparse --window 2 --mem 0 --gen-tokens 32

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DFLM_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan
