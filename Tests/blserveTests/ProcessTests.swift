import XCTest
import Glibc
import BLBlueZ
import BLCommand
import BLDBus
import BLTestSupport

/// The built blserve as a process: exit statuses and messages, and a whole life against the
/// stand-in bluetoothd on a private bus (DBUS_SYSTEM_BUS_ADDRESS points blserve there).
final class ProcessTests: XCTestCase {
    private var loop: EventLoop!
    private var children: ChildProcesses!
    private var bus: BusFixture?

    override func setUpWithError() throws {
        loop = EventLoop()
        children = try ChildProcesses(loop: loop)
    }

    override func tearDown() {
        children?.terminateAll(signal: SIGKILL, grace: 1)
        children = nil
        loop = nil
        bus?.stop()
        bus = nil
    }

    private var blserve: String { productsDirectory.appendingPathComponent("blserve").path }

    /// Starts blserve; its stderr is collected into `stderr`.
    /// Starts blserve with `args`; `ignoring` signals it starts with ignored (as `nohup` does).
    private func start(_ args: [String], busAddress: String, ignoring: [String] = [],
                       environment: [(String, String)] = []) throws -> (Subprocess, () -> String) {
        // env, not sh's trap: a shell may not ignore SIGCHLD.
        let argv = ignoring.isEmpty ? [blserve] + args : ["env", "--ignore-signal=" + ignoring.joined(separator: ","), blserve] + args
        let child = try children.spawn(argv, environment: [("DBUS_SYSTEM_BUS_ADDRESS", busAddress)] + environment,
                                       stdin: .null, stdout: .null, stderr: .pipe)
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        var token: WatchToken?
        token = loop.watch(fd: child.stderrFD, events: .readable) { [loop] _ in
            let n = (try? buffer.withUnsafeMutableBytes { try FileIO.read(child.stderrFD, into: $0) }) ?? 0
            if n > 0 { text += buffer[0..<n] } else if let token { loop?.remove(token) }
        }
        return (child, { String(decoding: text, as: UTF8.self) })
    }

    /// A shell fragment for a handler that has read its body into `b`: for the body "slow",
    /// it writes its pid to `pidFile` and sleeps a minute.
    private func slowWhenAsked(_ pidFile: String) -> String {
        "[ \"$b\" = slow ] && \(writingPID(to: pidFile)) && exec sleep 60"
    }

    /// Writes a "slow" request from `device` and returns the pid of its handler (see
    /// ``slowWhenAsked(_:)``) once it runs.
    private func startSlowHandler(_ bluez: FakeBluetoothd, from device: String, pidFile: String) -> pid_t? {
        _ = bluez.write(Array("T0000004slow".utf8), from: device)
        var pid: pid_t?
        XCTAssertTrue(loop.run(until: {
            pid = readPID(pidFile)
            return pid != nil
        }, timeout: 10), "the slow handler did not start")
        return pid
    }

    /// Process `pid` (gone, or a zombie left to whoever inherited it) ends within 3 s; killed
    /// if it does not.
    private func assertEnds(_ pid: pid_t?, _ message: String, file: StaticString = #filePath, line: UInt = #line) {
        guard let pid else { return }
        XCTAssertTrue(loop.run(until: { !isAlive(pid) }, timeout: 3), message, file: file, line: line)
        if isAlive(pid) { kill(pid, SIGKILL) }
    }

    private func finish(_ child: Subprocess, timeout: Double = 10) -> ProcessStatus? {
        _ = loop.run(until: { child.status != nil }, timeout: timeout)
        return child.status
    }

