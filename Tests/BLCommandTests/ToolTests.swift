import Glibc
import XCTest
@testable import BLCommand

final class ToolTests: XCTestCase {
    /// A tool started with stdin (or stdout) closed keeps the number taken, so the D-Bus socket
    /// opened next cannot become "stdin"; using it still fails as a closed descriptor would.
    /// Run in a forked child: other tests in this process open descriptors concurrently, and one
    /// of them would take the closed number first. The child only makes system calls.
    func testClosedStandardDescriptorStaysTakenAndUnusable() {
        let pid = fork()
        XCTAssertGreaterThanOrEqual(pid, 0)
        if pid == 0 {
            close(0)
            Tool.reserveStandardDescriptors()
            var status: Int32 = 0
            if fcntl(0, F_GETFD) < 0 { status |= 1 }             // 0 is taken again
            var byte: UInt8 = 0
            if read(0, &byte, 1) != -1 || errno != EBADF { status |= 2 }   // and unusable
            let next = open("/dev/null", O_RDONLY)
            if next <= 2 { status |= 4 }                          // the next open is not 0-2
            _exit(status)
        }
        var status: Int32 = 0
        XCTAssertEqual(waitpid(pid, &status, 0), pid)
        XCTAssertEqual(status & 0x7f, 0, "the child was killed by a signal")
        XCTAssertEqual((status >> 8) & 0xff, 0, "1: fd 0 not taken, 2: usable, 4: next open got 0-2")
    }

    func testPrintableReplacesEveryControlCharacter() {
        XCTAssertEqual(Tool.printable("plain é ✓"), "plain é ✓")
        XCTAssertEqual(Tool.printable("a\nb\tc\u{1B}[2Jd\u{7F}e\u{85}f\u{9F}g\u{A0}h"), "a?b?c?[2Jd?e?f?g\u{A0}h")
        XCTAssertEqual(Tool.printable("\r\n"), "??")
    }

    /// One rule for a failed write to stdout: a reader that left ends the tool cleanly, a drain
    /// given up for a signal is a quiet 130, anything else is 74 with the error.
    func testStdoutErrorMapping() {
        XCTAssertNil(ToolError.stdout(.pipe))
        let interrupted = ToolError.stdout(.interrupted)
        XCTAssertEqual(interrupted?.code, .interrupted)
        XCTAssertEqual(interrupted?.message, "")
        let other = ToolError.stdout(Errno(ENOSPC))
        XCTAssertEqual(other?.code, .ioError)
        XCTAssertEqual(other?.message, "stdout: \(Errno(ENOSPC))")
    }
}
