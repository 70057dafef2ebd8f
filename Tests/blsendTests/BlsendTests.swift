import XCTest
import BLTestSupport

/// What blsend does without Bluetooth: options, documentation, and a missing bus. Everything BLE
/// is tested on the VM bench (Tests/Integration).
final class BlsendTests: XCTestCase {
    func testDocsMatchHelp() throws {
        if let problems = try toolDocsProblems("blsend") { XCTFail(problems) }
    }

    func testUsageErrors() throws {
        let wrong: [[String]] = [
            [], ["A", "B"], ["--service", "nope", "DEV"], ["--nus", "--char", "180d", "DEV"],
            ["--connect-timeout", "0", "DEV"], ["--count", "0", "DEV"], ["--bogus", "DEV"], [""],
            ["--adapter=", "DEV"],
        ]
        if let problems = try usageErrorProblems("blsend", wrong) { XCTFail(problems) }
    }

    func testNoBusIsUnavailable() throws {
        if let problems = try noBusProblems("blsend", ["AA:BB:CC:DD:EE:FF"]) { XCTFail(problems) }
    }

    /// Input it cannot read is said (74) before the bus, a scan or a connection is tried.
    func testUnreadableStdinIsAnErrorAtOnce() throws {
        let blsend = productsDirectory.appendingPathComponent("blsend").path
        for (redirection, problem) in [("< /", "Is a directory"), ("<&-", "Bad file descriptor")] {
            let result = try runProgram("/bin/bash", ["-c", "exec \"$0\" AA:BB:CC:DD:EE:FF \(redirection)", blsend],
                                        environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
            XCTAssertEqual(result.status, 74, redirection)
            XCTAssertEqual(result.stderr, "blsend: stdin: \(problem) (0 bytes confirmed)\n", redirection)
        }
    }

    /// A signal ends it while it waits for a system bus that does not answer (130).
    func testSignalWhileTheBusSaysNothing() throws {
        if let problems = try silentBusProblems("blsend", ["AA:BB:CC:DD:EE:FF"], status: 130) { XCTFail(problems) }
        // The bus's queue of connections full: connect() blocks, and the signal ends it.
        if let problems = try silentBusProblems("blsend", ["AA:BB:CC:DD:EE:FF"], status: 143, full: true) { XCTFail(problems) }
    }

    /// Output it cannot write is said (74) before anything else is tried.
    func testUnwritableStdoutIsAnErrorAtOnce() throws {
        if let problems = try unwritableStdoutProblems("blsend", ["--reply", "AA:BB:CC:DD:EE:FF"]) { XCTFail(problems) }
    }
}
