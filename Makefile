# Ursula build and test entry points. Run `make help` for the list.
#
# Needs Go 1.26 and, for the conformance suite, Node 20+ with npm. Every tool
# is built from a Go module pinned in go.mod or tests/tools/go.mod, and the
# conformance suite is installed from tests/conformance/package-lock.json.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
# One thing at a time: the machines this runs on have two cores.
.NOTPARALLEL:

GO ?= go
MODULE := github.com/ursula/ursula
BIN := $(CURDIR)/bin
TOOLS := -modfile=tests/tools/go.mod
TEST_TIMEOUT ?= 20m
# The release version stamped into every binary (internal/buildinfo).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS := -X $(MODULE)/internal/buildinfo.version=$(VERSION) -X $(MODULE)/internal/buildinfo.commit=$(COMMIT)

# Every binary: each directory under services/cmd and ops/cmd with a main.go.
CMDS := $(patsubst %/main.go,./%,$(sort $(wildcard services/cmd/*/main.go ops/cmd/*/main.go)))

# The container image of make image: ursula and ursulactl, statically
# linked for linux/IMAGE_ARCH into IMAGE_BIN, beside IMAGE_LINKS, the
# per-role names as symbolic links to ursula (which runs as the binary it
# is named as), then one archive (OCI layout and docker load format, the
# same links in /usr/local/bin) written by tests/tools/cmd/ursula-image.
# Reproducible: file and image times are SOURCE_DATE_EPOCH (default: the
# last commit's time).
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_BIN := $(BIN)/image/linux-$(IMAGE_ARCH)
IMAGE_CMDS := ./services/cmd/ursula ./ops/cmd/ursulactl
IMAGE_LINKS := ursula-backup ursula-coldgc ursula-gateway ursula-node
IMAGE := $(BIN)/ursula-image.tar
IMAGE_SOURCE ?= https://github.com/ursula/ursula
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

# Packages that run goroutines are tested with the race detector.
RACE_PKGS := $(addsuffix /...,$(addprefix ./,$(wildcard storage gateway services)))
# Test tiers under tests/ that need built binaries, npm or their own target.
TIER_RE := ^$(MODULE)/(storage|gateway|services|tests/(e2e|conformance|integration|chaos))(/|$$)

# Flags appended to bin/ursula by `make run`, e.g. ARGS='-raft.wal.fsync always'.
ARGS ?=
# A running server for `make conformance`, e.g. http://127.0.0.1:4437.
CONFORMANCE_TEST_URL ?=
CONFORMANCE_SUBSCRIPTIONS ?= 1
# Flags for the load generator, e.g. BENCH_ARGS='-duration 30s -streams 500'.
BENCH_ARGS ?=
# How long make test-chaos injects faults, and its go test -timeout.
CHAOS_DURATION ?= 10m
CHAOS_TIMEOUT ?= 60m
# The configuration files of make run-cluster.
LOCAL_CLUSTER := deploy/local-cluster

.PHONY: help build image run run-cluster generate verify lint test test-unit test-integration test-e2e \
	test-chaos-short test-chaos test-conformance test-deploy conformance conformance-deps bench clean

