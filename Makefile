# blpipe: Swift command-line tools that move bytes over Bluetooth LE through BlueZ.
#
#   make            release binaries in .build/bin
#   make test       unit and process tests (swift test), no Bluetooth needed
#   make check      make test, then the whole integration suite on the VM bench (real bluetoothd)
#   make demo       the main job on the VM bench: a request and its reply over real BlueZ
#   make bench      benchmarks: blframe against cat; blserve's cost per GATT call natively;
#                   blsend/blrecv and blserve on the bench
#   make bench-smoke  the bench's own smoke tests
#   make fuzz       the frame decoder under libFuzzer (FUZZ_SECONDS, default 300)
#   make install    PREFIX=/usr/local DESTDIR= : binaries, man pages, completions
#   make deps       install the Debian packages the build and tests need

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR = $(DESTDIR)$(PREFIX)/bin
MANDIR = $(DESTDIR)$(PREFIX)/share/man/man1
BASHDIR = $(DESTDIR)$(PREFIX)/share/bash-completion/completions
ZSHDIR = $(DESTDIR)$(PREFIX)/share/zsh/site-functions
FISHDIR = $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
FUZZ_SECONDS ?= 300

# Every tool is linked fully static, libdbus-1 (libdbus-1.a) included: a tool starts as fast as
# cat, without loading libsystemd and the seven libraries it brings. libdbus-1.a wants two
# functions of libsystemd, which Debian ships only shared; the link maps them onto
# CLinux's (Sources/CLinux/SdDaemon.c).
# The linker warns that libdbus-1.a's getpwuid_r, getpwnam_r, getgrouplist and getaddrinfo need
# glibc's shared NSS modules at run time; the build hides those lines. A client of the system
# bus reaches none of them: EXTERNAL authentication sends the uid as a number, user and group
# lookups are the server's side, and getaddrinfo serves tcp: addresses only.
TOOLS = blframe blscan blsend blrecv blserve
STATIC_LINK = -Xswiftc -static-executable \
	-Xlinker --defsym=sd_listen_fds=bl_sd_listen_fds -Xlinker --defsym=sd_is_socket=bl_sd_is_socket
# The toolchain on PATH, else the usual /opt/swift (sudo resets PATH to its secure_path).
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
SWIFT_RELEASE = $(SWIFT) build -c release --static-swift-stdlib

.PHONY: all build test check demo bench bench-smoke fuzz install uninstall deps clean

all: build

deps:
	scripts/install-deps

build: deps
	@mkdir -p .build
	{ $(SWIFT_RELEASE) --scratch-path .build/static $(STATIC_LINK) 2>&1; \
		echo $$? > .build/static-build-status; } | { grep -v "statically linked applications requires at runtime" || true; }
	@test "$$(cat .build/static-build-status)" = 0 || { echo "make: release build failed" >&2; exit 1; }
	mkdir -p .build/bin
	cp $(addprefix .build/static/release/,$(TOOLS)) .build/bin/

# The unit tests take 1-2 minutes; a test that hangs must fail the run, not stall it. timeout
# runs them in a process group of their own, which a Ctrl-C on the terminal does not reach:
# the signal is passed on to that group.
TEST_TIMEOUT ?= 900
test: deps
	$(SWIFT) build --build-tests
	bash -c 'timeout --kill-after=10 $(TEST_TIMEOUT) "$$@" & t=$$!; \
		trap "kill -TERM -- -$$t 2>/dev/null; wait $$t; exit 130" INT TERM HUP; wait $$t' \
		- $(SWIFT) test --skip-build --parallel

# Everything BLE runs in one VM boot against the real bluetoothd, with the release binaries.
BENCH_ENV = env BL_BIN=$(CURDIR)/.build/bin
# The suite (31 tests, boot included) takes 9-33 minutes under TCG on a 2-core host; tests are
# bounded at 200 s each. BENCH_DEADLINE (seconds since the epoch; .ci/run sets it to its own
# start + 45 minutes) shortens the VM's time so that a whole run, build, unit tests and the
# bench's first setup included, ends by then even when the suite hangs.
BENCH_TIMEOUT ?= 2400
BENCH_DEADLINE ?=

check: test build
	scripts/bench/setup
	@limit=$(BENCH_TIMEOUT); \
	if [ -n "$(BENCH_DEADLINE)" ]; then \
		left=$$(( $(BENCH_DEADLINE) - $$(date +%s) - 30 )); \
		[ "$$left" -ge "$$limit" ] || limit=$$left; \
		[ "$$limit" -gt 0 ] || { echo "make check: no time left before BENCH_DEADLINE for the bench" >&2; exit 1; }; \
	fi; \
	echo "scripts/bench/vm-run --adapters 4 --timeout $$limit -- $(BENCH_ENV) scripts/bench/run-integration --strict"; \
	scripts/bench/vm-run --adapters 4 --timeout "$$limit" -- $(BENCH_ENV) scripts/bench/run-integration --strict

demo: build
	scripts/bench/vm-run --adapters 2 --timeout 900 -- $(BENCH_ENV) examples/demo

bench-smoke:
	scripts/bench/check-smoke '0*'

# Every benchmark runs even when one before it missed a target (it then exits 1); bench-central
# and bench-blserve boot the VM themselves, with btmon and bluetoothd's debug log off (a
# production bluetoothd's setting), and use .build/bin. setup first: bench-calls needs its
# python3-dbus.
bench: build
	scripts/bench/setup
	@status=0; \
	for b in "scripts/bench-blframe .build/bin" "scripts/bench-calls .build/bin" scripts/bench-central scripts/bench-blserve; do \
		echo "$$b"; $$b || { echo "make bench: $$b missed a target or failed" >&2; status=1; }; \
	done; \
	exit $$status

fuzz: deps
	PATH="$(dir $(SWIFT)):$$PATH" scripts/fuzz $(FUZZ_SECONDS)

install: build
	install -d $(BINDIR) $(MANDIR) $(BASHDIR) $(ZSHDIR) $(FISHDIR)
	install -m 755 $(addprefix .build/bin/,$(TOOLS)) $(BINDIR)/
	install -m 644 $(addsuffix .1,$(addprefix man/,$(TOOLS))) $(MANDIR)/
	for t in $(TOOLS); do \
		install -m 644 completions/$$t.bash $(BASHDIR)/$$t && \
		install -m 644 completions/_$$t $(ZSHDIR)/_$$t && \
		install -m 644 completions/$$t.fish $(FISHDIR)/$$t.fish || exit 1; \
	done

uninstall:
	for t in $(TOOLS); do \
		rm -f $(BINDIR)/$$t $(MANDIR)/$$t.1 $(BASHDIR)/$$t $(ZSHDIR)/_$$t $(FISHDIR)/$$t.fish; \
	done

clean:
	rm -rf .build
