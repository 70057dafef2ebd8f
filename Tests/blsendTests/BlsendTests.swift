import XCTest
import BLTestSupport

/// What blsend does without Bluetooth: options, documentation, and a missing bus. Everything BLE
/// is tested on the VM bench (Tests/Integration).
final class BlsendTests: XCTestCase {
    func testDocsMatchHelp() throws {
        if let problems = try toolDocsProblems("blsend") { XCTFail(problems) }
    }

    func testUsageErrors() throws {
        for arguments in [[], ["A", "B"], ["--service", "nope", "DEV"], ["--nus", "--char", "180d", "DEV"],
                          ["--connect-timeout", "0", "DEV"], ["--count", "0", "DEV"], ["--bogus", "DEV"], [""], ["--adapter=", "DEV"]] {
            let result = try runTool("blsend", arguments)
            XCTAssertEqual(result.status, 64, "\(arguments): \(result.stderr)")
            XCTAssertTrue(result.stderr.hasPrefix("blsend: "), result.stderr)
            XCTAssertEqual(result.stderr.filter { $0 == "\n" }.count, 1, result.stderr)
        }
    }

    func testNoBusIsUnavailable() throws {
        let result = try runTool("blsend", ["AA:BB:CC:DD:EE:FF"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
        XCTAssertEqual(result.status, 69, result.stderr)
        XCTAssertTrue(result.stderr.hasPrefix("blsend: cannot connect to the system bus"), result.stderr)
    }
}