    func testUsageAndStartupErrors() throws {
        let noBus = "unix:path=/nonexistent/blserve-test-bus"
        var (child, stderr) = try start([], busAddress: noBus)
        XCTAssertEqual(finish(child), .exited(64))
        XCTAssertEqual(stderr(), "blserve: missing COMMAND to run; try 'blserve --help'\n")

        (child, stderr) = try start(["--mode", "raw", "--reply", "push", "cat"], busAddress: noBus)
        XCTAssertEqual(finish(child), .exited(64))
        XCTAssertTrue(stderr().contains("--reply is for frame mode"), stderr())

        (child, stderr) = try start(["no-such-handler-blpipe"], busAddress: noBus)
        XCTAssertEqual(finish(child), .exited(69))
        XCTAssertEqual(stderr(), "blserve: no-such-handler-blpipe: command not found\n")

        (child, stderr) = try start(["/etc/passwd"], busAddress: noBus)
        XCTAssertEqual(finish(child), .exited(69))
        XCTAssertEqual(stderr(), "blserve: /etc/passwd: permission denied\n")

        (child, stderr) = try start(["cat"], busAddress: noBus)
        XCTAssertEqual(finish(child), .exited(69))
        XCTAssertTrue(stderr().hasPrefix("blserve: cannot connect to the system bus"), stderr())

        // A bus without bluetoothd.
        let bus = try BusFixture()
        self.bus = bus
        (child, stderr) = try start(["cat"], busAddress: bus.address)
        XCTAssertEqual(finish(child), .exited(69))
        XCTAssertTrue(stderr().contains("bluetoothd is not running"), stderr())
    }

    /// A signal ends it cleanly (0, as `systemctl stop` expects) while it waits for a system bus
    /// that does not answer.
    func testSignalWhileTheBusSaysNothing() throws {
        if let problems = try silentBusProblems("blserve", ["cat"], status: 0) { XCTFail(problems) }
        // The bus's queue of connections full: connect() blocks, and the signal ends it.
        if let problems = try silentBusProblems("blserve", ["cat"], status: 143, full: true) { XCTFail(problems) }
    }

    /// examples/seed000-handler answers like the seed 000 server (no network needed for these).
    func testSeedHandlerExample() throws {
        let handler = packageRoot.appendingPathComponent("examples/seed000-handler").path
        func run(_ code: String, _ input: String) throws -> String {
            let child = try children.spawn([handler], environment: [("BL_CODE", code)], stdin: .pipe, stdout: .pipe, stderr: .null)
            do {
                try FileIO.writeAll(child.stdinFD, input)
            } catch {
                // The handler may answer without reading its input (an unsupported code):
                // allowed, and blserve ignores EPIPE in the same way. Nothing else is.
                XCTAssertEqual(error, .pipe)
            }
            child.closeStdin()
            let out = readPipe(child.stdoutFD, on: loop, timeout: 20)
            XCTAssertNotNil(out, "the handler's stdout did not end")
            XCTAssertEqual(finish(child), .exited(0))
            return String(decoding: out ?? [], as: UTF8.self)
        }
        XCTAssertEqual(try run("T", "こんにちは"), "あなたは「こんにちは」と言いました")
        // Every byte of what was said, a NUL and trailing newlines too.
        XCTAssertEqual(try run("T", "a\u{0}b\n\n"), "あなたは「a\u{0}b\n\n」と言いました")
        XCTAssertEqual(try run("U", "file:///etc/passwd"), "error: not an http(s) URL: file:///etc/passwd")
        XCTAssertTrue(try run("U", "http://127.0.0.1:1/x").hasPrefix("error: could not download http://127.0.0.1:1/x"))
        XCTAssertEqual(try run("I", "x"), "error: unsupported request code I")
    }

