import XCTest
import BLTestSupport

/// What blrecv does without Bluetooth: options, documentation, and a missing bus. Everything BLE
/// is tested on the VM bench (Tests/Integration).
final class BlrecvTests: XCTestCase {
    func testDocsMatchHelp() throws {
        if let problems = try toolDocsProblems("blrecv") { XCTFail(problems) }
    }

    func testUsageErrors() throws {
        for arguments in [[], ["A", "B"], ["--service", "nope", "DEV"], ["--nus", "--char", "180d", "DEV"],
                          ["--connect-timeout", "0", "DEV"], ["--count", "0", "DEV"], ["--bogus", "DEV"], [""], ["--adapter=", "DEV"], ["--read", "--count", "1", "DEV"], ["--read", "--no-pull", "DEV"]] {
            let result = try runTool("blrecv", arguments)
            XCTAssertEqual(result.status, 64, "\(arguments): \(result.stderr)")
            XCTAssertTrue(result.stderr.hasPrefix("blrecv: "), result.stderr)
            XCTAssertEqual(result.stderr.filter { $0 == "\n" }.count, 1, result.stderr)
        }
    }

    func testNoBusIsUnavailable() throws {
        let result = try runTool("blrecv", ["AA:BB:CC:DD:EE:FF"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
        XCTAssertEqual(result.status, 69, result.stderr)
        XCTAssertTrue(result.stderr.hasPrefix("blrecv: cannot connect to the system bus"), result.stderr)
    }
}
