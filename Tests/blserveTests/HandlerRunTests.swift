import XCTest
import Glibc
@testable import BLCommand
import BLFrame
@testable import blserve

final class HandlerRunTests: XCTestCase {
    private var loop: EventLoop!
    private var children: ChildProcesses!
    private let buffer = SharedReadBuffer()

    override func setUpWithError() throws {
        loop = EventLoop()
        children = try ChildProcesses(loop: loop)
    }

    override func tearDown() {
        children?.terminateAll(signal: SIGKILL, grace: 1)
        children = nil
        loop = nil
    }

    private func run(_ argv: [String], input: [UInt8] = [], limit: Int = 1 << 20, timeout: Double = 10,
                     env: [(String, String)] = [], file: StaticString = #filePath, line: UInt = #line) -> HandlerRun.Outcome? {
        var outcome: HandlerRun.Outcome?
        let run = HandlerRun(command: HandlerCommand(argv), environment: env, input: input, outputLimit: limit, timeout: timeout,
                             children: children, buffer: buffer) { outcome = $0 }
        run.start()
        if !loop.run(until: { outcome != nil }, timeout: timeout + 10) {
            XCTFail("the run did not finish", file: file, line: line)
        }
        return outcome
    }

    func testBodyGoesToStdinAndStdoutComesBack() throws {
        let body = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let outcome = try XCTUnwrap(run(["cat"], input: body))
        XCTAssertNil(outcome.failure)
        XCTAssertEqual(outcome.status, .exited(0))
        XCTAssertEqual(outcome.output, body)
    }

    func testEnvironmentIsPassed() throws {
        let outcome = try XCTUnwrap(run(["sh", "-c", "printf '%s/%s' \"$BL_CODE\" \"$BL_SIZE\""], env: [("BL_CODE", "T"), ("BL_SIZE", "5")]))
        XCTAssertEqual(String(decoding: outcome.output, as: UTF8.self), "T/5")
    }

    func testArgumentsAreNotInterpretedByAShell() throws {
        // If a shell were involved, $HOME and ; would be expanded or split.
        let outcome = try XCTUnwrap(run(["printf", "%s|", "$HOME;", "`x`", "a b"]))
        XCTAssertEqual(String(decoding: outcome.output, as: UTF8.self), "$HOME;|`x`|a b|")
    }

    func testNonZeroExitIsAFailureAndItsOutputIsDropped() throws {
        let outcome = try XCTUnwrap(run(["sh", "-c", "echo partial; exit 3"]))
        XCTAssertEqual(outcome.failure, "exit status 3")
        XCTAssertEqual(outcome.output, [])
    }

    func testASignalIsAFailure() throws {
        let outcome = try XCTUnwrap(run(["sh", "-c", "kill -SEGV $$"]))
        XCTAssertEqual(outcome.status, .signaled(SIGSEGV))
        XCTAssertEqual(outcome.failure, "killed by signal 11 (SIGSEGV)")
    }

    func testTimeoutKillsTheWholeProcessGroup() throws {
        let marker = "/tmp/blserve-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        // The grandchild would create the marker file after 2 s if it survived the kill.
        let started = MonotonicClock.seconds()
        let outcome = try XCTUnwrap(run(["sh", "-c", "(sleep 2; touch \(marker)) & sleep 30"], timeout: 0.5))
        XCTAssertEqual(outcome.failure, "timed out after 0.5 s")
        XCTAssertLessThan(MonotonicClock.seconds() - started, 5)
        _ = loop.run(until: { false }, timeout: 2.5)
        XCTAssertNotEqual(access(marker, F_OK), 0, "a grandchild survived the timeout")
        unlink(marker)
    }

    func testBackgroundProcessHoldingStdoutDoesNotDelayTheReply() throws {
        let started = MonotonicClock.seconds()
        let outcome = try XCTUnwrap(run(["sh", "-c", "sleep 20 & printf done"], timeout: 10))
        XCTAssertNil(outcome.failure)
        XCTAssertEqual(outcome.output, Array("done".utf8))
        XCTAssertLessThan(MonotonicClock.seconds() - started, 3)
    }

