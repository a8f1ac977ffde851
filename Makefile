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

# The main job: convert the default model to the flash layout, then generate through the flash path under a memory
# budget below the model's size, printing per-token statistics (flash I/O / memory / compute ms, bytes, reads).
run: build
	./$(BUILD)/flashlm convert $(MODEL) $(FLM)
	./$(BUILD)/flashlm run -m $(FLM) -p "$(PROMPT)" -n 48 -c 128 --mem 80% --stats

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DFLM_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan
