import XCTest
import Foundation
import BLBlueZ
import BLCommand
import BLDBus
import BLTestSupport

/// blscan as a process against a stand-in bluetoothd on a private bus (an adapter that
/// discovers, and devices added as bluetoothd adds them): how a search ends. The real
/// bluetoothd is on the VM bench (Tests/Integration/20-blscan.test).
final class ScanSessionTests: XCTestCase {
    private var bus: BusFixture!
    private let loop = EventLoop()
    private var bluez: DBusConnection!
    private let tree = ExportedObjectTree(root: "/")
    private var starts = 0
    private var stops = 0

    override func setUpWithError() throws {
        bus = try BusFixture()
        bluez = try DBusConnection(address: bus.address, loop: loop)
        try tree.add(ExportedObject(path: "/org/bluez/hci0", interfaces: [
            ExportedInterface(BlueZ.adapterInterface)
                .property("Address") { .string("00:AA:00:00:00:00") }
                .property("Powered") { .bool(true) }
                .method("SetDiscoveryFilter") { call in call.reply([]) }
                .method("StartDiscovery") { [unowned self] call in self.starts += 1; call.reply([]) }
                .method("StopDiscovery") { [unowned self] call in self.stops += 1; call.reply([]) },
        ]), announce: false)
        try bluez.export(tree)
        XCTAssertEqual(try bluez.requestName(BlueZ.service), .primaryOwner)
    }

    override func tearDown() {
        bluez = nil
        bus?.stop()
        bus = nil
    }

    /// A device as bluetoothd first reports it, here without a name (its scan response, with
    /// the name, may come later), or with one.
    private func device(_ n: Int, name: String? = nil) -> ExportedObject {
        let address = String(format: "00:AA:01:00:00:%02X", n)
        let device = ExportedInterface(BlueZ.deviceInterface)
            .property("Address") { .string(address) }
            .property("AddressType") { .string("random") }
            .property("RSSI") { .int16(-50) }
            .property("UUIDs") { .stringArray([]) }
        if let name { device.property("Name") { .string(name) } }
        return ExportedObject(path: "/org/bluez/hci0/dev_" + address.replacingOccurrences(of: ":", with: "_"), interfaces: [device])
    }

    private func blscan(_ arguments: [String], stdout: Spawned.Stream = .pipe) throws -> Spawned {
        try Spawned(productsDirectory.appendingPathComponent("blscan").path, arguments,
                    environment: ProcessInfo.processInfo.environment.merging(["DBUS_SYSTEM_BUS_ADDRESS": bus.address]) { $1 },
                    stdin: .inherit, stdout: stdout)
    }

    /// Serves the bus until blscan has ended; its status, stdout and stderr.
    private func ended(_ child: Spawned) -> (status: Int32, out: String, err: String) {
        // In short turns: the child's end wakes nothing in this loop.
        let deadline = MonotonicClock.seconds() + 10
        while !child.hasEnded && MonotonicClock.seconds() < deadline { _ = loop.run(until: { false }, timeout: 0.05) }
        XCTAssertTrue(child.hasEnded, "blscan did not end")
        let out = String(decoding: Spawned.readAll(child.stdout), as: UTF8.self)
        let err = String(decoding: Spawned.readAll(child.stderr), as: UTF8.self)
        return (child.wait(), out, err)
    }

    /// A device that matched and waits for its name (up to a second) is printed however the
    /// search ends: here by a signal.
    func testADeviceWaitingForItsNameIsPrintedWhenASignalEndsTheSearch() throws {
        let child = try blscan(["--timeout", "30"])
        XCTAssertTrue(loop.run(until: { self.starts > 0 }, timeout: 10), "no discovery")
        try tree.add(device(1))
        _ = loop.run(until: { false }, timeout: 0.3)
        child.terminate()
        let (status, out, err) = ended(child)
        XCTAssertEqual(status, 130, err)
        XCTAssertTrue(out.hasPrefix("00:AA:01:00:00:01\trandom\t-50\t"), "stdout: \(out.debugDescription)")
    }

    /// ... and by bluetoothd going away.
    func testADeviceWaitingForItsNameIsPrintedWhenBluetoothdGoes() throws {
        let child = try blscan(["--timeout", "30"])
        XCTAssertTrue(loop.run(until: { self.starts > 0 }, timeout: 10), "no discovery")
        try tree.add(device(2))
        _ = loop.run(until: { false }, timeout: 0.3)
        try bluez.releaseName(BlueZ.service)
        let (status, out, err) = ended(child)
        XCTAssertEqual(status, 69)
        XCTAssertEqual(err, "blscan: bluetoothd stopped\n")
        XCTAssertTrue(out.hasPrefix("00:AA:01:00:00:02\trandom\t-50\t"), "stdout: \(out.debugDescription)")
    }

    /// Once --first has its device, the radio stops scanning at once, also while a reader that
    /// takes nothing holds the line back.
    func testFirstStopsTheDiscoveryBeforeWaitingForItsReader() throws {
        let (reader, writer) = try Spawned.pipe()
        defer { close(reader) }
        // A full pipe nobody reads.
        _ = fcntl(writer, F_SETFL, O_NONBLOCK)
        let filler = [UInt8](repeating: 0x41, count: 4096)
        while filler.withUnsafeBytes({ write(writer, $0.baseAddress, $0.count) }) > 0 {}
        _ = fcntl(writer, F_SETFL, 0)
        let child = try blscan(["--first", "--timeout", "30"], stdout: .fd(writer))
        close(writer)
        XCTAssertTrue(loop.run(until: { self.starts > 0 }, timeout: 10), "no discovery")
        try tree.add(device(3, name: "match"))
        XCTAssertTrue(loop.run(until: { self.stops > 0 }, timeout: 3), "still discovering while the line waits for its reader")
        XCTAssertFalse(child.hasEnded, "the line was not waited for")
        child.terminate()
        XCTAssertEqual(ended(child).status, 130)
    }
}
