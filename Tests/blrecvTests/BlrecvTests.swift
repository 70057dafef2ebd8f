import XCTest
import BLTestSupport

/// What blrecv does without Bluetooth: options, documentation, and a missing bus. Everything BLE
/// is tested on the VM bench (Tests/Integration).
final class BlrecvTests: XCTestCase {
    func testDocsMatchHelp() throws {
        if let problems = try toolDocsProblems("blrecv") { XCTFail(problems) }
    }

    func testUsageErrors() throws {
        let wrong: [[String]] = [
            [], ["A", "B"], ["--service", "nope", "DEV"], ["--nus", "--char", "180d", "DEV"],
            ["--connect-timeout", "0", "DEV"], ["--count", "0", "DEV"], ["--bogus", "DEV"], [""],
            ["--adapter=", "DEV"], ["--read", "--count", "1", "DEV"], ["--read", "--no-pull", "DEV"],
        ]
        if let problems = try usageErrorProblems("blrecv", wrong) { XCTFail(problems) }
    }

    func testNoBusIsUnavailable() throws {
        if let problems = try noBusProblems("blrecv", ["AA:BB:CC:DD:EE:FF"]) { XCTFail(problems) }
    }

    /// A signal ends it while it waits for a system bus that does not answer (130).
    func testSignalWhileTheBusSaysNothing() throws {
        if let problems = try silentBusProblems("blrecv", ["AA:BB:CC:DD:EE:FF"], status: 130) { XCTFail(problems) }
        // The bus's queue of connections full: connect() blocks, and the signal ends it.
        if let problems = try silentBusProblems("blrecv", ["AA:BB:CC:DD:EE:FF"], status: 143, full: true) { XCTFail(problems) }
    }

    /// Output it cannot write is said (74) before anything else is tried.
    func testUnwritableStdoutIsAnErrorAtOnce() throws {
        if let problems = try unwritableStdoutProblems("blrecv", ["AA:BB:CC:DD:EE:FF"]) { XCTFail(problems) }
    }
}
