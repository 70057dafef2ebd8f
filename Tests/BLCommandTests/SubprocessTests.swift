import XCTest
import CLinux
import Foundation
import Glibc
@testable import BLCommand
import BLTestSupport

final class SubprocessTests: XCTestCase {
    private var loop: EventLoop!
    private var children: ChildProcesses!

    override func setUpWithError() throws {
        loop = EventLoop()
        children = try ChildProcesses(loop: loop)
    }

    override func tearDown() {
        children?.terminateAll(signal: SIGKILL, grace: 1)
        children = nil
        loop = nil
    }

    /// Reads a child's stdout to its end on the loop.
    private func readAll(_ child: Subprocess, timeout: Double = 10) -> [UInt8] {
        let out = readPipe(child.stdoutFD, on: loop, timeout: timeout)
        XCTAssertNotNil(out, "stdout did not end")
        child.closeStdout()
        return out ?? []
    }

    private func waitExit(_ child: Subprocess, timeout: Double = 10) -> ProcessStatus? {
        _ = loop.run(until: { child.status != nil }, timeout: timeout)
        return child.status
    }

    func testRunsArgvDirectlyWithPipes() throws {
        let child = try children.spawn(["printf", "%s|%s", "a b", "$(echo no)"])
        XCTAssertEqual(String(decoding: readAll(child), as: UTF8.self), "a b|$(echo no)")
        XCTAssertEqual(waitExit(child), .exited(0))
        XCTAssertTrue(children.running.isEmpty)
    }

    func testExecutableRunsThatFileUnderArgvZero() throws {
        // No PATH search: a name that exists nowhere runs, as the given file, under that name.
        let child = try children.spawn(["no-such-name-blpipe", "-c", "printf %s \"$0\""], executable: "/bin/sh")
        XCTAssertEqual(String(decoding: readAll(child), as: UTF8.self), "no-such-name-blpipe")
        XCTAssertEqual(waitExit(child), .exited(0))
        XCTAssertThrowsError(try children.spawn(["sh"], executable: "/no/such/file", stdin: .null, stdout: .null)) {
            XCTAssertEqual($0 as? Errno, Errno(ENOENT))
        }
    }

    func testStdinPipeAndExitStatus() throws {
        let child = try children.spawn(["sh", "-c", "read x; echo got:$x; exit 7"])
        try FileIO.writeAll(child.stdinFD, "line\n")
        child.closeStdin()
        XCTAssertEqual(String(decoding: readAll(child), as: UTF8.self), "got:line\n")
        XCTAssertEqual(waitExit(child), .exited(7))
        XCTAssertEqual(child.status?.description, "exit status 7")
    }

    func testOnExitIsCalledOnceFromTheLoop() throws {
        let child = try children.spawn(["true"], stdin: .null, stdout: .null)
        var calls: [ProcessStatus] = []
        child.onExit = { calls.append($0) }
        XCTAssertTrue(loop.run(until: { !calls.isEmpty }, timeout: 10))
        _ = loop.run(until: { false }, timeout: 0.3)
        XCTAssertEqual(calls, [.exited(0)])
    }

    func testEnvironmentAdditionsReplaceInheritedValues() throws {
        let child = try children.spawn(["sh", "-c", "printf '%s,%s' \"$BL_TEST_VALUE\" \"$PATH\""],
                                       environment: [("BL_TEST_VALUE", "x y"), ("PATH", "/usr/bin:/bin")])
        XCTAssertEqual(String(decoding: readAll(child), as: UTF8.self), "x y,/usr/bin:/bin")
    }