help: ## Show this help
	@printf 'Usage: make <target> [VAR=value]\n\nTargets:\n'
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z0-9_-]+:[^#]*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@printf '\nVariables:\n'
	@printf '  %-26s %s\n' \
		"ARGS=..." "extra flags for bin/ursula in make run" \
		"CONFORMANCE_TEST_URL=url" "make conformance runs against this server instead of spawning one" \
		"BENCH_ARGS=..." "flags for the load generator (go run ./tests/bench -h); with them make bench leaves docs/benchmarks.md alone" \
		"TEST_TIMEOUT=$(TEST_TIMEOUT)" "go test -timeout for each test step" \
		"IMAGE_ARCH=$(IMAGE_ARCH)" "GOARCH of make image (amd64 or arm64)" \
		"SOURCE_DATE_EPOCH=..." "time of make image's files (default: the last commit's)" \
		"CHAOS_DURATION=$(CHAOS_DURATION)" "how long make test-chaos injects faults" \
		"CHAOS_TIMEOUT=$(CHAOS_TIMEOUT)" "go test -timeout of make test-chaos"

build: ## Build every binary (ursula, ursula-node, ursula-gateway, ...) into bin/
	@if [ -z "$(CMDS)" ]; then echo "build: no main packages under services/cmd or ops/cmd" >&2; exit 1; fi
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ $(CMDS)

# -trimpath and fixed times make the same source give the same image bytes;
# -buildvcs=auto records the commit where git is there (buildinfo).
image: ## Build the container image bin/ursula-image.tar offline (static ursula and ursulactl, the per-role names as links to ursula, no base image; docker load < bin/ursula-image.tar)
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -buildvcs=auto \
		-ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_BIN)/ $(IMAGE_CMDS)
	for l in $(IMAGE_LINKS); do ln -sfn ursula $(IMAGE_BIN)/$$l; done
	$(GO) -C tests/tools build -o $(BIN)/ursula-image ./cmd/ursula-image
	$(BIN)/ursula-image -bin-dir $(IMAGE_BIN) -arch $(IMAGE_ARCH) -version '$(VERSION)' \
		-revision "$$(git rev-parse HEAD 2>/dev/null || true)" -source '$(IMAGE_SOURCE)' \
		-created '$(SOURCE_DATE_EPOCH)' -out $(IMAGE)

run: build ## Build, then run bin/ursula (all roles, one node, ./data, gateway on 127.0.0.1:4437)
	$(BIN)/ursula $(ARGS)

# Each process's output is prefixed with its name. Ctrl-C reaches every
# process (one terminal process group) and each shuts down gracefully (exit
# status 0); a SIGTERM to make is passed on; when a process fails, the
# others get SIGTERM.
run-cluster: build ## Build, then run a local 3-node cluster (data under ./data/node{1,2,3}, shared cold store ./data/cold, certificates ./data/pki) behind ursula-gateway on 127.0.0.1:4437, with ursula-coldgc and ursula-backup (hourly, into ./data/backups); Ctrl-C stops all
	@mkdir -p data/node1 data/node2 data/node3
	@$(BIN)/ursulactl cert dev-cluster --dir data/pki --nodes 3
	@pids=(); \
	trap 'trap - EXIT INT TERM; wait; exit 130' INT; \
	trap 'trap - EXIT INT TERM; kill -TERM "$${pids[@]}" 2>/dev/null || true; wait; exit 143' TERM; \
	trap 'kill -TERM "$${pids[@]}" 2>/dev/null || true; wait' EXIT; \
	for i in 1 2 3; do \
		$(BIN)/ursula-node -config $(LOCAL_CLUSTER)/node$$i.toml > >(sed -u "s/^/[node$$i] /") 2>&1 & \
		pids+=($$!); \
	done; \
	$(BIN)/ursula-gateway -config $(LOCAL_CLUSTER)/gateway.toml > >(sed -u 's/^/[gateway] /') 2>&1 & \
	pids+=($$!); \
	$(BIN)/ursula-coldgc -config $(LOCAL_CLUSTER)/coldgc.toml > >(sed -u 's/^/[coldgc] /') 2>&1 & \
	pids+=($$!); \
	$(BIN)/ursula-backup -config $(LOCAL_CLUSTER)/backup.toml > >(sed -u 's/^/[backup] /') 2>&1 & \
	pids+=($$!); \
	echo "run-cluster: nodes 1-3 on 127.0.0.1:4441-4443 (configs in $(LOCAL_CLUSTER), data in ./data/node{1,2,3});"; \
	echo "run-cluster: gateway on http://127.0.0.1:4437; Ctrl-C stops everything"; \
	status=0; wait -n || status=$$?; \
	if [ $$status -eq 0 ]; then wait; exit 0; fi; \
	echo "run-cluster: a process failed (exit status $$status); stopping the others" >&2; \
	exit 1

bin/buf: tests/tools/go.mod tests/tools/go.sum
	$(GO) build $(TOOLS) -o $@ github.com/bufbuild/buf/cmd/buf

bin/staticcheck: tests/tools/go.mod tests/tools/go.sum
	$(GO) build $(TOOLS) -o $@ honnef.co/go/tools/cmd/staticcheck