    /// Stream mode's one COMMAND ending: 0 when it succeeded (its output was sent), 1 when it
    /// failed, and blserve unregisters either way.
    func testStreamModeEndsWithItsCommand() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        for (script, status) in [("printf tick; exit 3", Int32(1)), ("printf tick", 0)] {
            let (child, stderr) = try start(["-n", "stream", "--mode", "stream", "--", "sh", "-c", script], busAddress: bus.address)
            XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") || !bluez.applications.isEmpty }, timeout: 10), stderr())
            let owner = try XCTUnwrap(bluez.applications.keys.first?.dropLast("/org/blpipe/blserve".count))
            try bluez.watchNotifications(of: String(owner))
            // COMMAND starts when a central subscribes.
            try bluez.setConnected(FakeBluetoothd.device(1), true)
            try bluez.startNotify()
            XCTAssertEqual(finish(child), .exited(status), "\(script): \(stderr())")
            XCTAssertTrue(loop.run(until: { bluez.notifications.joined().count >= 4 }, timeout: 2))
            XCTAssertEqual(String(decoding: bluez.notifications.joined(), as: UTF8.self), "tick", script)
            bluez.clearNotifications()
            XCTAssertTrue(bluez.applications.isEmpty, "\(script): the application is still registered")
            if status != 0 {
                XCTAssertTrue(stderr().contains("exit status 3"), stderr())
                XCTAssertEqual(stderr().filter { $0 == "\n" }.count, 1, stderr())
            }
        }
    }

    /// Started with SIGINT ignored (a background job, `nohup`), blserve leaves it so: SIGINT does
    /// not stop it, its handlers start with it ignored, and SIGTERM still stops it. Started with
    /// SIGHUP and SIGCHLD ignored too, it still learns how its handlers ended, and they start
    /// with those at their defaults.
    func testSignalsIgnoredAtStartStayIgnored() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        let (child, stderr) = try start(["-v", "--", "sh", "-c", "b=$(cat); [ \"$b\" = fail ] && exit 3; grep '^SigIgn' /proc/self/status"],
                                        busAddress: bus.address, ignoring: ["INT", "HUP", "CHLD"])
        XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") }, timeout: 10), stderr())
        // Without --name, the advertisement carries the host name (up to its first dot).
        XCTAssertEqual(bluez.advertisements.values.first?["LocalName"]?.string, LEAdvertisement.defaultLocalName())
        let owner = try XCTUnwrap(bluez.applications.keys.first?.dropLast("/org/blpipe/blserve".count))
        try bluez.watchNotifications(of: String(owner))
        child.signal(SIGINT)
        _ = loop.run(until: { child.status != nil }, timeout: 1)
        XCTAssertNil(child.status, "SIGINT, ignored at start, stopped blserve: \(stderr())")

        let a = FakeBluetoothd.device(1)
        _ = bluez.write(Array("T0000001x".utf8), from: a)
        var reply: [UInt8] = []
        XCTAssertTrue(loop.run(until: { reply += bluez.readAll(from: a); return reply.count > 8 && reply.last == 0x0A }, timeout: 10))
        let text = String(decoding: reply.dropFirst(8), as: UTF8.self)
        let mask = UInt64(text.split(separator: "\t").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "", radix: 16)
        XCTAssertNotNil(mask, text)
        XCTAssertEqual((mask ?? 0) & (1 << (SIGINT - 1)), 1 << (SIGINT - 1), "the handler does not ignore SIGINT: \(text)")
        for signo in [SIGTERM, SIGHUP, SIGCHLD, SIGPIPE] {
            XCTAssertEqual((mask ?? 0) & (1 << (signo - 1)), 0, "the handler ignores signal \(signo): \(text)")
        }
        _ = bluez.write(Array("T0000004fail".utf8), from: a)
        XCTAssertTrue(loop.run(until: { stderr().contains("T 4 bytes: failed (exit status 3)") }, timeout: 10), stderr())

        child.signal(SIGTERM)
        XCTAssertEqual(finish(child), .exited(0), stderr())
    }

    /// BL_* variables in blserve's own environment never reach a command as if blserve had set
    /// them (--prestart sets no BL_CODE), and SIGHUP (a closed terminal) ends blserve and the
    /// command running then, which sits in a process group of its own.
    func testInheritedBLVariablesStayOutAndSIGHUPEndsTheCommands() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        let pidFile = try scratchDirectory() + "/slow.pid"
        let script = "b=$(cat); \(slowWhenAsked(pidFile)); env | grep '^BL_' | sort"
        let (child, stderr) = try start(["-v", "--prestart", "--", "sh", "-c", script], busAddress: bus.address,
                                        environment: [("BL_CODE", "INHERITED"), ("BL_SIZE", "999"), ("BL_DEVICE", "nobody"), ("BL_MTU", "1")])
        XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") }, timeout: 10), stderr())
        let owner = try XCTUnwrap(bluez.applications.keys.first?.dropLast("/org/blpipe/blserve".count))
        try bluez.watchNotifications(of: String(owner))

        let a = FakeBluetoothd.device(1)
        for _ in 0..<2 {  // the first run starts with the request, the second ahead of it
            _ = bluez.write(Array("T0000002hi".utf8), from: a, mtu: 185)
            var reply: [UInt8] = []
            XCTAssertTrue(loop.run(until: { reply += bluez.readAll(from: a); return reply.count > 8 && reply.last == 0x0A }, timeout: 10))
            XCTAssertEqual(String(decoding: reply.dropFirst(8), as: UTF8.self),
                           "BL_ADAPTER=hci0\nBL_DEVICE=00:00:00:00:00:01\nBL_MTU=185\n")
        }

        let handlerPID = startSlowHandler(bluez, from: a, pidFile: pidFile)
        child.signal(SIGHUP)
        XCTAssertEqual(finish(child), .exited(0), stderr())
        XCTAssertTrue(bluez.applications.isEmpty, "the application is still registered")
        assertEnds(handlerPID, "the handler running at SIGHUP is still alive")
    }

    /// A second signal while the first one's shutdown waits for a command that ignores SIGTERM
    /// ends blserve at once (status 130), its commands killed.
    func testASecondSignalEndsAtOnce() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        let pidFile = try scratchDirectory() + "/slow.pid"
        let (child, stderr) = try start(["-v", "--", "sh", "-c", "trap '' TERM; b=$(cat); \(slowWhenAsked(pidFile))"],
                                        busAddress: bus.address)
        XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") }, timeout: 10), stderr())
        let owner = try XCTUnwrap(bluez.applications.keys.first?.dropLast("/org/blpipe/blserve".count))
        try bluez.watchNotifications(of: String(owner))
        let handlerPID = startSlowHandler(bluez, from: FakeBluetoothd.device(1), pidFile: pidFile)
        child.signal(SIGTERM)
        // The first signal's shutdown gives the command 2 s before SIGKILL.
        _ = loop.run(until: { child.status != nil }, timeout: 0.5)
        XCTAssertNil(child.status, "blserve did not wait for its command: \(stderr())")
        let second = MonotonicClock.seconds()
        child.signal(SIGINT)
        XCTAssertEqual(finish(child), .exited(130), stderr())
        XCTAssertLessThan(MonotonicClock.seconds() - second, 1.2, "the second signal waited for the shutdown")
        XCTAssertTrue(stderr().contains("blserve: SIGINT while stopping: ending at once"), stderr())
        assertEnds(handlerPID, "the command running at the second signal is still alive")
    }

    /// Fills the pipe `pid`'s descriptor 2 writes into (through a non-blocking description of
    /// our own), so that nothing more fits until its reader reads.
    private func fillStderr(of pid: pid_t) throws {
        let fd = open("/proc/\(pid)/fd/2", O_WRONLY | O_NONBLOCK)
        guard fd >= 0 else { throw Errno.current }
        defer { close(fd) }
        let block = [UInt8](repeating: UInt8(ascii: "x"), count: 4096)
        while block.withUnsafeBytes({ Glibc.write(fd, $0.baseAddress, $0.count) }) > 0 {}
    }

    /// stderr full and never read (a terminal stopped with ^S, a log pipe nobody reads): the
    /// diagnostics blserve still has to write do not keep a signal from ending it. One signal
    /// ends it with 0 after at most a second's wait for the reader; a second signal meanwhile
    /// with 130, not killed by that signal.
    func testSignalsEndBlserveWhileNobodyReadsItsStderr() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        for second in [false, true] {
            let child = try children.spawn([blserve, "-v", "--", "cat"], environment: [("DBUS_SYSTEM_BUS_ADDRESS", bus.address)],
                                           stdin: .null, stdout: .null, stderr: .pipe)
            XCTAssertTrue(loop.run(until: { !bluez.applications.isEmpty }, timeout: 10), "not registered")
            try fillStderr(of: child.pid)
            child.signal(SIGTERM)
            if second {
                // Once it has unregistered, blserve waits for its stderr (1 s at most).
                XCTAssertTrue(loop.run(until: { bluez.applications.isEmpty || child.status != nil }, timeout: 5))
                child.signal(SIGTERM)
                XCTAssertEqual(finish(child, timeout: 5), .exited(130), "after a second SIGTERM")
            } else {
                XCTAssertEqual(finish(child, timeout: 5), .exited(0), "after SIGTERM")
            }
            if child.status == nil { child.signal(SIGKILL) }
            _ = loop.run(until: { bluez.applications.isEmpty }, timeout: 5)
        }
    }

    /// A bus with the stand-in bluetoothd, which has no adapter (in `self.bus`).
    private func bluetoothdWithoutAdapter() throws -> (BusFixture, FakeBluetoothd) {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        try bluez.removeAdapter()
        return (bus, bluez)
    }

    /// blserve `args`, once it says it waits for an adapter.
    private func startWaitingForAnAdapter(_ args: [String], busAddress: String) throws -> (Subprocess, () -> String) {
        let (child, stderr) = try start(args, busAddress: busAddress)
        XCTAssertTrue(loop.run(until: { stderr().contains("no Bluetooth adapter yet: waiting for one") }, timeout: 10), stderr())
        return (child, stderr)
    }

    /// The bus going away while blserve waits at start for an adapter ends the wait (69), as
    /// any failure but bluetoothd's absence does: waiting would be for ever.
    func testTheBusGoingAwayEndsTheWaitForAnAdapter() throws {
        let (bus, bluez) = try bluetoothdWithoutAdapter()
        let (child, stderr) = try withExtendedLifetime(bluez) { try startWaitingForAnAdapter(["cat"], busAddress: bus.address) }
        bus.stop()
        self.bus = nil
        XCTAssertNotNil(finish(child, timeout: 15), "blserve still waits: \(stderr())")
        XCTAssertNotEqual(child.status, .exited(0), stderr())
        if child.status == nil { child.signal(SIGKILL) }
    }

    /// Started before any adapter exists (a controller attached after bluetoothd, at boot),
    /// blserve waits for one instead of failing.
    func testWaitsForAnAdapterAtStart() throws {
        let (bus, bluez) = try bluetoothdWithoutAdapter()
        // A signal while it waits ends it as cleanly as one after the registration.
        let (early, earlyStderr) = try startWaitingForAnAdapter(["cat"], busAddress: bus.address)
        early.signal(SIGTERM)
        XCTAssertEqual(finish(early), .exited(0), earlyStderr())

        let (child, stderr) = try startWaitingForAnAdapter(["-v", "cat"], busAddress: bus.address)
        _ = loop.run(until: { child.status != nil }, timeout: 1)
        XCTAssertNil(child.status, "blserve ended without an adapter: \(stderr())")
        // bluetoothd restarting meanwhile (gone for longer than blserve's longest wait between
        // two looks) is waited for too.
        try bluez.restart(gone: 5)
        try bluez.removeAdapter()
        _ = loop.run(until: { child.status != nil }, timeout: 1)
        XCTAssertNil(child.status, "blserve ended as bluetoothd restarted: \(stderr())")
        try bluez.addAdapter()
        XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") }, timeout: 10), stderr())
        child.signal(SIGTERM)
        XCTAssertEqual(finish(child), .exited(0), stderr())
    }

    func testWholeLifeRegistersAnswersAndUnregistersOnSIGTERM() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        let pidFile = try scratchDirectory() + "/slow.pid"
        let (child, stderr) = try start(["-v", "-n", "life", "--", "sh", "-c",
                                         "b=$(cat); \(slowWhenAsked(pidFile)); printf %s \"$b\""],
                                        busAddress: bus.address)
        XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") }, timeout: 10), stderr())
        let owner = try XCTUnwrap(bluez.applications.keys.first?.dropLast("/org/blpipe/blserve".count))
        try bluez.watchNotifications(of: String(owner))
        XCTAssertEqual(bluez.advertisements.count, 1)

        let a = FakeBluetoothd.device(1)
        _ = bluez.write(Array("T0000004ping".utf8), from: a)
        var reply: [UInt8] = []
        XCTAssertTrue(loop.run(until: { reply += bluez.readAll(from: a); return !reply.isEmpty }, timeout: 10))
        XCTAssertEqual(String(decoding: reply, as: UTF8.self), "T0000004ping")
        XCTAssertEqual(bluez.advertisements.values.first?["LocalName"]?.string, "life")
        // -v: one line per request with the central, code, size, exit status, reply and duration.
        XCTAssertNotNil(stderr().range(of: #"(?m)^blserve: 00:00:00:00:00:01: T 4 bytes: exit status 0, reply T 4 bytes, [0-9]+ ms$"#,
                                       options: .regularExpression), stderr())

        // A handler that is still running when SIGTERM comes is ended, and blserve unregisters.
        let handlerPID = startSlowHandler(bluez, from: a, pidFile: pidFile)
        let stopped = MonotonicClock.seconds()
        child.signal(SIGTERM)
        XCTAssertEqual(finish(child), .exited(0), stderr())
        XCTAssertLessThan(MonotonicClock.seconds() - stopped, 5)
        XCTAssertTrue(bluez.applications.isEmpty, "the application is still registered")
        XCTAssertTrue(bluez.advertisements.isEmpty, "the advertisement is still registered")
        // Gone, or a zombie waiting for whoever inherited it.
        assertEnds(handlerPID, "the handler running at SIGTERM is still alive")
    }

    /// End to end: a central subscribing while blserve unregisters after SIGTERM (bluetoothd
    /// answering late) does not start stream mode's COMMAND, which would outlive blserve.
    func testASubscriptionDuringTheStopLeavesNoCommandBehind() throws {
        let bus = try BusFixture()
        self.bus = bus
        let bluez = try FakeBluetoothd(address: bus.address, loop: loop)
        let pidFile = try scratchDirectory() + "/pid"
        let (child, stderr) = try start(["-v", "--mode", "stream", "--", "sh", "-c",
                                         "\(writingPID(to: pidFile)); exec sleep 300"],
                                        busAddress: bus.address)
        XCTAssertTrue(loop.run(until: { stderr().contains("registered on hci0") }, timeout: 10), stderr())
        let owner = String(try XCTUnwrap(bluez.applications.keys.first?.dropLast("/org/blpipe/blserve".count)))
        try bluez.watchNotifications(of: owner)
        try bluez.setConnected(FakeBluetoothd.device(1), true)
        bluez.unregisterDelay = 1.0
        kill(child.pid, SIGTERM)
        _ = loop.run(until: { false }, timeout: 0.3)
        try bluez.startNotify()
        XCTAssertEqual(finish(child), .exited(0), stderr())
        let pid = waitForPID(pidFile, seconds: 0.5)
        if let pid { kill(-pid, SIGKILL); kill(pid, SIGKILL) }
        XCTAssertNil(pid, "COMMAND was started by a subscription during the stop\n\(stderr())")
    }
}