    func testEnvironmentBlockReplacesWholeKeysOnly() throws {
        setenv("BL_ENV_A", "1", 1)
        setenv("BL_ENV_AB", "2", 1)
        setenv("BL_ENV_\u{e9}", "3", 1)
        defer { for key in ["BL_ENV_A", "BL_ENV_AB", "BL_ENV_\u{e9}"] { unsetenv(key) } }
        let block = ChildProcesses.environmentBlock(adding: [("BL_ENV_A", "x"), ("BL_ENV_\u{e9}", "y"), ("BL_ENV_NEW", "z")])
        defer { for p in block { free(p) } }
        XCTAssertNil(block.last!)
        let entries = block.compactMap { $0.map { String(cString: $0) } }
        let ours = entries.filter { $0.hasPrefix("BL_ENV_") }.sorted()
        XCTAssertEqual(ours, ["BL_ENV_A=x", "BL_ENV_AB=2", "BL_ENV_NEW=z", "BL_ENV_\u{e9}=y"])
        var inherited = 0
        while environ[inherited] != nil { inherited += 1 }
        XCTAssertEqual(entries.count, inherited + 1, "every other inherited entry is kept, and one is added")
    }

    func testChildGetsItsOwnProcessGroupAndGroupKillReachesGrandchildren() throws {
        let child = try children.spawn(["sh", "-c", "sleep 30 & echo $!; wait"], stdin: .null)
        // Read the grandchild's pid (the first line), then kill the group.
        let line = try XCTUnwrap(readPipe(child.stdoutFD, on: loop) { $0.contains(10) })
        let grandchild = pid_t(String(decoding: line.prefix { $0 != 10 }, as: UTF8.self))!
        XCTAssertEqual(getpgid(child.pid), child.pid)
        XCTAssertEqual(getpgid(grandchild), child.pid)
        child.signalGroup(SIGKILL)
        XCTAssertEqual(waitExit(child), .signaled(SIGKILL))
        // The grandchild is not our child (sh's): wait until it is gone.
        XCTAssertTrue(loop.run(until: { kill(grandchild, 0) != 0 }, timeout: 5), "grandchild survived")
        XCTAssertEqual(child.status?.description, "killed by signal 9 (SIGKILL)")
    }

    func testChildStartsWithDefaultSignalsAndAnEmptyMask() throws {
        // The loop blocks SIGCHLD (and this test process may ignore SIGPIPE): the child must not inherit that.
        _ = try loop.onSignal(SIGTERM) { _ in }
        let child = try children.spawn(["sh", "-c", "grep -E '^(SigBlk|SigIgn)' /proc/self/status"], stdin: .null)
        let text = String(decoding: readAll(child), as: UTF8.self)
        XCTAssertTrue(text.contains("SigBlk:\t0000000000000000"), text)
        // SIGPIPE (bit 13) is not ignored.
        let ignored = text.split(separator: "\n").first { $0.hasPrefix("SigIgn") }.map { UInt64($0.split(separator: "\t")[1], radix: 16) ?? 0 } ?? 0
        XCTAssertEqual(ignored & (1 << 12), 0, text)
    }

    func testSpawnFailureIsThrown() {
        XCTAssertThrowsError(try children.spawn(["/nonexistent/program"])) { error in
            XCTAssertEqual(error as? Errno, Errno(ENOENT))
        }
        XCTAssertTrue(children.running.isEmpty)
    }

    /// The child gets 0, 1 and 2 only: not even a descriptor this process holds without
    /// close-on-exec (as one inherited from whoever started it would be).
    func testNoDescriptorsLeakIntoTheChild() throws {
        var fds: [Int32] = [-1, -1]
        XCTAssertEqual(pipe(&fds), 0)  // without close-on-exec
        defer { FileIO.close(fds[0]); FileIO.close(fds[1]) }
        let child = try children.spawn(["sh", "-c", "ls /proc/self/fd"], stdin: .null)
        let names = String(decoding: readAll(child), as: UTF8.self).split(separator: "\n").map(String.init)
        // 3 is ls's own descriptor for the directory it lists.
        XCTAssertEqual(names.sorted(), ["0", "1", "2", "3"])
    }

