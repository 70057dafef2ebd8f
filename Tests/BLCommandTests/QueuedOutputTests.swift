import Dispatch
import Glibc
import XCTest
import BLTestSupport
@testable import BLCommand

final class QueuedOutputTests: XCTestCase {
    override func setUp() {
        super.setUp()
        ignoreSIGPIPE()
    }

    /// What an output reported through onFailure.
    private final class Failures {
        var list: [Errno] = []
        init(_ out: QueuedOutput) { out.onFailure = { [weak self] in self?.list.append($0) } }
    }

    private static func pattern(_ count: Int, seed: Int = 0) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: ($0 &+ seed) &* 31 &+ ($0 >> 9)) }
    }

    /// A reader that is not reading does not stop the writer: a megabyte (16 pipes' worth) is
    /// accepted at once. When the reader reads part of it, the queue says it has room as soon as
    /// it is down to half (not only once empty); then every byte arrives, in order.
    func testStalledPipeReaderDoesNotBlockTheWriter() {
        let (r, w) = makeBlockingPipe()
        let payload = Self.pattern(1 << 20)
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop, limit: 512 * 1024)
        var roomCalls = 0
        out.onRoom = { roomCalls += 1 }
        let failures = Failures(out)

        // If a write blocked, this would not finish: nobody reads the pipe yet.
        let accepted = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var fullSeen = false
        nonisolated(unsafe) let writer = out   // used by one thread at a time
        DispatchQueue.global().async {
            for start in stride(from: 0, to: payload.count, by: 512) {
                writer.write(Array(payload[start..<start + 512]))
                try? writer.flush()
                if writer.isFull { fullSeen = true }
            }
            accepted.signal()
        }
        guard accepted.wait(timeout: .now() + 20) == .success else {
            close(r)   // the blocked write fails with EPIPE and the thread ends
            return XCTFail("writing to a pipe nobody reads blocked")
        }
        defer { close(r) }
        XCTAssertTrue(fullSeen)
        XCTAssertGreaterThan(out.queuedCount, 1 << 19)
        XCTAssertEqual(roomCalls, 0)
        var emptyCalls = 0
        out.onEmpty = { emptyCalls += 1 }

        // The reader takes 800,000 bytes and stops: about 180 KB stay queued, under half.
        let part = 800_000
        let partRead = DispatchSemaphore(value: 0)
        let resume = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var got: [UInt8] = []
        DispatchQueue.global().async {
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let want = got.count < part ? min(chunk.count, part - got.count) : chunk.count
                let n = chunk.withUnsafeMutableBytes { Glibc.read(r, $0.baseAddress, want) }
                if n <= 0 { break }
                got += chunk[0..<n]
                if got.count == part {
                    partRead.signal()
                    resume.wait()
                }
            }
            finished.signal()
        }
        XCTAssertTrue(loop.run(until: { partRead.wait(timeout: .now()) == .success }, timeout: 20))
        _ = loop.run(until: { roomCalls > 0 }, timeout: 1)
        XCTAssertEqual(roomCalls, 1, "room must be announced at half, not only when empty")
        XCTAssertGreaterThan(out.queuedCount, 0)
        XCTAssertEqual(emptyCalls, 0)
        resume.signal()
        XCTAssertTrue(loop.run(until: { out.queuedCount == 0 }, timeout: 20))
        XCTAssertEqual(roomCalls, 1)
        XCTAssertEqual(emptyCalls, 1, "onEmpty must be called once everything is written")
        out.write([1, 2, 3])
        try? out.flush()
        XCTAssertTrue(loop.run(until: { out.queuedCount == 0 }, timeout: 20))
        XCTAssertEqual(emptyCalls, 1, "onEmpty is called once")
        XCTAssertEqual(out.bytesWritten, payload.count + 3)
        out.close()
        close(w)
        XCTAssertEqual(finished.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(got == payload + [1, 2, 3])
        XCTAssertEqual(failures.list, [])
    }

    /// What the queue holds in memory stays near its limit while a slow reader takes a little
    /// at a time and the producer fills it up again each time (blrecv's case): it had reached
    /// 2.5× the limit (an array that doubles as it grows, and keeps what was written until it
    /// is compacted), so `--buffer 1G` needed 2.5 GB.
    func testMemoryHeldStaysNearTheLimitUnderASlowReader() throws {
        let (r, w) = makeBlockingPipe()
        defer { close(r) }
        XCTAssertEqual(fcntl(r, F_SETFL, fcntl(r, F_GETFL) | O_NONBLOCK), 0)
        let loop = EventLoop()
        let limit = 1 << 20
        let out = QueuedOutput(fd: w, loop: loop, limit: limit)
        let payload = Self.pattern(40 << 20)
        var sent = 0
        var got: [UInt8] = []
        var most = 0
        var chunk = [UInt8](repeating: 0, count: 65536)
        while sent < payload.count {
            while !out.isFull && sent < payload.count {
                out.write(Array(payload[sent..<sent + 512]))
                sent += 512
                try out.flush()
            }
            most = max(most, out.heldBytes)
            let n = chunk.withUnsafeMutableBytes { Glibc.read(r, $0.baseAddress, $0.count) }
            if n > 0 { got += chunk[0..<n] }
            try out.flush()
        }
        XCTAssertLessThanOrEqual(most, limit + limit / 4, "held \(most) bytes for a limit of \(limit)")
        while out.queuedCount > 0 || got.count < payload.count {
            try out.flush()
            let n = chunk.withUnsafeMutableBytes { Glibc.read(r, $0.baseAddress, $0.count) }
            if n > 0 { got += chunk[0..<n] } else if out.queuedCount == 0 { break }
        }
        XCTAssertTrue(got == payload, "bytes lost or out of order: \(got.count) of \(payload.count)")
        XCTAssertLessThanOrEqual(out.heldBytes, 3 * 65536, "memory kept once empty")
        out.close()
        close(w)
    }

    /// The chunked queue under random appends (empty, around a chunk's size, larger than one)
    /// and takes (whole runs, PIPE_BUF pieces, any prefix, nothing), compactions and drains:
    /// every byte comes out once, in order, and what it holds beyond its bytes stays within a
    /// few chunks.
    func testByteChunksGiveEveryByteOnceInOrder() {
        let chunk = ByteChunks.chunkSize
        // Byte i of what is appended is i mod 256.
        let counting = (0..<(4 * chunk + 256)).map { UInt8(truncatingIfNeeded: $0) }
        for seed in 0..<40 {
            var rng = SeededGenerator(seed: UInt64(seed))
            var queue = ByteChunks()
            var appended = 0
            var out: [UInt8] = []
            func take(_ limit: (Int) -> Int) {
                let piece = queue.withFirstRun { run -> [UInt8] in
                    XCTAssertTrue(run.count > 0 && run.count <= chunk)
                    return Array(run.prefix(limit(run.count)))
                }
                if !piece.isEmpty { queue.removeFirst(piece.count) }
                out += piece
            }
            for _ in 0..<250 {
                switch Int.random(in: 0..<10, using: &rng) {
                case 0...3:
                    let sizes = [0, 1, 500, chunk - 1, chunk, chunk + 1, 3 * chunk + 7]
                    let n = Bool.random(using: &rng) ? sizes.randomElement(using: &rng)! : Int.random(in: 0..<3000, using: &rng)
                    queue.append(Array(counting[appended % 256..<appended % 256 + n]))
                    appended += n
                case 4...7 where queue.count > 0:
                    switch Int.random(in: 0..<4, using: &rng) {
                    case 0: take { $0 }
                    case 1: take { min($0, Int(PIPE_BUF)) }
                    case 2: take { Int.random(in: 1...$0, using: &rng) }
                    default: take { _ in 0 }
                    }
                case 8:
                    queue.compact()
                default:
                    while queue.count > 0 { take { $0 } }
                    queue.compact()
                }
                XCTAssertEqual(queue.count, appended - out.count, "seed \(seed)")
                XCTAssertLessThanOrEqual(queue.held - queue.count, 3 * chunk + 4096, "seed \(seed)")
            }
            while queue.count > 0 { take { $0 } }
            XCTAssertEqual(out.count, appended)
            let inOrder = stride(from: 0, to: out.count, by: 256).allSatisfy { at in
                out[at..<min(at + 256, out.count)].elementsEqual(counting[0..<min(256, out.count - at)])
            }
            XCTAssertTrue(inOrder, "seed \(seed): bytes lost or out of order")
        }
    }

    /// A terminal whose reader has stopped (a stalled ssh session, Ctrl-S) holds far less than a
    /// pipe, and poll reports room there for a single free byte: writes must still not block.
    func testStalledTerminalDoesNotBlockTheWriter() throws {
        let master = open("/dev/ptmx", O_RDWR | O_NOCTTY)
        guard master >= 0 else { throw XCTSkip("no /dev/ptmx here") }
        defer { close(master) }
        // unlockpt() and ptsname() by hand (Glibc's module does not offer them):
        // TIOCSPTLCK with 0, then TIOCGPTN for the number.
        var unlock: Int32 = 0
        XCTAssertEqual(ioctl(master, 0x4004_5431, &unlock), 0)
        var number: UInt32 = 0
        XCTAssertEqual(ioctl(master, 0x8004_5430, &number), 0)
        let slave = open("/dev/pts/\(number)", O_RDWR | O_NOCTTY)
        guard slave >= 0 else { return XCTFail("cannot open /dev/pts/\(number): \(Errno.current)") }
        XCTAssertEqual(QueuedOutput(fd: master, loop: EventLoop()).path, .pieces,
                       "a pty master is not opened again (that would make a new pty)")
        var mode = termios()
        XCTAssertEqual(tcgetattr(slave, &mode), 0)
        cfmakeraw(&mode)
        XCTAssertEqual(tcsetattr(slave, TCSANOW, &mode), 0)

        let loop = EventLoop()
        let out = QueuedOutput(fd: slave, loop: loop)
        guard case .nonBlocking(let own) = out.path, own != slave else {
            close(slave)
            return XCTFail("a terminal should get its own non-blocking description, got \(out.path)")
        }
        let payload = Self.pattern(256 * 1024, seed: 9)
        let accepted = DispatchSemaphore(value: 0)
        nonisolated(unsafe) let writer = out
        DispatchQueue.global().async {
            for start in stride(from: 0, to: payload.count, by: 4096) {
                writer.write(Array(payload[start..<start + 4096]))
                try? writer.flush()
            }
            accepted.signal()
        }
        guard accepted.wait(timeout: .now() + 20) == .success else {
            return XCTFail("writing to a terminal nobody reads blocked")   // the fds leak: the thread holds them
        }
        XCTAssertGreaterThan(out.queuedCount, 0)
        // Now read the other side while the loop writes the rest.
        var got: [UInt8] = []
        let readWatch = loop.watch(fd: master, events: .readable) { _ in
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { Glibc.read(master, $0.baseAddress, $0.count) }
            if n > 0 { got += chunk[0..<n] }
        }
        XCTAssertTrue(loop.run(until: { got.count >= payload.count }, timeout: 30))
        loop.remove(readWatch)
        XCTAssertEqual(fcntl(slave, F_GETFL) & O_NONBLOCK, 0, "the terminal's own description stays blocking")
        out.close()
        close(slave)
        XCTAssertTrue(got == payload)
    }

    /// Whatever someone else set: a pipe already non-blocking is written as it is.
    func testPipeMadeNonBlockingBySomeoneElse() throws {
        let (r, w) = makeBlockingPipe()
        defer { close(r); close(w) }
        try FileIO.setNonBlocking(w)
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        XCTAssertEqual(out.path, .nonBlocking(w))
        let payload = Self.pattern(300_000, seed: 1)
        out.write(payload)
        try out.flush()
        XCTAssertGreaterThan(out.queuedCount, 0)
        let (done, got) = collectUntilEOF(r)
        XCTAssertTrue(loop.run(until: { out.queuedCount == 0 }, timeout: 20))
        out.close()
        close(w)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(got() == payload)
    }

    func testPathFollowsTheKindOfDescriptor() throws {
        let loop = EventLoop()
        let (r, w) = makeBlockingPipe()
        defer { close(r); close(w) }
        let fromPipe = QueuedOutput(fd: w, loop: loop)
        guard case .nonBlocking(let own) = fromPipe.path else { return XCTFail("pipe: \(fromPipe.path)") }
        XCTAssertNotEqual(own, w)
        XCTAssertEqual(fcntl(w, F_GETFL) & O_NONBLOCK, 0, "the shared pipe stays blocking")
        fromPipe.close()
        XCTAssertEqual(fcntl(own, F_GETFD), -1, "close() closes our own description")

        var pair: [Int32] = [0, 0]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair), 0)
        defer { close(pair[0]); close(pair[1]) }
        XCTAssertEqual(QueuedOutput(fd: pair[0], loop: loop).path, .socket)

        let null = open("/dev/null", O_WRONLY)
        defer { close(null) }
        XCTAssertEqual(QueuedOutput(fd: null, loop: loop).path, .whole)
        let file = try XCTUnwrap(tmpfile())
        defer { fclose(file) }
        XCTAssertEqual(QueuedOutput(fd: fileno(file), loop: loop).path, .whole)
    }

    /// drain() waits for the reader, but not past a pending SIGTERM: the loop holds such signals
    /// back, so without this a reader that never reads would make the tool deaf to them.
    func testDrainGivesUpWhenATerminationSignalIsPending() throws {
        let (r, w) = makeBlockingPipe()
        // If drain() ignored the signal it would wait for ever: after 10 s a reader takes the
        // bytes, drain() succeeds, and the assertion below reports it.
        let watchdogStarted = DispatchSemaphore(value: 0)
        let watchdogDone = DispatchSemaphore(value: 0)
        let watchdog = DispatchWorkItem {
            watchdogStarted.signal()
            var sink = [UInt8](repeating: 0, count: 65536)
            while sink.withUnsafeMutableBytes({ Glibc.read(r, $0.baseAddress, $0.count) }) > 0 {}
            watchdogDone.signal()
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + 10, execute: watchdog)
        defer {
            watchdog.cancel()
            close(w)
            if watchdogStarted.wait(timeout: .now()) == .success { watchdogDone.wait() }   // it sees EOF
            close(r)
        }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        out.write(Self.pattern(200_000))
        try out.flush()
        XCTAssertGreaterThan(out.queuedCount, 0)

        var term = sigset_t()
        sigemptyset(&term)
        sigaddset(&term, SIGTERM)
        var previous = sigset_t()
        XCTAssertEqual(pthread_sigmask(SIG_BLOCK, &term, &previous), 0)
        defer {
            var now = timespec(tv_sec: 0, tv_nsec: 0)
            _ = sigtimedwait(&term, nil, &now)   // take the signal back
            pthread_sigmask(SIG_SETMASK, &previous, nil)
        }
        XCTAssertEqual(pthread_kill(pthread_self(), SIGTERM), 0)
        let started = MonotonicClock.seconds()
        XCTAssertThrowsError(try out.drain()) { error in
            XCTAssertEqual(error as? Errno, .interrupted)
        }
        XCTAssertLessThan(MonotonicClock.seconds() - started, 5)
    }

    /// A pipe whose reader has gone is reported while nothing is queued (`blrecv | head` ends
    /// when head does, not at the next notification), as the EPIPE a write would get.
    func testReaderGoneIsReportedWhileIdle() {
        let (r, w) = makeBlockingPipe()
        defer { close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        let failures = Failures(out)
        out.write(Array("first\n".utf8))
        XCTAssertNoThrow(try out.flush())
        _ = loop.run(until: { false }, timeout: 0.1)
        XCTAssertEqual(failures.list, [])
        close(r)
        XCTAssertTrue(loop.run(until: { !failures.list.isEmpty }, timeout: 5))
        XCTAssertEqual(failures.list, [.pipe])
        // Nothing is written after a failure, and flush reports it.
        out.write(Array("more".utf8))
        XCTAssertEqual(out.queuedCount, 0)
        XCTAssertThrowsError(try out.flush())
    }

    /// The reader leaving with bytes still queued is a failure of the queued write.
    func testReaderGoneWithBytesQueued() {
        let (r, w) = makeBlockingPipe()
        defer { close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        let failures = Failures(out)
        out.write(Self.pattern(200_000))
        XCTAssertNoThrow(try out.flush())
        XCTAssertGreaterThan(out.queuedCount, 0)
        close(r)
        XCTAssertTrue(loop.run(until: { !failures.list.isEmpty }, timeout: 5))
        XCTAssertEqual(failures.list, [.pipe])
        XCTAssertEqual(out.failure, .pipe)
    }

    /// A descriptor that cannot be written (stdout closed at start, then reserved read-only) is
    /// reported at once, not when the first notification comes.
    func testReadOnlyDescriptorFailsAtOnce() {
        let (r, w) = makeBlockingPipe()
        defer { close(r); close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: r, loop: loop)
        let failures = Failures(out)
        XCTAssertTrue(loop.run(until: { !failures.list.isEmpty }, timeout: 2))
        XCTAssertEqual(failures.list, [Errno(EBADF)])
    }

    /// A regular file takes everything in the flush, without the loop.
    func testRegularFileIsWrittenAtOnce() throws {
        let file = try XCTUnwrap(tmpfile())
        defer { fclose(file) }
        let fd = fileno(file)
        let loop = EventLoop()
        let out = QueuedOutput(fd: fd, loop: loop, limit: 1024)
        XCTAssertEqual(out.path, .whole)
        let payload = Self.pattern(300_000, seed: 5)
        out.write(payload)
        XCTAssertTrue(out.isFull)
        try out.flush()
        XCTAssertEqual(out.queuedCount, 0)
        XCTAssertEqual(lseek(fd, 0, SEEK_END), off_t(payload.count))
        var back = [UInt8](repeating: 0, count: payload.count)
        XCTAssertEqual(back.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }, payload.count)
        XCTAssertTrue(back == payload)
    }

    /// drain() waits for a slow reader and loses nothing.
    func testDrainWaitsForTheReader() throws {
        let (r, w) = makeBlockingPipe()
        defer { close(r) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        let payload = Self.pattern(700_000, seed: 3)
        out.write(payload)
        try out.flush()
        XCTAssertGreaterThan(out.queuedCount, 0)
        let (done, got) = collectUntilEOF(r)
        try out.drain()
        XCTAssertEqual(out.queuedCount, 0)
        XCTAssertEqual(out.bytesWritten, payload.count)
        out.close()
        close(w)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(got() == payload)
    }

    /// With an idle limit (after an interrupt), a reader that never reads does not hold the
    /// drain for ever: it gives up with ETIMEDOUT, keeping what it could not write.
    func testDrainWithATimeoutGivesUpOnAStalledReader() throws {
        let (r, w) = makeBlockingPipe()
        defer { close(r); close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        out.write(Self.pattern(700_000, seed: 5))
        let started = MonotonicClock.seconds()
        XCTAssertThrowsError(try out.drain(idleTimeout: 0.3)) { XCTAssertEqual($0 as? Errno, .timedOut) }
        let took = MonotonicClock.seconds() - started
        XCTAssertGreaterThanOrEqual(took, 0.3)
        XCTAssertLessThan(took, 2)
        XCTAssertGreaterThan(out.queuedCount, 0)
        out.close()
    }

    /// The idle limit restarts whenever the reader takes something: a slow reader that keeps
    /// reading gets everything, however long it takes in all.
    func testDrainWithAnIdleLimitWaitsForAReaderThatKeepsReading() throws {
        let (r, w) = makeBlockingPipe()
        defer { close(r) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        let payload = Self.pattern(400_000, seed: 7)
        out.write(payload)
        let done = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var got: [UInt8] = []
        DispatchQueue.global().async {
            var buffer = [UInt8](repeating: 0, count: 32 * 1024)
            while true {
                usleep(60_000)  // 32 KiB every 60 ms: about 0.75 s in all
                let n = read(r, &buffer, buffer.count)
                if n <= 0 { break }
                got += buffer[0..<n]
            }
            done.signal()
        }
        let started = MonotonicClock.seconds()
        try out.drain(idleTimeout: 0.3)
        XCTAssertGreaterThan(MonotonicClock.seconds() - started, 0.3, "too fast to show anything")
        out.close()
        close(w)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(got == payload, "got \(got.count) of \(payload.count) bytes")
    }

    /// At the end of a run after a signal, a stalled reader is given a second: what it did not
    /// take is dropped with a warning, and that is no error. Without a signal, a reader that has
    /// gone is an error.
    func testDrainAtEndGivesAStalledReaderASecondAfterASignal() throws {
        let (r, w) = makeBlockingPipe()
        defer { close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        out.write(Self.pattern(700_000, seed: 9))
        let started = MonotonicClock.seconds()
        try out.drainAtEnd(interrupted: true, dropping: "test bytes")
        let took = MonotonicClock.seconds() - started
        XCTAssertGreaterThanOrEqual(took, QueuedOutput.drainAfterInterrupt)
        XCTAssertLessThan(took, QueuedOutput.drainAfterInterrupt + 2)
        XCTAssertGreaterThan(out.queuedCount, 0)
        close(r)
        XCTAssertThrowsError(try out.drainAtEnd(interrupted: false, dropping: "test bytes")) { XCTAssertEqual($0 as? Errno, .pipe) }
        out.close()
    }
}
