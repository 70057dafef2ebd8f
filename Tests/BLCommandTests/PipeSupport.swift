import Dispatch
import Glibc
import XCTest

/// A plain (blocking) pipe for the output tests.
func makeBlockingPipe() -> (read: Int32, write: Int32) {
    var fds: [Int32] = [0, 0]
    XCTAssertEqual(pipe(&fds), 0)
    return (fds[0], fds[1])
}

/// Reads `fd` until EOF on another thread: wait on the semaphore, then call the closure for the
/// bytes read.
func collectUntilEOF(_ fd: Int32) -> (DispatchSemaphore, () -> [UInt8]) {
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