    /// The fallback where the C library cannot close descriptors in the child: every
    /// descriptor from the one given up becomes close-on-exec, with close_range(2) and, as on
    /// kernels before 5.11, through /proc/self/fd.
    func testDescriptorsCanAllBeMadeCloseOnExec() throws {
        for useCloseRange in [true, false] {
            var fds: [Int32] = [-1, -1]
            XCTAssertEqual(pipe(&fds), 0)  // without close-on-exec
            defer { FileIO.close(fds[0]); FileIO.close(fds[1]) }
            XCTAssertEqual(cl_cloexec_from(min(fds[0], fds[1]), useCloseRange), 0)
            for fd in fds {
                XCTAssertNotEqual(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0, "descriptor \(fd), close_range: \(useCloseRange)")
            }
        }
    }

    func testTerminateAllEndsEveryChild() throws {
        let a = try children.spawn(["sleep", "30"], stdin: .null, stdout: .null)
        let b = try children.spawn(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"], stdin: .null)
        // Only once the trap is set does SIGTERM mean nothing to it.
        XCTAssertEqual(readPipe(b.stdoutFD, on: loop) { $0.contains(10) }, Array("ready\n".utf8))
        let started = MonotonicClock.seconds()
        children.terminateAll(signal: SIGTERM, grace: 0.5)
        XCTAssertEqual(a.status, .signaled(SIGTERM))
        XCTAssertEqual(b.status, .signaled(SIGKILL))
        XCTAssertLessThan(MonotonicClock.seconds() - started, 4)
        XCTAssertTrue(children.running.isEmpty)
    }

    /// What a child started in its group and left ignoring SIGTERM is killed too, after the
    /// grace, although the child itself ended at once.
    func testTerminateAllEndsWhatAChildLeftInItsGroup() throws {
        let child = try children.spawn(["sh", "-c", "trap '' TERM; sleep 30 >/dev/null 2>&1 & trap - TERM; echo $!; exec sleep 30"],
                                       stdin: .null)
        let line = try XCTUnwrap(readPipe(child.stdoutFD, on: loop) { $0.contains(10) })
        let leftover = try XCTUnwrap(Int32(String(decoding: line.filter { $0 != 10 }, as: UTF8.self)))
        func alive(_ pid: Int32) -> Bool {
            // A zombie (waiting for whoever adopted it) is dead.
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { return false }
            return !stat[close...].hasPrefix(") Z")
        }
        XCTAssertTrue(alive(leftover))
        let started = MonotonicClock.seconds()
        children.terminateAll(signal: SIGTERM, grace: 0.5)
        XCTAssertEqual(child.status, .signaled(SIGTERM))
        let tick = loop.schedule(after: 0.02, repeating: 0.02) {}
        defer { loop.cancel(tick) }
        XCTAssertTrue(loop.run(until: { !alive(leftover) }, timeout: 2), "what the child left in its group outlived terminateAll")
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - started, 0.5, "killed before the grace was over")
    }

    func testManyShortChildrenAreAllReaped() throws {
        var ended = 0
        for _ in 0..<50 {
            let child = try children.spawn(["true"], stdin: .null, stdout: .null)
            child.onExit = { _ in ended += 1 }
        }
        XCTAssertTrue(loop.run(until: { ended == 50 }, timeout: 20))
        XCTAssertTrue(children.running.isEmpty)
    }

    // MARK: - Started on a thread of its own

    /// Runs the loop until `process` has a result; fails the test when none comes.
    private func waitStarted(_ process: StartingProcess, line: UInt = #line) -> Result<Subprocess, Errno>? {
        var called: [Result<Subprocess, Errno>] = []
        if let result = process.result { return result }
        process.onStarted = { called.append($0) }
        XCTAssertTrue(loop.run(until: { !called.isEmpty }, timeout: 10), "onStarted was not called", line: line)
        _ = loop.run(until: { false }, timeout: 0.05)
        XCTAssertEqual(called.count, 1, "onStarted called more than once", line: line)
        XCTAssertNotNil(process.result, line: line)
        return called.first
    }

