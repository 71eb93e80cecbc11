# fanwire: `make test` is what CI runs (.ci/run) and what a newcomer runs on
# a fresh machine. It installs what the tests need when it is missing, then
# vets, checks formatting and runs every test with the race detector.

GO       ?= go
FUZZTIME ?= 30s
PKGS     := ./...

# Debian packages the tests need: real servers (and Debian's own
# nats-server, older than the embedded one, as its users run it), a real
# browser, Node and npm (real third-party GraphQL clients), and Prometheus
# (its promtool runs the alert rules' unit tests; the dashboard's test
# starts the server).
APT_PKGS := redis-server nats-server postgresql chromium nodejs npm prometheus

# The npm fixtures the tests run, each pinned by its package-lock.json: the
# GraphQL clients, and what the JavaScript client's tests run with.
NPM_FIXTURES := gateway/testdata/graphqlws gateway/testdata/fanwirejs

.PHONY: test test-quick deps vet fmt-check generate-check rules-check unit fuzz fuzz-short security bench build loadtest

test: deps vet fmt-check generate-check rules-check unit fuzz-short

# test-quick is the edit-test loop: every package's tests with -short,
# which leaves out those that start PostgreSQL, Chromium, Node, fanwire or
# nats-server processes, NATS or Redis clusters, and the other slow ones
# (each says so when skipped), without the race detector: about a minute.
# It is not what CI runs: make test runs everything.
test-quick: deps
	$(GO) test -short -count=1 $(PKGS)

# deps installs missing system packages with apt-get (as root, or with sudo),
# then each npm fixture's node_modules with npm ci when it is missing
# (--include=dev: the fixtures' devDependencies even under NODE_ENV=production).
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	[ -x /usr/sbin/nats-server ] || missing="$$missing nats-server"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		if ! command -v apt-get >/dev/null 2>&1; then \
			echo "make deps: missing$$missing and no apt-get here: install them with your package manager" >&2; exit 1; \
		fi; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
		echo "make deps: installing$$missing"; \
		$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	fi; \
	for fx in $(NPM_FIXTURES); do \
		if [ ! -d $$fx/node_modules ]; then \
			echo "make deps: installing $$fx/node_modules (npm ci)"; \
			npm ci --prefix $$fx --include=dev --no-audit --no-fund || exit 1; \
		fi; \
	done

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# generate-check regenerates the gqlgen output from schema/*.graphqls and
# fails when that changed anything: the generated code was stale.
SCHEMA_SUM = { find schema -type f | LC_ALL=C sort; find schema -type f | LC_ALL=C sort | xargs cat; } | cksum
generate-check:
	@before=$$($(SCHEMA_SUM)); $(GO) generate ./schema || exit 1; \
	if [ "$$before" != "$$($(SCHEMA_SUM))" ]; then \
		echo "schema: the generated code was stale; 'go generate ./schema' has updated it: review and commit it" >&2; exit 1; fi

# rules-check checks the Prometheus alert rules users load as they are and
# runs their unit tests: each alert firing and not firing.
RULES := deploy/prometheus/fanwire-alerts.yml
rules-check:
	promtool check rules $(RULES)
	cd $(dir $(RULES)) && promtool test rules $(notdir $(RULES:.yml=.test.yml))

# unit runs the slowest packages' tests first: go test starts packages in
# the order they are named, two at a time here, and the gateway's (about
# 280 s) started last left one core idle at the end (460 s for the unit
# phase in that order, about 400 s in this one).
UNIT_FIRST := ./gateway ./cmd/fanwire
unit:
	$(GO) test -race -count=1 -timeout 15m $(UNIT_FIRST) $(PKGS)

# fuzz runs every fuzz target for FUZZTIME each (go test allows one target
# per run). The committed corpora under testdata/fuzz run in every `make test`.
# Each package's fuzzing test binary is built once, two packages at a time
# (go test -c -fuzz takes one package), then run per target in the
# package's directory (its corpus) with go test's own cache directory: a
# `go test -fuzz` per target rebuilt it every time, and listing the targets
# built every package's tests (1m56s of make test; now about a minute).
FUZZ_DIRS = $$(grep -l '^func Fuzz' $$(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go') | xargs -n1 dirname | sort -u)
fuzz:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	for dir in $(FUZZ_DIRS); do echo $$dir; done | \
		xargs -P 2 -I{} sh -c 'exec $(GO) test -c -fuzz=. -o "$$1/$$(echo {} | tr / _).test" ./{}' sh $$tmp || exit 1; \
	for dir in $(FUZZ_DIRS); do \
		pkg=$$($(GO) list ./$$dir) || exit 1; \
		bin=$$tmp/$$(echo $$dir | tr / _).test; \
		for f in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go); do \
			echo "== $$pkg $$f"; \
			(cd $$dir && $$bin -test.run '^$$' -test.fuzz "^$$f$$" -test.fuzztime $(FUZZTIME) \
				-test.fuzzcachedir "$$($(GO) env GOCACHE)/fuzz/$$pkg") || exit 1; \
		done; \
	done

# fuzz-short runs every fuzz target briefly (CI): beyond the committed
# corpora, which every `make test` runs, a few thousand new inputs each. A
# count, not a time: with -fuzztime 2s on a loaded machine, go test now and
# then fails a target with "context deadline exceeded" when the time runs
# out while a worker is busy (FuzzGraphQLClientMessage did, with no
# failing input).
fuzz-short:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=3000x

# security runs the security suite alone: every attack of the hardening
# reviews against a real fanwire ws process (cmd/fanwire/security*_test.go).
# `make test` runs it too, with every other test.
security: deps
	$(GO) test -race -count=1 -run '^TestSecurity' -v ./cmd/fanwire/

# bench runs the hot-path benchmarks 6 times for benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./gateway/ ./loadtest/ | tee bench.txt

build:
	$(GO) build -o fanwire ./cmd/fanwire

# loadtest builds the binary and measures a spawned `fanwire dev`.
loadtest: build
	./fanwire loadtest --spawn --clients 200 --events 20000 --size 256
	./fanwire loadtest --spawn --clients 2000 --events 2000 --size 256
