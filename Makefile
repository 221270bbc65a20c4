# Discord-PXE. The README's two commands are `make run` and `make test`.
GO      ?= go
OUT     ?= out
DEPS    := tools/scripts/deps.sh
# Go test timeout per package. tools/e2e, the longest, took 16 minutes of make test's 24 in a
# clean-clone run on two cores (2026-12-02); make test should stay under 30 minutes.
TEST_TIMEOUT ?= 40m
# What `dpxe version` says for bin/dpxe.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo devel)

# `make run` options (docs/lab.md): nodes to PXE-boot, total shards, Discord's
# max_concurrency, and the nodes' firmware (bios: SeaBIOS + e1000, uefi:
# OVMF + virtio-net, mixed: both).
NODES           ?= 3
SHARDS          ?= 16
MAX_CONCURRENCY ?= 1
FIRMWARE        ?= mixed

# `make smoke` options: which paths (dpxe smoke --paths) and any other flags,
# e.g. SMOKE_FLAGS="--junit smoke.xml".
SMOKE_PATHS ?= all
SMOKE_FLAGS ?=

.PHONY: all build image smoke test test-scale bench run check fmt clean deps-build deps-smoke deps-test deps-bench deb

all: image

deps-build:
	@$(DEPS) build
deps-smoke:
	@$(DEPS) build smoke
deps-test:
	@$(DEPS) build test
deps-bench:
	@$(DEPS) build test bench

# The dpxe binary, and the Gateway emulator that `dpxe smoke` runs beside it
# for its netboot paths.
build:
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o bin/dpxe ./cmd/dpxe
	$(GO) build -o bin/gateway-emulator ./tools/cmd/gateway-emulator

# Assemble the kernel and write kernel.bin, netboot/, usb.img and manifest.json.
image: deps-build
	$(GO) run ./cmd/dpxe build --out $(OUT)

# Boot the images in QEMU on every path, as any user, the way CI does
# (docs/ci.md): self-tests on kernel.bin and usb.img under SeaBIOS and OVMF,
# and netboot through QEMU's user-mode network to a shard READY.
smoke: deps-smoke image build
	bin/dpxe smoke --out $(OUT) --paths $(SMOKE_PATHS) $(SMOKE_FLAGS)

# Static checks: formatting, vet, generated templ files up to date.
check:
	@tools/scripts/check.sh

# Everything: static checks, the images, then every Go test (unit, fuzz
# seeds, kernel self-tests and boot paths in QEMU, netboot in a namespace,
# browser tests). Tests share the images in $(OUT).
test: deps-test check image
	# One package at a time: QEMU boots, the browser and the emulator's heartbeat
	# timing do not share the two cores with each other.
	DPXE_OUT=$(abspath $(OUT)) $(GO) test -p 1 -timeout $(TEST_TIMEOUT) ./...

# The heaviest scale tests, kept out of `make test` for time.
test-scale: deps-test image
	DPXE_OUT=$(abspath $(OUT)) DPXE_SCALE=1 $(GO) test -p 1 -timeout 30m -run Scale ./...

# Benchmarks, side by side with peers where the issue asks for a ratio.
bench: deps-bench image
	DPXE_OUT=$(abspath $(OUT)) DPXE_BENCH=1 $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./...

# The whole system live on this machine: a lab network namespace, the Gateway
# emulator, dpxe serve (dashboard on http://127.0.0.1:8080) and NODES QEMU
# nodes that PXE-boot the kernel. Ctrl-C tears it all down. See docs/lab.md.
# Without root the QEMU packages may not install; the lab then says what is
# missing and simulates the nodes instead of failing here.
run: deps-build image
	@$(DEPS) build test || echo "make run: could not install the lab's packages (above); continuing, the lab says what is missing"
	NODES=$(NODES) SHARDS=$(SHARDS) MAX_CONCURRENCY=$(MAX_CONCURRENCY) FIRMWARE=$(FIRMWARE) \
		tools/scripts/run.sh

# The Debian package of dpxe (packaging/deb): the binary, the hardened
# dpxe-serve.service, /etc/dpxe/serve.json and the docs, into $(OUT)/deb.
deb:
	GO=$(GO) packaging/deb/build.sh $(OUT)/deb

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(OUT) bin
