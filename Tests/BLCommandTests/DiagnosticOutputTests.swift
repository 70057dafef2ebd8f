import Dispatch
import Glibc
import XCTest
import BLTestSupport
@testable import BLCommand

final class DiagnosticOutputTests: XCTestCase {
    override func setUp() {
        super.setUp()
        ignoreSIGPIPE()
    }

    /// Fills the pipe through a non-blocking description of its own, leaving `fd` blocking.
    private func fill(_ fd: Int32) -> Int {
        let own = open("/proc/self/fd/\(fd)", O_WRONLY | O_NONBLOCK)
        XCTAssertGreaterThanOrEqual(own, 0)
        defer { close(own) }
        let block = [UInt8](repeating: UInt8(ascii: "x"), count: 4096)
        var total = 0
        while true {
            let n = block.withUnsafeBytes { Glibc.write(own, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            total += n
        }
        return total
    }

    /// Reads what is in the pipe now (its write end still open).
    private func readAvailable(_ fd: Int32) -> [UInt8] {
        var got: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&p, 1, 0) <= 0 { break }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            got += buffer[0..<n]
        }
        return got
    }

    /// With stderr full and unread, lines are accepted without waiting until the limit, then
    /// dropped whole and counted; once the reader reads, the loop writes what waited and the next
    /// line is preceded by the count of those dropped. No line arrives cut.
    func testStalledReaderDropsWholeLinesAndSaysHowMany() {
        let (r, w) = makeBlockingPipe()
        defer { close(r); close(w) }
        let filler = fill(w)
        XCTAssertGreaterThan(filler, 0)
        let loop = EventLoop()
        let out = DiagnosticOutput(fd: w, loop: loop, prefix: "tool: ", limit: 1000)

        let started = MonotonicClock.seconds()
        var accepted = 0
        for i in 0..<200 {
            let line = "tool: line \(i) "
            if out.write(line + String(repeating: ".", count: 49 - line.utf8.count) + "\n") { accepted += 1 }
        }
        XCTAssertLessThan(MonotonicClock.seconds() - started, 5, "writing to a full pipe waited")
        XCTAssertEqual(accepted, 20, "1000 bytes hold twenty 50-byte lines")
        XCTAssertEqual(out.droppedLines, 180)
        XCTAssertEqual(out.queuedCount, 1000)

        // The reader catches up; the loop writes the queued lines.
        var got = Array(readAvailable(r).dropFirst(filler))
        XCTAssertTrue(loop.run(until: { got += self.readAvailable(r); return out.queuedCount == 0 }, timeout: 10))
        got += readAvailable(r)
        XCTAssertEqual(got.count, 1000)

        XCTAssertTrue(out.write("tool: after\n"))
        XCTAssertEqual(out.droppedLines, 0)
        got += readAvailable(r)
        let text = String(decoding: got, as: UTF8.self)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        XCTAssertEqual(lines.count, 23)   // 20 lines, the note, "after", and "" after the last \n
        for line in lines.prefix(20) { XCTAssertEqual(line.count, 49, "a line arrived cut: \(line)") }
        XCTAssertEqual(lines[20], "tool: 180 diagnostic lines dropped: stderr was not being read")
        XCTAssertEqual(lines[21], "tool: after")
    }

    /// finish() waits for the reader to take what is queued, and reports lines still uncounted.
    func testFinishWritesWhatWaitsAndTheDroppedCount() {
        let (r, w) = makeBlockingPipe()
        defer { close(r) }
        let filler = fill(w)
        let loop = EventLoop()
        let out = DiagnosticOutput(fd: w, loop: loop, prefix: "tool: ", limit: 100)
        XCTAssertTrue(out.write(String(repeating: "a", count: 59) + "\n"))
        XCTAssertFalse(out.write(String(repeating: "b", count: 59) + "\n"))

        let (done, got) = collectUntilEOF(r)
        out.finish()
        close(w)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        let text = String(decoding: got().dropFirst(filler), as: UTF8.self)
        XCTAssertEqual(text, String(repeating: "a", count: 59) + "\n"
            + "tool: 1 diagnostic line dropped: stderr was not being read\n")
    }

    /// A stderr whose reader has gone ends the diagnostics quietly (no SIGPIPE death, no error).
    func testReaderGoneEndsDiagnosticsQuietly() {
        let (r, w) = makeBlockingPipe()
        defer { close(w) }
        close(r)
        let loop = EventLoop()
        let out = DiagnosticOutput(fd: w, loop: loop, prefix: "tool: ")
        XCTAssertFalse(out.write("tool: one\n"))
        XCTAssertFalse(out.write("tool: two\n"))
        XCTAssertEqual(out.queuedCount, 0)
        out.finish()
    }
}
