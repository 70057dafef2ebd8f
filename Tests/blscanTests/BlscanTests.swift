import XCTest
import BLTestSupport

/// What blscan does without Bluetooth: options, documentation, and a missing bus. Scanning
/// itself is tested on the VM bench (Tests/Integration).
final class BlscanTests: XCTestCase {
    func testDocsMatchHelp() throws {
        if let problems = try toolDocsProblems("blscan") { XCTFail(problems) }
    }

    func testUsageErrors() throws {
        for arguments in [["--service", "xyz"], ["--rssi-min", "-200"], ["--rssi-min", "loud"], ["--timeout", "-1"], ["DEV"], ["--bogus"]] {
            let result = try runTool("blscan", arguments)
            XCTAssertEqual(result.status, 64, "\(arguments): \(result.stderr)")
            XCTAssertTrue(result.stderr.hasPrefix("blscan: "), result.stderr)
            XCTAssertEqual(result.stderr.filter { $0 == "\n" }.count, 1, result.stderr)
        }
    }

    func testNoBusIsUnavailable() throws {
        let result = try runTool("blscan", ["--timeout", "1"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
        XCTAssertEqual(result.status, 69, result.stderr)
        XCTAssertTrue(result.stderr.hasPrefix("blscan: cannot connect to the system bus"), result.stderr)
    }
}
