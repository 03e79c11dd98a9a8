# Airlock's build, generation, verification and demo targets. Every verify
# target has a fix target beside it (lint/fmt, generate-check/generate).
# Tools (buf, protoc-gen-go, protoc-gen-go-grpc, grpc-health-probe, benchstat)
# are pinned in tools/go.mod and run with `go tool`, so nothing is installed
# outside the Go module cache.

SHELL := bash
GO    ?= go
TOOL  := $(GO) tool -modfile=tools/go.mod
BIN   := bin
PKGS  := ./...
GOTESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: all build runtimes vm bench generate generate-check lint fmt vet test unit e2e test-cgroup2 test-chart demo clean mcp-inspector

all: build

## build: the airlock CLI, the three services, the OCI runtimes and the reference OCI registry (dev up --registry) into bin/
build: runtimes vm
	$(GO) build -o $(BIN)/ ./cmd/airlock ./services/authority/cmd/authority ./services/executor/cmd/executor ./services/publisher/cmd/publisher
	$(GO) build -modfile=tools/go.mod -o $(BIN)/registry github.com/distribution/distribution/v3/cmd/registry

## vm: the vm class's runtime and guest agent (static) into bin/, and its guest kernel (apt
## downloads Debian's linux-image-amd64, cached in /var/cache/airlock-vm)
vm:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./services/executor/cmd/airlock-vm ./services/executor/cmd/airlock-guest
	@# Without a kernel the vm class is unavailable, saying why, and runc
	@# and runsc still work.
	@$(BIN)/airlock-vm kernel fetch || echo "make vm: no guest kernel for the vm class (see above); runc and runsc are unaffected" >&2

## runtimes: runc (seccomp) and static runsc from the versions pinned in tools/sandbox
runtimes:
	bash tools/sandbox/build.sh $(BIN)

## generate: regenerate Go code from proto/ with local plugins
generate:
	$(TOOL) buf generate

## generate-check: fail if the committed generated code is stale
generate-check: generate
	@git diff --exit-code --stat -- proto/ || { echo "generated code is stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto/)" || { git status --porcelain -- proto/; echo "untracked generated files: run 'make generate' and commit"; exit 1; }

## lint: buf lint and format, gofmt, go vet (fix with 'make fmt')
lint: vet
	$(TOOL) buf lint
	$(TOOL) buf format --diff --exit-code
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }

## fmt: rewrite Go and proto files in the house format
fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')
	$(TOOL) buf format -w

vet:
	$(GO) vet $(PKGS)

## test: everything CI runs: lint, generated-code check, all tests with -race (as root: the sandbox tests use real namespaces and cgroups), then the cgroup-v2 VM suite (test-cgroup2)
# The PostgreSQL store tests take their database from AIRLOCK_TEST_POSTGRES_DSN,
# which .ci/run sets to a throwaway loopback cluster; without it they skip,
# and with CI=true they fail.
test: lint generate-check runtimes vm mcp-inspector
	$(GO) test $(GOTESTFLAGS) $(PKGS)
	$(MAKE) --no-print-directory test-cgroup2

## mcp-inspector: the MCP Inspector pinned in tools/mcpinspector/package-lock.json, installed once with npm ci into ~/.cache/airlock-test/mcpinspector (test/e2e/mcp_test.go drives airlock mcp with its CLI mode; needs Debian's nodejs and npm)
mcp-inspector:
	@bash tools/mcpinspector/install.sh >/dev/null

## unit: tests without the end-to-end suite
unit: runtimes vm
	$(GO) test $(GOTESTFLAGS) $$($(GO) list ./... | grep -v /test/e2e)

## e2e: the end-to-end suite against the real binaries
e2e: runtimes vm mcp-inspector
	$(GO) test $(GOTESTFLAGS) ./test/e2e/...

## test-cgroup2: the cgroup tests of the sandbox package and an end-to-end smoke in a cgroup-v2-only QEMU machine (TCG) on this machine's root filesystem (tools/cgroup2vm; as root)
test-cgroup2: build
	bash tools/cgroup2vm/suite.sh

## test-chart: a real kube-apiserver on Debian's etcd validates every object the Helm chart renders (server-side dry-run, strict fields; deploy/apiserver_test.go). Not part of `make test`: kube-apiserver is built from the Go module proxy on first use (tools/kubeapiserver, ~15 minutes cold) and cached in ~/.cache/airlock-test; etcd-server is installed if missing (as root)
test-chart:
	@command -v etcd >/dev/null || { echo "installing: etcd-server"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; }; }
	kas=$$(bash tools/kubeapiserver/build.sh) && \
		AIRLOCK_KUBE_APISERVER=$$kas $(GO) test -tags apiserver -count=1 -timeout 15m -run TestChartServerDryRun -v ./deploy/

