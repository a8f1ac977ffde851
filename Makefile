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

# The main job: generation on the default model.
run: build
	./$(BUILD)/flashlm run -m $(MODEL) -p "$(PROMPT)" -n 128

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DFLM_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan
