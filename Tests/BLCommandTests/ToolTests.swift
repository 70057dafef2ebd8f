import Glibc
import XCTest
@testable import BLCommand

final class ToolTests: XCTestCase {
    /// A tool started with stdin (or stdout) closed keeps the number taken, so the D-Bus socket
    /// opened next cannot become "stdin"; using it still fails as a closed descriptor would.
    func testClosedStandardDescriptorStaysTakenAndUnusable() {
        let saved = dup(0)
        XCTAssertGreaterThan(saved, 2)
        defer {
            dup2(saved, 0)
            close(saved)
        }
        close(0)
        Tool.reserveStandardDescriptors()
        XCTAssertGreaterThanOrEqual(fcntl(0, F_GETFD), 0, "descriptor 0 is taken again")
        var byte: UInt8 = 0
        XCTAssertEqual(read(0, &byte, 1), -1)
        XCTAssertEqual(errno, EBADF)
        let next = open("/dev/null", O_RDONLY)
        XCTAssertGreaterThan(next, 2, "the next descriptor opened is not a standard one")
        close(next)
    }
}