    func testStartedChildGetsItsPipesLikeASpawnedOne() throws {
        let process = try children.start(["sh", "-c", "read x; printf '%s|%s' \"got:$x\" \"$BL_TEST_VALUE\"; exit 5"],
                                         environment: [("BL_TEST_VALUE", "v1")])
        let child = try XCTUnwrap(waitStarted(process)).get()
        XCTAssertTrue(process.process === child)
        XCTAssertTrue(children.running.contains { $0 === child }, "a started child is tracked and reaped like a spawned one")
        try FileIO.writeAll(child.stdinFD, "line\n")
        child.closeStdin()
        XCTAssertEqual(String(decoding: readAll(child), as: UTF8.self), "got:line|v1")
        XCTAssertEqual(waitExit(child), .exited(5))
        XCTAssertTrue(children.running.isEmpty)
    }

    func testStartReportsAFailedExecThroughOnStarted() throws {
        let process = try children.start(["/nonexistent/program"], stdin: .null, stdout: .pipe)
        guard case .failure(let error)? = waitStarted(process) else {
            return XCTFail("a program that does not exist started: \(String(describing: process.result))")
        }
        XCTAssertEqual(error, Errno(ENOENT))
        XCTAssertTrue(children.running.isEmpty)
    }

    func testCancelledBeforeItStartedTheChildIsKilledAndReaped() throws {
        let process = try children.start(["sleep", "30"], stdin: .null, stdout: .pipe)
        XCTAssertFalse(children.isIdle, "a child being started counts as work left")
        var called = false
        process.onStarted = { _ in called = true }
        process.cancel()
        XCTAssertTrue(loop.run(until: { process.process?.status != nil }, timeout: 10),
                      "a child cancelled while it was being started was not killed and reaped")
        XCTAssertEqual(process.process?.status, .signaled(SIGKILL))
        XCTAssertEqual(process.process?.stdoutFD, -1, "its pipes are closed")
        XCTAssertFalse(called, "onStarted was called after cancel")
        XCTAssertTrue(children.isIdle)
    }

    func testCancelAfterItStartedKillsItsGroup() throws {
        let process = try children.start(["sh", "-c", "sleep 30 & echo $!; wait"], stdin: .null)
        let child = try XCTUnwrap(waitStarted(process)).get()
        let pidText = readPipe(child.stdoutFD, on: loop) { $0.contains(10) }
        let grandchild = try XCTUnwrap(pidText.flatMap { Int32(String(decoding: $0.filter { $0 != 10 }, as: UTF8.self)) })
        process.cancel()
        XCTAssertEqual(waitExit(child), .signaled(SIGKILL))
        // The background sleep was in its group: gone too (kill with signal 0 fails once reaped by init).
        XCTAssertTrue(loop.run(until: { kill(grandchild, 0) != 0 || self.isZombie(grandchild) }, timeout: 5))
    }