    func testHandlerThatIgnoresStdinStillWorks() throws {
        let outcome = try XCTUnwrap(run(["echo", "hi"], input: [UInt8](repeating: 65, count: 1 << 20)))
        XCTAssertNil(outcome.failure)
        XCTAssertEqual(outcome.output, Array("hi\n".utf8))
    }

    func testOutputOverTheLimitIsAFailure() throws {
        let outcome = try XCTUnwrap(run(["head", "-c", "5000", "/dev/zero"], limit: 4096))
        XCTAssertEqual(outcome.failure, "reply over 4096 bytes")
        XCTAssertEqual(outcome.output, [])
    }

    func testMissingProgramIsReportedNotThrown() throws {
        let outcome = try XCTUnwrap(run(["/nonexistent/handler"]))
        XCTAssertNil(outcome.status)
        XCTAssertEqual(outcome.failure, "cannot run /nonexistent/handler: No such file or directory")
    }

    func testAProgramMovedSinceItWasFoundIsSearchedForAgain() throws {
        var lookups = 0
        let command = HandlerCommand(["cat"]) { _ in
            lookups += 1
            return lookups == 1 ? "/nonexistent/cat" : "/bin/cat"
        }
        var outcome: HandlerRun.Outcome?
        let run = HandlerRun(command: command, environment: [], input: Array("moved".utf8), outputLimit: 100, timeout: 10,
                             children: children, buffer: buffer) { outcome = $0 }
        run.start()
        XCTAssertTrue(loop.run(until: { outcome != nil }, timeout: 10))
        XCTAssertNil(outcome?.failure)
        XCTAssertEqual(outcome?.output, Array("moved".utf8))
        XCTAssertEqual(lookups, 2)
        XCTAssertEqual(command.resolvedPath, "/bin/cat", "the new place is remembered")
    }

    /// --prestart hands a run a start that may still be under way, here one whose first try
    /// fails (the file moved) and whose second is still being started.
    func testARunTakesOverAStartStillUnderWay() throws {
        var lookups = 0
        let command = HandlerCommand(["cat"]) { _ in
            lookups += 1
            return lookups == 1 ? "/nonexistent/cat" : "/bin/cat"
        }
        children.reportDelay = 0.3
        let ahead = try HandlerRun.startProcess(command, children, environment: [])
        var outcome: HandlerRun.Outcome?
        let run = HandlerRun(command: command, environment: [], input: Array("ahead".utf8), outputLimit: 100, timeout: 10,
                             children: children, buffer: buffer) { outcome = $0 }
        run.start(with: ahead)
        XCTAssertTrue(loop.run(until: { outcome != nil }, timeout: 10))
        XCTAssertNil(outcome?.failure)
        XCTAssertEqual(outcome?.output, Array("ahead".utf8))
        XCTAssertEqual(lookups, 2)
    }

    /// Processes whose command line is `sleep <marker>`.
    private static func sleepers(_ marker: String) -> Int {
        guard let names = try? DirectoryListing.names(in: "/proc") else { return 0 }
        var count = 0
        for name in names {
            guard Int(name) != nil else { continue }
            let fd = open("/proc/\(name)/cmdline", O_RDONLY)
            guard fd >= 0 else { continue }
            var bytes = [UInt8](repeating: 0, count: 256)
            let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            close(fd)
            if n > 0, Array(bytes[0..<n]) == Array("sleep\0\(marker)\0".utf8) { count += 1 }
        }
        return count
    }

