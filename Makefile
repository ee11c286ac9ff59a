# shardkv build entry points. CI runs these through .ci/run.

GO ?= go
BIN ?= bin

# Pinned tools, run from their Go modules (no prebuilt binaries).
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
KUBECTL ?= kubectl
# Extra flags for `make run-manager`, e.g. MANAGER_ARGS="--namespace=demo".
MANAGER_ARGS ?=

.PHONY: all run build test fuzz bench lint vet staticcheck tidy-check generate generate-proto generate-deepcopy manifests generate-check \
	install uninstall deploy undeploy run-manager clean test-e2e images cluster-up cluster-down bench-migration

all: build

## build: compile every package; binaries from cmd/*/ (node, kvctl, manager) go to $(BIN)/.
build:
	$(GO) build ./...
	@if ls -d cmd/*/ >/dev/null 2>&1; then \
		mkdir -p $(BIN) && echo "$(GO) build -o $(BIN)/ ./cmd/..." && $(GO) build -o $(BIN)/ ./cmd/...; \
	else \
		echo "build: no cmd/ directories yet, no binaries to build"; \
	fi

## run: build and start a whole local cluster (controller + 3 groups of 3
## replicas as child processes, data in ./data). Ctrl-C stops it; running it
## again resumes the same cluster. Pass flags with ARGS="--groups=4 ...".
run: build
	$(BIN)/node local $(ARGS)

## test: the full test suite (the README's test command). The operator's
## tests run against a real kube-apiserver + etcd (envtest): the binaries
## come from hack/setup-envtest.sh (built once, cached), whose last output
## line is their directory (KUBEBUILDER_ASSETS); its kubectl renders
## config/namespaced for the RBAC tests (and is the local cluster's too).
## The tests of spec.tls.mode CertManager run cert-manager's controller and
## CRDs, from hack/build-cert-manager.sh the same way
## (SHARDKV_CERT_MANAGER_DIR).
test:
	@out="$$(hack/setup-envtest.sh --with-kubectl)" || { echo "test: hack/setup-envtest.sh failed" >&2; exit 1; }; \
	assets="$$(printf '%s\n' "$$out" | tail -n 1)"; \
	out="$$(hack/build-cert-manager.sh)" || { echo "test: hack/build-cert-manager.sh failed" >&2; exit 1; }; \
	certmanager="$$(printf '%s\n' "$$out" | tail -n 1)"; \
	echo "KUBEBUILDER_ASSETS=$$assets SHARDKV_CERT_MANAGER_DIR=$$certmanager $(GO) test -race -count=1 -timeout 30m ./..."; \
	KUBEBUILDER_ASSETS="$$assets" SHARDKV_CERT_MANAGER_DIR="$$certmanager" SHARDKV_REQUIRE_ENVTEST=1 $(GO) test -race -count=1 -timeout 30m ./...
	@# Tests built only without the race detector (//go:build !race: 8 MiB
	@# values, and power cuts of badger in child processes, take minutes
	@# under it), and a pipeline's liveness under the shipped timeouts
	@# (checked only without it: see raceEnabled in pkg/resp).
	$(GO) test -count=1 -timeout 10m -run 'LargeValue' ./pkg/shardkv/
	$(GO) test -count=1 -timeout 5m -run 'TestPipelineExactlyOnce' ./pkg/resp/
	$(GO) test -count=1 -timeout 15m -run 'PowerCut|VlogSync' ./pkg/raftgroup/
	@# Power cuts of whole clusters (node processes on lazyfs mounts): one
	@# seeded run of each scenario, about a minute; SHARDKV_POWERCUT_RUNS
	@# and SHARDKV_POWERCUT_SEED for a campaign (docs/engine.md).
	$(GO) test -count=1 -timeout 15m -run 'PowerCut' ./pkg/node/

## fuzz: every Go fuzz target for FUZZTIME each (default 30s; CI runs
## this); a crash's input lands in the package's testdata/fuzz/.
FUZZTIME ?= 30s
fuzz:
	hack/fuzz.sh $(FUZZTIME)

## test-e2e: the end-to-end tests (e2e/, build tag e2e) on a real cluster.
## With KUBECONFIG unset: brings up hack/local-cluster.sh, builds and loads
## the images, runs every scenario, then wipes the cluster (hack/e2e.sh).
## With KUBECONFIG set: runs against that cluster (images preloaded).
test-e2e:
	hack/e2e.sh

## images: the shardkv image as a docker-save tarball, without Docker
## (hack/build-images.sh); `docker build -t shardkv:dev .` is the same image.
images:
	hack/build-images.sh shardkv

## cluster-up / cluster-down: the local single-node Kubernetes
## (hack/local-cluster.sh); cluster-down wipes all of its state.
cluster-up:
	hack/local-cluster.sh up

cluster-down:
	hack/local-cluster.sh down --wipe

## bench: engine and data-group benchmarks (tables in docs/benchmarks.md).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s -count 3 -timeout 60m ./pkg/raftgroup/ ./pkg/shardkv/

## bench-migration: one shard moved between two groups under load,
## stop-and-copy against pre-copy, for each key count (pkg/node
## TestMigrationBench; docs/benchmarks.md defines the columns). The
## SHARDKV_MIGRATION_BENCH_* environment sets the parameters, e.g.
## `SHARDKV_MIGRATION_BENCH_KEYS=20000 make bench-migration` for a quick
## run; the markdown table goes to SHARDKV_MIGRATION_BENCH_OUT (default
## bin/migration-bench.md).
SHARDKV_MIGRATION_BENCH_OUT ?= $(BIN)/migration-bench.md
bench-migration:
	@mkdir -p $(dir $(abspath $(SHARDKV_MIGRATION_BENCH_OUT)))
	SHARDKV_MIGRATION_BENCH=1 SHARDKV_MIGRATION_BENCH_OUT=$(abspath $(SHARDKV_MIGRATION_BENCH_OUT)) \
		$(GO) test -count=1 -timeout 240m -run '^TestMigrationBench$$' -v ./pkg/node/

## lint: go vet + staticcheck (pinned).
lint: vet staticcheck

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/

staticcheck:
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags e2e ./e2e/

## tidy-check: fail if go.mod/go.sum are not tidy (prints the diff).
tidy-check:
	$(GO) mod tidy -diff

## generate: regenerate every piece of checked-in generated code: the
## protobuf/gRPC code (pkg/shardkvpb), deepcopy methods (api/v1alpha1), and
## the manifests (CRDs and RBAC in config/). `make generate manifests` and
## `make generate` do the same.
generate: generate-proto generate-deepcopy manifests

## generate-check: regenerate everything and fail if the committed code
## differs (CI runs this; needs protoc 3.21.12, see hack/gen-proto.sh).
generate-check: generate
	@git diff --exit-code --stat -- pkg/shardkvpb api config || { \
		echo "generate-check: generated code is stale: run 'make generate' and commit the result" >&2; exit 1; }
	@untracked="$$(git ls-files --others --exclude-standard -- pkg/shardkvpb api config)"; \
	if [ -n "$$untracked" ]; then echo "generate-check: untracked generated files: $$untracked" >&2; exit 1; fi

# Needs protoc 3.21.12: apt-get install -y protobuf-compiler (Debian bookworm).
generate-proto:
	bash hack/gen-proto.sh

# Deepcopy methods of the operator's API types (api/v1alpha1).
generate-deepcopy:
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

## manifests: CRDs (config/crd/bases) and the operator's ClusterRole
## (config/rbac/role.yaml, from the +kubebuilder:rbac markers).
manifests:
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./api/...;./controllers/..." output:crd:artifacts:config=config/crd/bases

## install / uninstall: the CRDs into the current kubeconfig's cluster.
## Server-side apply: no last-applied annotation, whose 256 KiB limit large
## CRDs (with pod fields) outgrow.
install:
	$(KUBECTL) apply --server-side --force-conflicts -k config/crd

uninstall:
	$(KUBECTL) delete --ignore-not-found -k config/crd

## deploy / undeploy: CRDs, RBAC and the manager (namespace shardkv-system,
## image shardkv:dev; docs/operator.md).
deploy:
	$(KUBECTL) apply --server-side --force-conflicts -k config/default

undeploy:
	$(KUBECTL) delete --ignore-not-found -k config/default

## run-manager: run the operator on this machine against the current
## kubeconfig (CRDs installed with `make install`); it dials pods by IP.
run-manager:
	$(GO) run ./cmd/manager --dial-pod-ips $(MANAGER_ARGS)

clean:
	rm -rf $(BIN)