# The S3-compatible server the object-store tests run against (storage/objstore/objstoretest).
bin/versitygw: tests/tools/go.mod tests/tools/go.sum
	$(GO) build $(TOOLS) -o $@ github.com/versity/versitygw/cmd/versitygw

bin/gojq: tests/tools/go.mod tests/tools/go.sum
	$(GO) build $(TOOLS) -o $@ github.com/itchyny/gojq/cmd/gojq

# grpcurl for the gRPC e2e test (tests/e2e TestGRPCurlFreshNode) and docs/grpc.md.
bin/grpcurl: tests/tools/go.mod tests/tools/go.sum
	$(GO) build $(TOOLS) -o $@ github.com/fullstorydev/grpcurl/cmd/grpcurl

generate: bin/buf ## Regenerate proto/gen from proto/, and the OpenAPI documents (services/node/openapi/admin.json, gateway/openapi.json) (offline: buf and the protoc plugins are pinned Go tools)
	bin/buf generate
	bin/buf generate --template buf.gen.admin.yaml --path proto/ursula/admin
	$(GO) run ./internal/openapigen

verify: generate ## Fail on stale proto/gen or OpenAPI documents, gofmt, go vet, an untidy go.mod, or an import that breaks the layering of docs/architecture.md
	@gen="proto/gen services/node/openapi/admin.json gateway/openapi.json"; \
	if ! git diff --quiet -- $$gen || [ -n "$$(git ls-files --others --exclude-standard -- $$gen)" ]; then \
		git status --short -- $$gen; \
		echo "verify: generated files differ from what make generate produces; commit the regenerated files" >&2; exit 1; \
	fi
	@files=$$(git ls-files --cached --others --exclude-standard -- '*.go' | xargs -r gofmt -l); \
	if [ -n "$$files" ]; then echo "verify: gofmt -w needed on:" >&2; echo "$$files" >&2; exit 1; fi
	$(GO) vet ./...
	$(GO) test -count=1 ./tests/layering/
	$(GO) mod tidy -diff
	cd tests/tools && $(GO) mod tidy -diff

lint: bin/buf bin/staticcheck ## Lint the protos (buf lint) and the Go code (go vet, staticcheck)
	bin/buf lint
	$(GO) vet ./...
	bin/staticcheck ./...

# Every target that runs Go tests: they depend on bin/versitygw, and the
# object-store test harness (storage/objstore/objstoretest) finds it through
# VERSITYGW.
GO_TEST_TARGETS := test-unit test-integration test-e2e test-chaos-short test-chaos test-conformance
$(GO_TEST_TARGETS): export VERSITYGW := $(BIN)/versitygw

test: test-unit test-integration test-e2e test-chaos-short test-conformance test-deploy ## Run every test: unit (race), integration, e2e, short chaos, conformance, deployment
	@echo "make test: all test tiers passed"

test-unit: bin/versitygw ## Unit tests and fuzz seed corpora; -race on storage/, gateway/, services/
	@if [ -n "$(RACE_PKGS)" ]; then \
		echo "$(GO) test -race $(RACE_PKGS)"; \
		$(GO) test -race -timeout $(TEST_TIMEOUT) $(RACE_PKGS); \
	fi
	@pkgs=$$($(GO) list ./... | { grep -Ev '$(TIER_RE)' || true; }); \
	if [ -n "$$pkgs" ]; then \
		echo "$(GO) test <every other package>"; \
		$(GO) test -timeout $(TEST_TIMEOUT) $$pkgs; \
	fi

test-integration: bin/versitygw ## In-process cluster tests (tests/integration), with -race
	@if [ -d tests/integration ]; then \
		echo "$(GO) test -race ./tests/integration/..."; \
		$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./tests/integration/...; \
	else \
		echo "test-integration: tests/integration does not exist yet: no integration tests to run"; \
	fi

test-e2e: build bin/versitygw bin/gojq bin/grpcurl ## Spawned-binary tests (tests/e2e): durability under SIGKILL/SIGTERM, a wiped node rejoining, peers of another cluster, a rolling upgrade across two builds (the test builds ursula-node -tags featuretest itself)
	URSULA_BIN=$(BIN)/ursula URSULA_BIN_DIR=$(BIN) $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) ./tests/e2e/...

