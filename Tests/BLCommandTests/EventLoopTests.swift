import XCTest
import Glibc
@testable import BLCommand

final class EventLoopTests: XCTestCase {
    private var openFDs: [Int32] = []

    override func tearDown() {
        for fd in openFDs { FileIO.close(fd) }
        openFDs.removeAll()
        super.tearDown()
    }

    /// A non-blocking pipe; both ends closed in tearDown unless closed earlier (then set to -1).
    private func makePipe() -> (read: Int32, write: Int32) {
        var fds: [Int32] = [-1, -1]
        XCTAssertEqual(pipe(&fds), 0)
        for fd in fds {
            XCTAssertNoThrow(try FileIO.setNonBlocking(fd))
            XCTAssertNoThrow(try FileIO.setCloseOnExec(fd))
        }
        openFDs.append(contentsOf: fds)
        return (fds[0], fds[1])
    }

    private func closeTracked(_ fd: Int32) {
        FileIO.close(fd)
        openFDs.removeAll { $0 == fd }
    }

    private func write(_ fd: Int32, _ text: String) {
        XCTAssertNoThrow(try FileIO.writeAll(fd, text))
    }

    private func readAll(_ fd: Int32) -> (String, eof: Bool, wouldBlock: Bool) {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        while true {
            do {
                let n = try buffer.withUnsafeMutableBytes { try FileIO.read(fd, into: $0) }
                if n == 0 { return (String(decoding: out, as: UTF8.self), true, false) }
                out.append(contentsOf: buffer[0..<n])
            } catch {
                return (String(decoding: out, as: UTF8.self), false, (error as? Errno) == .again)
            }
        }
    }

    // MARK: Timers

