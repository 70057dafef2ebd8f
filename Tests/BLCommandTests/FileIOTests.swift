import Dispatch
import Glibc
import XCTest
@testable import BLCommand

final class FileIOTests: XCTestCase {
    /// A standard output inherited non-blocking must not turn a full pipe into a write error:
    /// writeAll waits for room instead of failing with EAGAIN (and losing what it held).
    func testWriteAllWaitsOnANonBlockingPipe() throws {
        var fds: [Int32] = [0, 0]
        XCTAssertEqual(pipe(&fds), 0)
        try FileIO.setNonBlocking(fds[1])
        let size = 1 << 20   // far more than a pipe holds
        let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let readFD = fds[0]
        let received = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var got: [UInt8] = []
        DispatchQueue.global().async {
            var buffer = [UInt8](repeating: 0, count: 65536)
            usleep(100_000)   // let the writer find the pipe full first
            while true {
                let n = buffer.withUnsafeMutableBytes { Glibc.read(readFD, $0.baseAddress, $0.count) }
                if n <= 0 { break }
                got += buffer[0..<n]
            }
            received.signal()
        }
        XCTAssertNoThrow(try FileIO.writeAll(fds[1], payload))
        close(fds[1])
        received.wait()
        close(fds[0])
        XCTAssertEqual(got.count, size)
        XCTAssertTrue(got == payload)
    }
}
