import XCTest
import BLBlueZ
import BLCommand
import BLDBus
import BLTestSupport
@testable import blscan

/// What blscan does without Bluetooth: options, documentation, and a missing bus. Scanning
/// itself is tested on the VM bench (Tests/Integration).
final class BlscanTests: XCTestCase {
    func testDocsMatchHelp() throws {
        if let problems = try toolDocsProblems("blscan") { XCTFail(problems) }
    }

    func testUsageErrors() throws {
        let wrong: [[String]] = [
            ["--service", "xyz"], ["--rssi-min", "-200"], ["--rssi-min", "loud"], ["--timeout", "-1"],
            ["DEV"], ["--bogus"], ["--name="], ["--adapter="], ["--name", "--json"],
        ]
        if let problems = try usageErrorProblems("blscan", wrong) { XCTFail(problems) }
    }

    /// A name is whatever a nearby advertiser says: in text it neither splits the line or a
    /// field nor sends control sequences to a terminal; JSON keeps it exact.
    func testNamesWithControlCharacters() throws {
        let name = "a\tb\r\nc\u{1B}]0;title\u{07}d\u{9B}2Je\u{7F}f\u{0}g é"
        let device = DeviceInfo(path: "/org/bluez/hci0/dev_00_AA_01_00_00_01", properties: [
            "Address": .string("00:AA:01:00:00:01"), "AddressType": .string("random"), "Name": .string(name),
            "RSSI": .int16(-60), "UUIDs": .stringArray(["0000180d-0000-1000-8000-00805f9b34fb"]),
        ])
        let text = Scan().line(for: device)
        XCTAssertEqual(text, "00:AA:01:00:00:01\trandom\t-60\ta b c?]0;title?d?2Je?f?g é\t0000180d-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(text.split(separator: "\t", omittingEmptySubsequences: false).count, 5)
        var scan = Scan()
        scan.json = true
        let json = scan.line(for: device)
        XCTAssertTrue(json.contains("\"name\":" + JSON.quoted(name)), json)
        XCTAssertFalse(json.contains("\u{1B}"), json)
    }

    /// The filters blscan applies itself (bluetoothd merges every client's discovery filter, so
    /// it may report devices another client asked for).
    func testFiltersAreAppliedToEveryDevice() throws {
        func device(_ n: Int, name: String? = nil, alias: String? = nil, rssi: Int16? = nil, uuids: [String] = []) -> DeviceInfo {
            var properties: [String: DBusValue] = ["Address": .string("00:AA:01:00:00:0\(n)"), "AddressType": .string("random"),
                                                   "UUIDs": .stringArray(uuids)]
            if let name { properties["Name"] = .string(name) }
            if let alias { properties["Alias"] = .string(alias) }
            if let rssi { properties["RSSI"] = .int16(rssi) }
            return DeviceInfo(path: "/org/bluez/hci0/dev_00_AA_01_00_00_0\(n)", properties: properties)
        }
        var scan = Scan()
        XCTAssertTrue(scan.matches(device(1)), "no filter: every device")

        scan.rssiMin = -70
        XCTAssertTrue(scan.matches(device(1, rssi: -70)))
        XCTAssertTrue(scan.matches(device(1, rssi: -20)))
        XCTAssertFalse(scan.matches(device(1, rssi: -71)))
        XCTAssertFalse(scan.matches(device(1)), "no RSSI: not heard, so not heard strongly enough")

        scan = Scan()
        scan.name = "my-pi"
        XCTAssertTrue(scan.matches(device(1, name: "my-pi")))
        XCTAssertTrue(scan.matches(device(1, name: "raspberrypi", alias: "my-pi")), "an alias set in bluetoothd")
        XCTAssertFalse(scan.matches(device(1, name: "my-pi2")))
        XCTAssertFalse(scan.matches(device(1, name: "My-Pi")), "names are compared exactly")
        XCTAssertFalse(scan.matches(device(1)))

        scan = Scan()
        scan.service = try XCTUnwrap(BluetoothUUID.normalize("180D"))
        XCTAssertTrue(scan.matches(device(1, uuids: ["0000180D-0000-1000-8000-00805F9B34FB"])), "16-bit given, 128-bit in either case")
        XCTAssertTrue(scan.matches(device(1, uuids: ["0000fff0-0000-1000-8000-00805f9b34fb", "0000180d-0000-1000-8000-00805f9b34fb"])))
        XCTAssertFalse(scan.matches(device(1, uuids: ["0000180e-0000-1000-8000-00805f9b34fb"])))
        XCTAssertFalse(scan.matches(device(1)))

        scan.rssiMin = -70
        scan.name = "hr"
        XCTAssertTrue(scan.matches(device(1, name: "hr", rssi: -50, uuids: ["0000180d-0000-1000-8000-00805f9b34fb"])))
        XCTAssertFalse(scan.matches(device(1, name: "hr", rssi: -90, uuids: ["0000180d-0000-1000-8000-00805f9b34fb"])), "all filters at once")
    }

    func testNoBusIsUnavailable() throws {
        if let problems = try noBusProblems("blscan", ["--timeout", "1"]) { XCTFail(problems) }
    }

    /// A signal ends it while it waits for a system bus that does not answer (130).
    func testSignalWhileTheBusSaysNothing() throws {
        if let problems = try silentBusProblems("blscan", ["--timeout", "1"], status: 130) { XCTFail(problems) }
        // The bus's queue of connections full: connect() blocks, and the signal ends it.
        if let problems = try silentBusProblems("blscan", ["--timeout", "1"], status: 143, full: true) { XCTFail(problems) }
    }

    /// Output it cannot write is said (74) before anything else is tried.
    func testUnwritableStdoutIsAnErrorAtOnce() throws {
        if let problems = try unwritableStdoutProblems("blscan", ["--timeout", "1"]) { XCTFail(problems) }
    }
}