    func testTimersFireInDeadlineOrderWithTiesInSchedulingOrder() {
        let loop = EventLoop()
        var fired: [String] = []
        let start = MonotonicClock.seconds()
        loop.schedule(after: 0.06) { fired.append("c") }
        loop.schedule(after: 0.02) { fired.append("a") }
        loop.schedule(after: 0.04) { fired.append("b1") }
        // Same delay, scheduled later: fires after b1 even if both are due in one turn.
        loop.schedule(after: 0.04) { fired.append("b2") }
        XCTAssertTrue(loop.run(until: { fired.count == 4 }, timeout: 2))
        XCTAssertEqual(fired, ["a", "b1", "b2", "c"])
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - start, 0.06, "must not fire early")
        XCTAssertEqual(loop.timerCount, 0)
    }

    func testCancelledTimersDoNotFire() {
        let loop = EventLoop()
        var fired: [String] = []
        let doomed = loop.schedule(after: 0.01) { fired.append("doomed") }
        loop.cancel(doomed)
        // Cancelled by another timer due in the same turn: must not fire either.
        var victim: TimerToken?
        loop.schedule(after: 0.02) {
            fired.append("killer")
            loop.cancel(victim!)
        }
        victim = loop.schedule(after: 0.02) { fired.append("victim") }
        loop.schedule(after: 0.05) { fired.append("end") }
        XCTAssertTrue(loop.run(until: { fired.contains("end") }, timeout: 2))
        XCTAssertEqual(fired, ["killer", "end"])
    }

    func testRepeatingTimerRepeatsUntilCancelledFromItsOwnHandler() {
        let loop = EventLoop()
        var count = 0
        var token: TimerToken?
        token = loop.schedule(after: 0.005, repeating: 0.005) {
            count += 1
            if count == 5 { loop.cancel(token!) }
        }
        XCTAssertTrue(loop.run(until: { count == 5 }, timeout: 2))
        XCTAssertFalse(loop.run(until: { count > 5 }, timeout: 0.05), "fired after cancel")
        XCTAssertEqual(count, 5)
    }

    func testARepeatingTimerFiredByANestedTurnIsNotFiredAgainByTheOuterOne() {
        let loop = EventLoop()
        var repeats = 0
        var nestedDone = false
        // Both due in the first turn: the first runs a nested loop, in which the second fires and
        // moves its deadline a second on. The outer turn must not fire it again from its stale list.
        loop.schedule(after: 0.001) {
            _ = loop.run(until: { false }, timeout: 0.02)
            nestedDone = true
        }
        let token = loop.schedule(after: 0.002, repeating: 1.0) { repeats += 1 }
        usleep(10_000)
        XCTAssertTrue(loop.run(until: { nestedDone }, timeout: 2))
        _ = loop.run(until: { false }, timeout: 0.05)
        loop.cancel(token)
        XCTAssertEqual(repeats, 1, "fired twice within one period")
    }

    // MARK: Watches

    func testWatchOnPipeReportsReadableThenHangup() {
        let loop = EventLoop()
        let p = makePipe()
        var received = ""
        var sawEOF = false
        var events: [IOEvents] = []
        loop.watch(fd: p.read, events: .readable) { ev in
            events.append(ev)
            let (text, eof, _) = self.readAll(p.read)
            received += text
            if eof { sawEOF = true }
        }
        write(p.write, "hello")
        XCTAssertTrue(loop.run(until: { received == "hello" }, timeout: 2))
        XCTAssertTrue(events.first?.contains(.readable) ?? false)
        closeTracked(p.write)
        XCTAssertTrue(loop.run(until: { sawEOF }, timeout: 2))
        XCTAssertTrue(events.last?.contains(.hangup) ?? false, "closing the writer must report hangup: \(events)")
    }

    func testWritableWatchAndPausing() {
        let loop = EventLoop()
        let p = makePipe()
        var writable = 0
        let token = loop.watch(fd: p.write, events: .writable) { ev in
            XCTAssertTrue(ev.contains(.writable))
            writable += 1
        }
        XCTAssertTrue(loop.run(until: { writable >= 3 }, timeout: 1), "level-triggered: fires every turn")
        loop.setEvents(token, [])
        XCTAssertEqual(loop.events(of: token), [])
        let before = writable
        XCTAssertFalse(loop.run(until: { writable > before }, timeout: 0.05), "a paused watch must not fire")
        loop.remove(token)
        XCTAssertNil(loop.events(of: token))
    }

    func testRemovingAnotherReadyWatchInsideAHandlerStopsItsCall() {
        let loop = EventLoop()
        let p1 = makePipe()
        let p2 = makePipe()
        write(p1.write, "x")
        write(p2.write, "y")
        var calls: [String] = []
        var second: WatchToken?
        var first: WatchToken?
        // Both pipes are readable in the same turn; the first handler removes the second watch
        // (before it ran) and itself.
        first = loop.watch(fd: p1.read, events: .readable) { _ in
            calls.append("first")
            loop.remove(second!)
            loop.remove(first!)
        }
        second = loop.watch(fd: p2.read, events: .readable) { _ in calls.append("second") }
        loop.schedule(after: 0.05) { calls.append("end") }
        XCTAssertTrue(loop.run(until: { calls.contains("end") }, timeout: 2))
        // Both fds stay readable (nothing was read): level-triggered watches would fire every turn.
        XCTAssertEqual(calls, ["first", "end"])
        XCTAssertEqual(loop.watchCount, 0)
    }

    func testStaleReadinessIsNotDeliveredAfterANestedTurnConsumedIt() {
        let loop = EventLoop()
        let a = makePipe()
        let b = makePipe()
        write(a.write, "a")
        write(b.write, "b")
        var bCalls = 0
        var bWouldBlock = false
        var aCalls = 0
        var nestedDone = false
        loop.watch(fd: a.read, events: .readable) { _ in
            aCalls += 1
            _ = self.readAll(a.read)
            // A nested wait: serves b (which reads everything) while a's handler is running.
            nestedDone = loop.run(until: { bCalls > 0 }, timeout: 1)
        }
        loop.watch(fd: b.read, events: .readable) { _ in
            bCalls += 1
            let (_, _, wouldBlock) = self.readAll(b.read)
            if bCalls > 1 { bWouldBlock = wouldBlock }
        }
        loop.schedule(after: 0.05) {}
        XCTAssertTrue(loop.run(until: { aCalls > 0 && bCalls > 0 }, timeout: 2))
        _ = loop.run(until: { false }, timeout: 0.05)
        XCTAssertTrue(nestedDone)
        XCTAssertEqual(aCalls, 1)
        XCTAssertEqual(bCalls, 1, "b was ready in the outer turn but already served by the nested turn")
        XCTAssertFalse(bWouldBlock)
    }

    func testAWatchIsNotReenteredFromANestedRunInItsOwnHandler() {
        let loop = EventLoop()
        let p = makePipe()
        write(p.write, "never read")
        var depth = 0
        var maxDepth = 0
        var calls = 0
        let token = loop.watch(fd: p.read, events: .readable) { _ in
            calls += 1
            depth += 1
            maxDepth = max(maxDepth, depth)
            var tick = false
            loop.schedule(after: 0.03) { tick = true }
            XCTAssertTrue(loop.run(until: { tick }, timeout: 1))
            depth -= 1
        }
        XCTAssertTrue(loop.run(until: { calls >= 2 }, timeout: 2))
        loop.remove(token)
        XCTAssertEqual(maxDepth, 1, "the still-readable watch must not recurse into its own handler")
    }

    // MARK: callSoon, nested runs, wait, stop

    func testCallSoonRunsInOrderBeforeBlockingAndChainsToTheNextTurn() {
        let loop = EventLoop()
        var order: [Int] = []
        loop.callSoon {
            order.append(1)
            loop.callSoon { order.append(3) }
        }
        loop.callSoon { order.append(2) }
        let start = MonotonicClock.seconds()
        // No watch and no timer: if callSoon did not force a zero poll timeout this would block.
        XCTAssertTrue(loop.run(until: { order.count == 3 }, timeout: 5))
        XCTAssertEqual(order, [1, 2, 3])
        XCTAssertLessThan(MonotonicClock.seconds() - start, 1)
    }

    func testNestedRunUntilWithTimeout() {
        let loop = EventLoop()
        var flag = false
        var nestedResult: Bool?
        var nestedTimedOut: Bool?
        var elapsed = 0.0
        loop.schedule(after: 0.03) { flag = true }
        loop.schedule(after: 0.001) {
            // Condition satisfied by another timer while nested.
            nestedResult = loop.run(until: { flag }, timeout: 1)
            // Condition never satisfied: returns false after the timeout.
            let t0 = MonotonicClock.seconds()
            nestedTimedOut = loop.run(until: { false }, timeout: 0.05)
            elapsed = MonotonicClock.seconds() - t0
        }
        XCTAssertTrue(loop.run(until: { nestedTimedOut != nil }, timeout: 3))
        XCTAssertEqual(nestedResult, true)
        XCTAssertEqual(nestedTimedOut, false)
        XCTAssertGreaterThanOrEqual(elapsed, 0.05)
        XCTAssertLessThan(elapsed, 1.0)
    }

    func testWaitReturnsTheResultThrowsTheErrorAndTimesOut() throws {
        struct Boom: Error, Equatable {}
        let loop = EventLoop()
        let v: Int = try loop.wait(timeout: 1) { (done: @escaping (Result<Int, Boom>) -> Void) in
            loop.schedule(after: 0.01) { done(.success(42)) }
        }
        XCTAssertEqual(v, 42)

        XCTAssertThrowsError(try loop.wait(timeout: 1) { (done: @escaping (Result<Int, Boom>) -> Void) in
            loop.callSoon { done(.failure(Boom())) }
        }) { XCTAssertEqual($0 as? Boom, Boom()) }

        var late: ((Result<Int, Boom>) -> Void)?
        let t0 = MonotonicClock.seconds()
        XCTAssertThrowsError(try loop.wait(timeout: 0.05) { late = $0 }) {
            XCTAssertEqual($0 as? EventLoopError, .timedOut(0.05))
        }
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - t0, 0.05)
        late?(.success(1)) // a completion after the timeout is ignored
    }

    func testStopEndsRunAndEveryNestedRun() {
        let loop = EventLoop()
        var nested: Bool?
        var waitError: Error?
        loop.schedule(after: 0.001) {
            nested = loop.run(until: { false }, timeout: nil)
        }
        loop.schedule(after: 0.002) {
            do {
                _ = try loop.wait(timeout: nil) { (_: @escaping (Result<Int, EventLoopError>) -> Void) in }
            } catch {
                waitError = error
            }
        }
        loop.schedule(after: 0.03) { loop.stop() }
        let watchdog = loop.schedule(after: 5) { XCTFail("stop did not end the loop") }
        loop.run()
        loop.cancel(watchdog)
        XCTAssertEqual(nested, false)
        XCTAssertEqual(waitError as? EventLoopError, .stopped)
        XCTAssertFalse(loop.isStopping, "the request is cleared when run() returns")
        var ran = false
        loop.callSoon { ran = true }
        XCTAssertTrue(loop.run(until: { ran }, timeout: 1), "the loop is usable again")
    }

    // MARK: Signals

    private func isBlocked(_ signal: Int32) -> Bool {
        var current = sigset_t()
        pthread_sigmask(SIG_SETMASK, nil, &current)
        return sigismember(&current, signal) == 1
    }

    func testSignalFDDeliversRaisedAndThreadDirectedSignals() throws {
        let loop = EventLoop()
        var infos: [SignalInfo] = []
        let token = try loop.onSignal(SIGUSR1) { infos.append($0) }
        XCTAssertTrue(isBlocked(SIGUSR1), "handled signals are blocked and read from the signalfd")

        XCTAssertEqual(raise(SIGUSR1), 0)
        XCTAssertTrue(loop.run(until: { infos.count == 1 }, timeout: 2))
        XCTAssertEqual(infos.first?.signal, SIGUSR1)
        XCTAssertEqual(infos.first?.senderPID, getpid())

        XCTAssertEqual(pthread_kill(pthread_self(), SIGUSR1), 0)
        XCTAssertTrue(loop.run(until: { infos.count == 2 }, timeout: 2))

        loop.removeSignalHandler(token)
        XCTAssertFalse(isBlocked(SIGUSR1), "the last handler's removal unblocks the signal")
    }

    func testSignalSentWithKillToTheProcess() throws {
        // kill(2) targets the process: it reaches the signalfd only if no thread leaves the signal
        // unblocked. Check every thread's mask first (XCTest may have started helper threads).
        let loop = EventLoop()
        var got = false
        let token = try loop.onSignal(SIGUSR2) { _ in got = true }
        defer { loop.removeSignalHandler(token) }
        guard everyThreadBlocks(SIGUSR2) else {
            throw XCTSkip("another thread does not block SIGUSR2; kill() could be delivered there")
        }
        XCTAssertEqual(kill(getpid(), SIGUSR2), 0)
        XCTAssertTrue(loop.run(until: { got }, timeout: 2))
    }

    private func everyThreadBlocks(_ signal: Int32) -> Bool {
        guard let names = try? DirectoryListing.names(in: "/proc/self/task") else { return false }
        for name in names {
            guard let status = readSmallFile("/proc/self/task/\(name)/status") else { return false }
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("SigBlk:") }),
                  let mask = UInt64(line.dropFirst("SigBlk:".count).filter { $0 != " " && $0 != "\t" }, radix: 16)
            else { return false }
            if mask & (UInt64(1) << UInt64(signal - 1)) == 0 { return false }
        }
        return true
    }

    private func readSmallFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { FileIO.close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            guard let n = try? buffer.withUnsafeMutableBytes({ try FileIO.read(fd, into: $0) }), n > 0 else { break }
            out.append(contentsOf: buffer[0..<n])
        }
        return String(decoding: out, as: UTF8.self)
    }

    func testSpawnAttributesRestoreTheOriginalMask() throws {
        let loop = EventLoop()
        let token = try loop.onSignal(SIGUSR1) { _ in }
        defer { loop.removeSignalHandler(token) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        try Signals.prepareSpawnAttributes(&attributes)
        var mask = sigset_t()
        posix_spawnattr_getsigmask(&attributes, &mask)
        XCTAssertEqual(sigismember(&mask, SIGUSR1), 0, "children must not inherit the loop's blocked signals")
        var flags: Int16 = 0
        posix_spawnattr_getflags(&attributes, &flags)
        XCTAssertNotEqual(flags & Int16(POSIX_SPAWN_SETSIGMASK), 0)
        XCTAssertNotEqual(flags & Int16(POSIX_SPAWN_SETSIGDEF), 0)
        var defaults = sigset_t()
        posix_spawnattr_getsigdefault(&attributes, &defaults)
        XCTAssertEqual(sigismember(&defaults, SIGPIPE), 1)
    }
}