## bench: raw `runc run` vs the sandbox vs the whole submit→result path, `true` as a session exec (RunExec, and StartExec+WatchExec) vs a job vs raw `runc exec`, a 20-step agent loop in one session vs 20 jobs, `airlock job submit --wait -- true` run as the CLI binary vs the job's own time (cli/job), a publish vs the same change landed with git alone, the content scan's MB/s, making, changing and removing an allow job's network, the egress proxy's connect latency and 100 MB download vs an allow-CIDR policy, a 100 MB download and small HTTPS requests through a brokered credential's intercepting proxy vs a spliced one, 8 clients submitting `true` jobs at once (jobs/s, the authority's and the executor's CPU per job, SubmitJob's latency; docs/performance.md has the figures from before revisions resolved in-process), 24 clients on a fleet of 1 and of 3 executors (jobs/s, the authority's CPU per job, placement latency p50 and p99 from its metrics), one revision's resolution by branch, by SHA and by the four git processes it took before, a sandbox on an image vs on the host template, the first job on an uncached 280 MB image vs podman pull and skopeo copy of it (installed if missing), and a job on a cached image vs on the host template, boot-to-exit of `true` in runc vs runsc vs the vm class (benchstat -col /via or /on bench.out for the ratios); benchstat summarizes
# -p 1: one package at a time, so neither runs under the other's load (two
# cores here); the ratios are between benchmarks of one run.
BENCHCOUNT ?= 6
bench: runtimes vm
	$(GO) test -p 1 -run '^$$' -bench 'RawRuncTrue|SandboxTrue|SandboxImageTrue|EndToEnd|Publish$$|RawGitPublish' -benchtime 50x -count $(BENCHCOUNT) -timeout 60m \
		./services/executor/internal/sandbox ./test/e2e | tee bench.out
	$(GO) test -p 1 -run '^$$' -bench 'ExecTrue|SessionTrue' -benchtime 30x -count $(BENCHCOUNT) -timeout 60m \
		./services/executor/internal/sandbox ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'ColdStart' -benchtime 20x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'AgentLoop20' -benchtime 2x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'CLISubmitWait' -benchtime 20x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'Check10MBPatch' -benchtime 2x -count 3 -timeout 30m ./pkg/contentcheck | tee -a bench.out
	$(GO) test -run '^$$' -bench 'AllowNet|Apply$$|RulesTransaction' -benchtime 40x -count $(BENCHCOUNT) -timeout 30m ./services/executor/internal/netpolicy | tee -a bench.out
	$(GO) test -run '^$$' -bench 'Egress' -benchtime 1s -count $(BENCHCOUNT) -timeout 30m ./services/executor/internal/runs | tee -a bench.out
	$(GO) test -run '^$$' -bench 'Download100MB' -benchtime 3x -count $(BENCHCOUNT) -timeout 30m ./services/executor/internal/egressproxy | tee -a bench.out
	$(GO) test -run '^$$' -bench 'SmallRequests' -benchtime 2000x -count $(BENCHCOUNT) -timeout 30m ./services/executor/internal/egressproxy | tee -a bench.out
	$(GO) test -run '^$$' -bench 'Submit8' -benchtime 80x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'BenchmarkFleet$$' -benchtime 96x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'ClassTrue' -benchtime 10x -count $(BENCHCOUNT) -timeout 60m ./services/executor/internal/sandbox | tee -a bench.out
	$(GO) test -run '^$$' -bench 'Resolve' -benchtime 40x -count $(BENCHCOUNT) -timeout 30m ./services/authority/internal/source | tee -a bench.out
	@for p in podman skopeo; do command -v $$p >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman skopeo; break; }; done
	$(GO) test -run '^$$' -bench 'ImagePull' -benchtime 2x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(GO) test -run '^$$' -bench 'ImageJob' -benchtime 30x -count $(BENCHCOUNT) -timeout 60m ./test/e2e | tee -a bench.out
	$(TOOL) benchstat bench.out

## demo: the product's main job on one machine with embedded defaults
demo: build
	./test/demo.sh

clean:
	rm -rf $(BIN)
