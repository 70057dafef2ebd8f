import Dispatch
import Glibc
import XCTest
@testable import BLCommand

final class QueuedOutputTests: XCTestCase {
    override func setUp() {
        super.setUp()
        signal(SIGPIPE, SIG_IGN)
    }

    private func makePipe() -> (read: Int32, write: Int32) {
        var fds: [Int32] = [0, 0]
        XCTAssertEqual(pipe(&fds), 0)
        return (fds[0], fds[1])
    }

    private static func pattern(_ count: Int, seed: Int = 0) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: ($0 &+ seed) &* 31 &+ ($0 >> 9)) }
    }

    /// Reads `fd` until EOF on another thread.
    private func collect(_ fd: Int32) -> (DispatchSemaphore, () -> [UInt8]) {
        let done = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var got: [UInt8] = []
        DispatchQueue.global().async {
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
                if n <= 0 { break }
                got += buffer[0..<n]
            }
            done.signal()
        }
        return (done, { got })
    }

    /// A reader that is not reading does not stop the writer: a megabyte (16 pipes' worth) is
    /// accepted at once, and once the reader reads, every byte arrives in order and the queue
    /// says it has room again.
    func testStalledPipeReaderDoesNotBlockTheWriter() {
        let (r, w) = makePipe()
        defer { close(r) }
        let payload = Self.pattern(1 << 20)
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop, limit: 512 * 1024)
        var roomCalls = 0
        out.onRoom = { roomCalls += 1 }
        var failures: [Errno] = []
        out.onFailure = { failures.append($0) }

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
            close(w)   // unblocks the writer with EPIPE
            return XCTFail("writing to a pipe nobody reads blocked")
        }
        XCTAssertTrue(fullSeen)
        XCTAssertGreaterThan(out.queuedCount, 1 << 19)
        XCTAssertLessThanOrEqual(out.queuedCount, payload.count - 4096)
        XCTAssertEqual(roomCalls, 0)

        let (done, got) = collect(r)
        XCTAssertTrue(loop.run(until: { out.queuedCount == 0 }, timeout: 20))
        XCTAssertEqual(roomCalls, 1)
        XCTAssertEqual(out.bytesWritten, payload.count)
        out.close()
        close(w)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(got() == payload)
        XCTAssertEqual(failures, [])
    }

    /// A pipe whose reader has gone is reported while nothing is queued (`blrecv | head` ends
    /// when head does, not at the next notification), as the EPIPE a write would get.
    func testReaderGoneIsReportedWhileIdle() {
        let (r, w) = makePipe()
        defer { close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        var failures: [Errno] = []
        out.onFailure = { failures.append($0) }
        out.write(Array("first\n".utf8))
        XCTAssertNoThrow(try out.flush())
        _ = loop.run(until: { false }, timeout: 0.1)
        XCTAssertEqual(failures, [])
        close(r)
        XCTAssertTrue(loop.run(until: { !failures.isEmpty }, timeout: 5))
        XCTAssertEqual(failures, [.pipe])
        // Nothing is written after a failure, and flush reports it.
        out.write(Array("more".utf8))
        XCTAssertEqual(out.queuedCount, 0)
        XCTAssertThrowsError(try out.flush())
    }

    /// The reader leaving with bytes still queued is a failure of the queued write.
    func testReaderGoneWithBytesQueued() {
        let (r, w) = makePipe()
        defer { close(w) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        var failures: [Errno] = []
        out.onFailure = { failures.append($0) }
        out.write(Self.pattern(200_000))
        XCTAssertNoThrow(try out.flush())
        XCTAssertGreaterThan(out.queuedCount, 0)
        close(r)
        XCTAssertTrue(loop.run(until: { !failures.isEmpty }, timeout: 5))
        XCTAssertEqual(failures, [.pipe])
        XCTAssertEqual(out.failure, .pipe)
    }

    /// A regular file takes everything in the flush, without the loop.
    func testRegularFileIsWrittenAtOnce() throws {
        let file = try XCTUnwrap(tmpfile())
        defer { fclose(file) }
        let fd = fileno(file)
        let loop = EventLoop()
        let out = QueuedOutput(fd: fd, loop: loop, limit: 1024)
        XCTAssertEqual(loop.watchCount, 0)
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
        let (r, w) = makePipe()
        defer { close(r) }
        let loop = EventLoop()
        let out = QueuedOutput(fd: w, loop: loop)
        let payload = Self.pattern(700_000, seed: 3)
        out.write(payload)
        try out.flush()
        XCTAssertGreaterThan(out.queuedCount, 0)
        let (done, got) = collect(r)
        try out.drain()
        XCTAssertEqual(out.queuedCount, 0)
        XCTAssertEqual(out.bytesWritten, payload.count)
        out.close()
        close(w)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(got() == payload)
    }
}