    func testARunCancelledWhileItsProcessStartsLeavesNothingRunning() throws {
        let marker = String(UInt32.random(in: 100_000...999_999))
        var finished = false
        let run = HandlerRun(command: HandlerCommand(["sleep", marker]), environment: [], input: [], outputLimit: 100,
                             timeout: 10, children: children, buffer: buffer) { _ in finished = true }
        run.start()
        // Still being started on its thread: cancelled before the loop has heard of it.
        run.cancel()
        _ = loop.run(until: { false }, timeout: 1)
        XCTAssertEqual(Self.sleepers(marker), 0, "the process outlived its cancelled run")
        XCTAssertTrue(children.isIdle)
        XCTAssertFalse(finished, "a cancelled run called its completion")
    }

    func testAFailedRunDoesNotSpoilTheNextOne() throws {
        _ = run(["sh", "-c", "exit 1"])
        _ = run(["sleep", "10"], timeout: 0.2)
        let outcome = try XCTUnwrap(run(["cat"], input: Array("again".utf8)))
        XCTAssertNil(outcome.failure)
        XCTAssertEqual(outcome.output, Array("again".utf8))
        XCTAssertTrue(children.isIdle)
    }

    // MARK: - Reply frames

    private func outcome(_ output: [UInt8], failure: String? = nil) -> HandlerRun.Outcome {
        HandlerRun.Outcome(status: failure == nil ? .exited(0) : .exited(1), output: output, failure: failure, duration: 0)
    }

    func testAutoReplyCodes() {
        XCTAssertEqual(FrameMode.reply(for: outcome([]), code: .auto), Array("N0000000".utf8))
        XCTAssertEqual(FrameMode.reply(for: outcome(Array("hi".utf8)), code: .auto), Array("T0000002hi".utf8))
        let png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 1, 2]
        XCTAssertEqual(FrameMode.reply(for: outcome(png), code: .auto), Array("I0000010".utf8) + png)
        XCTAssertEqual(FrameMode.reply(for: outcome([0xFF, 0xD8, 0xFF, 0]), code: .auto).first, UInt8(ascii: "I"))
    }

    func testFixedAndRawReplyCodes() {
        XCTAssertEqual(FrameMode.reply(for: outcome(Array("x".utf8)), code: .fixed(.url)), Array("U0000001x".utf8))
        XCTAssertEqual(FrameMode.reply(for: outcome(Array("T0000001x".utf8)), code: .raw), Array("T0000001x".utf8))
        XCTAssertEqual(FrameMode.reply(for: outcome([]), code: .raw), [])
    }

    func testFailuresBecomeErrorTextFrames() {
        XCTAssertEqual(FrameMode.reply(for: outcome([], failure: "exit status 3"), code: .raw),
                       Array("T0000020error: exit status 3".utf8))
        XCTAssertEqual(FrameMode.reply(for: outcome([], failure: "timed out after 30 s"), code: .auto),
                       Array("T0000027error: timed out after 30 s".utf8))
    }
    /// What COMMAND leaves running in its group ends with the run, whether or not it still holds
    /// standard output (it would otherwise outlive --handler-timeout and pile up per request).
    func testWhatCommandLeavesBehindEndsWithTheRun() throws {
        for script in ["sleep 30 & echo $!", "sleep 30 >/dev/null & echo $!"] {
            let outcome = try XCTUnwrap(run(["sh", "-c", script], timeout: 20))
            XCTAssertNil(outcome.failure, script)
            let text = String(decoding: outcome.output, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
            let pid = try XCTUnwrap(Int32(text), "\(script): printed \(text)")
            // Gone, or dead and waiting for init to reap it.
            let gone = loop.run(until: { kill(pid, 0) != 0 || Self.isZombie(pid) }, timeout: 3)
            if !gone { kill(pid, SIGKILL) }
            XCTAssertTrue(gone, "\(script): the background sleep outlived the run")
        }
    }

    private static func isZombie(_ pid: Int32) -> Bool {
        let fd = open("/proc/\(pid)/stat", O_RDONLY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 512)
        let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return false }
        let text = String(decoding: bytes[0..<n], as: UTF8.self)
        guard let paren = text.lastIndex(of: ")") else { return false }
        return text[text.index(after: paren)...].drop(while: { $0 == " " }).hasPrefix("Z")
    }
}