# The deployment tests live in the tests/tools module (Helm and the
# Kubernetes API types stay out of the product's go.mod); they check the
# rendered configuration files with the binaries of make build.
test-chaos-short: build bin/versitygw ## Short chaos run (about 90 s, part of make test): 3-node cluster, kills, power losses of one node and partitions, history checked
	URSULA_BIN_DIR=$(BIN) $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) ./tests/chaos/...

test-chaos: build bin/versitygw ## Long chaos run: faults for CHAOS_DURATION (default 10m), then the same checks
	URSULA_BIN_DIR=$(BIN) URSULA_CHAOS_DURATION=$(CHAOS_DURATION) \
		$(GO) test -count=1 -v -timeout $(CHAOS_TIMEOUT) -run TestChaos ./tests/chaos/...

test-conformance: build bin/versitygw conformance-deps ## Official conformance suite (338 tests) against bin/ursula and against a 3-node cluster behind ursula-gateway
	URSULA_BIN=$(BIN)/ursula URSULA_BIN_DIR=$(BIN) $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) ./tests/conformance/...

# The deployment tests live in the tests/tools module (heavy third-party
# loaders stay out of the product's go.mod). They read make image's archive
# and binaries.
test-deploy: build image bin/versitygw ## Deployment tests (tests/tools/deploy): the Helm chart (linted, rendered, decoded strictly, schema, configuration files), the image (contents, binaries run, reproducible), deploy/compose (loaded, and run as processes), the systemd units (systemd-analyze)
	cd tests/tools && URSULA_BIN_DIR=$(BIN) URSULA_IMAGE=$(IMAGE) URSULA_IMAGE_BIN_DIR=$(IMAGE_BIN) URSULA_IMAGE_ARCH=$(IMAGE_ARCH) \
		URSULA_IMAGE_CREATED='$(SOURCE_DATE_EPOCH)' VERSITYGW=$(BIN)/versitygw \
		$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./deploy/... ./imagebuild/...

conformance: ## Conformance suite against CONFORMANCE_TEST_URL (a running server) if set, else as test-conformance
ifneq ($(CONFORMANCE_TEST_URL),)
conformance: conformance-deps
	cd tests/conformance && CONFORMANCE_TEST_URL='$(CONFORMANCE_TEST_URL)' \
		CONFORMANCE_SUBSCRIPTIONS='$(CONFORMANCE_SUBSCRIPTIONS)' npx --no-install vitest run
else
conformance: test-conformance
endif

conformance-deps: tests/conformance/node_modules/.package-lock.json

tests/conformance/node_modules/.package-lock.json: tests/conformance/package.json tests/conformance/package-lock.json
	@command -v npm >/dev/null || { echo "conformance: needs Node 20+ and npm on PATH" >&2; exit 1; }
	cd tests/conformance && npm ci --no-audit --no-fund
	@touch $@

# Only a full run (no BENCH_ARGS) rewrites docs/benchmarks.md: a shortened
# run's figures must not replace a clean run's. Put -report FILE in
# BENCH_ARGS to render one elsewhere.
bench: build bin/versitygw ## Load benchmarks (not in make test; about 13–20 min on 2 cores): bin/ursula with fsync never and always (local-directory cold store), then with S3 (versitygw), a 3-node cluster behind ursula-gateway, a null server and the Node reference server (npm ci into bin/node-peer), mixed load, and the cardinality sweep to 1M streams; without BENCH_ARGS writes docs/benchmarks.md and docs/img/bench-*.svg
	$(GO) build -o $(BIN)/ursula-bench ./tests/bench
	VERSITYGW=$(BIN)/versitygw $(BIN)/ursula-bench -server $(BIN)/ursula -peers node $(if $(BENCH_ARGS),,-report docs/benchmarks.md) $(BENCH_ARGS)

clean: ## Remove bin/ and the conformance suite's node_modules (never ./data)
	rm -rf $(BIN) tests/conformance/node_modules