    private func isZombie(_ pid: Int32) -> Bool {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return false }
        return text[text.index(after: close)...].drop { $0 == " " }.hasPrefix("Z")
    }

    func testStartedChildrenDoNotInheritEachOthersPipeEnds() throws {
        // The parent's ends of a child's pipes are close-on-exec: another child started later
        // (on another thread) does not hold them, or the first one's end of file would wait for
        // it. (That pipe2 closes the window between pipe and fcntl is not something a test can
        // catch reliably.)
        let a = try children.start(["sleep", "5"], stdin: .pipe, stdout: .pipe)
        let first = try XCTUnwrap(waitStarted(a)).get()
        let b = try children.start(["sh", "-c", "ls /proc/self/fd"], stdin: .null)
        let second = try XCTUnwrap(waitStarted(b)).get()
        let names = String(decoding: readAll(second), as: UTF8.self).split(separator: "\n").map(String.init)
        XCTAssertGreaterThan(first.stdinFD, 2)
        XCTAssertGreaterThan(first.stdoutFD, 2)
        for fd in [first.stdinFD, first.stdoutFD] {
            XCTAssertFalse(names.contains(String(fd)), "descriptor \(fd) leaked into the other child: \(names)")
        }
    }

    func testWithoutAThreadTheChildIsStartedInPlaceAndNotReapedBeforeOnStarted() throws {
        children.startsOnThreads = false
        let process = try children.start(["true"], stdin: .null, stdout: .pipe)
        // It has started and very likely ended by now; a reap now must not take it from the
        // caller before onStarted has given it to them.
        usleep(200_000)
        children.reap()
        var runningWhenStarted: Bool?
        process.onStarted = { runningWhenStarted = (try? $0.get())?.isRunning }
        XCTAssertTrue(loop.run(until: { runningWhenStarted != nil }, timeout: 5))
        XCTAssertEqual(runningWhenStarted, true)
        let child = try XCTUnwrap(process.process)
        XCTAssertEqual(String(decoding: readAll(child), as: UTF8.self), "")
        XCTAssertEqual(waitExit(child), .exited(0))
    }

    func testTerminateAllEndsChildrenStillBeingStarted() throws {
        var started: [StartingProcess] = []
        for _ in 0..<5 { started.append(try children.start(["sleep", "30"], stdin: .null, stdout: .null)) }
        // None has reported yet, so none can get the SIGTERM: they are cancelled, i.e. killed
        // as they arrive, well before the grace is over (not by the SIGKILL that ends it).
        let begun = MonotonicClock.seconds()
        children.terminateAll(signal: SIGTERM, grace: 4)
        XCTAssertLessThan(MonotonicClock.seconds() - begun, 3, "children being started waited for the grace")
        XCTAssertTrue(children.running.isEmpty)
        for process in started {
            XCTAssertEqual(process.process?.status, .signaled(SIGKILL), "a child being started outlived terminateAll")
        }
    }

    func testManyStartedChildrenAreAllReported() throws {
        var ended = 0
        for _ in 0..<50 {
            let process = try children.start(["true"], stdin: .null, stdout: .null)
            process.onStarted = { result in
                guard case .success(let child) = result else { return XCTFail("true did not start: \(result)") }
                child.onExit = { _ in ended += 1 }
            }
        }
        XCTAssertTrue(loop.run(until: { ended == 50 }, timeout: 30))
        XCTAssertTrue(children.running.isEmpty)
    }

    func testFindExecutable() {
        XCTAssertNotNil(Subprocess.findExecutable("sh"))
        XCTAssertEqual(Subprocess.findExecutable("/bin/sh"), "/bin/sh")
        XCTAssertNil(Subprocess.findExecutable("/etc/passwd"))  // not executable
        XCTAssertNil(Subprocess.findExecutable("no-such-program-blpipe"))
        XCTAssertNil(Subprocess.findExecutable(""))
        XCTAssertEqual(Subprocess.whyNotFound("/etc/passwd"), "permission denied")
        XCTAssertEqual(Subprocess.whyNotFound("/tmp"), "is a directory")
        XCTAssertEqual(Subprocess.whyNotFound("/no/such/program-blpipe"), "no such file")
        XCTAssertEqual(Subprocess.whyNotFound("no-such-program-blpipe"), "command not found")
    }

    func testStatusDecoding() {
        XCTAssertEqual(ProcessStatus(waitStatus: 0), .exited(0))
        XCTAssertEqual(ProcessStatus(waitStatus: 3 << 8), .exited(3))
        XCTAssertEqual(ProcessStatus(waitStatus: SIGKILL), .signaled(SIGKILL))
        XCTAssertTrue(ProcessStatus.exited(0).succeeded)
        XCTAssertFalse(ProcessStatus.signaled(SIGTERM).succeeded)
    }
}
