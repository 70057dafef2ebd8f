import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// Discovery against a stand-in owning org.bluez on a private bus: a scan ends, saying why, when
/// its adapter goes away or is powered off, not only when bluetoothd does.
final class DiscoveryTests: XCTestCase {
    private var bluez: BlueZStandIn!
    private var loop: EventLoop { bluez.loop }
    private var tree: ExportedObjectTree { bluez.tree }
    private var client: BlueZClient { bluez.client }
    private var powered = true
    private var discovering = false
    /// StartDiscovery calls answered with `refusal` before one is taken.
    private var refusals = 0
    private var refusal = ("org.bluez.Error.InProgress", "Operation already in progress")
    private var startCalls = 0

    private static let adapter = "/org/bluez/hci0"

    override func setUpWithError() throws {
        try super.setUpWithError()
        bluez = try BlueZStandIn([ExportedObject(path: Self.adapter, interfaces: [
            ExportedInterface(BlueZ.adapterInterface)
                .property("Address") { .string("00:AA:00:00:00:00") }
                .property("Powered") { [unowned self] in .bool(self.powered) }
                .method("SetDiscoveryFilter") { _ = $0.reply([]) }
                .method("StartDiscovery") { [unowned self] call in
                    self.startCalls += 1
                    if self.refusals > 0 {
                        self.refusals -= 1
                        call.fail(name: self.refusal.0, message: self.refusal.1)
                        return
                    }
                    self.discovering = true
                    _ = call.reply([])
                }
                .method("StopDiscovery") { [unowned self] call in
                    self.discovering = false
                    _ = call.reply([])
                },
        ])])
    }

    override func tearDown() {
        bluez?.stop()
        bluez = nil
        super.tearDown()
    }

    /// Starts a discovery on hci0, runs `change` once it scans, and returns why it ended (nil if
    /// it did not within 3 s).
    private func scanEnding(after change: () throws -> Void) throws -> String? {
        let adapter = try client.adapter(named: "hci0")
        let discovery = Discovery(client: client, adapter: adapter)
        var reason: String?
        discovery.onGone = { reason = $0 }
        try discovery.start()
        XCTAssertTrue(loop.run(until: { self.discovering }, timeout: 3), "the scan did not start")
        try change()
        _ = loop.run(until: { reason != nil }, timeout: 3)
        discovery.stop()
        return reason
    }

    func testTheAdapterGoingAwayEndsTheScan() throws {
        XCTAssertEqual(try scanEnding { try tree.emitInterfacesRemoved(path: Self.adapter, interfaces: [BlueZ.adapterInterface]) },
                       "hci0 went away")
    }

    func testTheAdapterPoweredOffEndsTheScan() throws {
        XCTAssertEqual(try scanEnding {
            powered = false
            try tree.emitPropertiesChanged(path: Self.adapter, interface: BlueZ.adapterInterface, names: ["Powered"])
        }, "hci0 was powered off")
    }

    /// A bluetoothd that stops removes its adapters just before it leaves the bus: the reason
    /// given is its leaving.
    func testBluetoothdStoppingIsTheReasonOverItsAdapterGoing() throws {
        XCTAssertEqual(try scanEnding {
            try tree.emitInterfacesRemoved(path: Self.adapter, interfaces: [BlueZ.adapterInterface])
            try bluez.connection.releaseName(BlueZ.service)
        }, "bluetoothd stopped")
    }

    /// bluetoothd answers InProgress when the kernel will not start a discovery yet (the last
    /// one is still being stopped): asked again, the scan starts.
    func testStartDiscoveryIsAskedAgainWhileTheAdapterIsBusy() throws {
        refusals = 2
        let discovery = Discovery(client: client, adapter: try client.adapter(named: "hci0"))
        try discovery.start()
        XCTAssertEqual(startCalls, 3)
        XCTAssertTrue(discovering)
        discovery.stop()
    }

    /// An adapter that stays busy ends the start with bluetoothd's answer, once the time for
    /// asking again is over.
    func testAnAdapterThatStaysBusyEndsTheStart() throws {
        refusals = .max
        let discovery = Discovery(client: client, adapter: try client.adapter(named: "hci0"))
        let started = MonotonicClock.seconds()
        do {
            try discovery.start(busyLimit: 0.4)
            XCTFail("the scan started")
        } catch {
            XCTAssertTrue(error.message.hasPrefix("starting discovery on hci0: "), error.message)
            XCTAssertTrue(error.message.contains("in progress"), error.message)
        }
        XCTAssertGreaterThan(startCalls, 2)
        XCTAssertLessThan(MonotonicClock.seconds() - started, 2)
    }

    /// Other refusals are not asked again.
    func testOtherRefusalsEndTheStartAtOnce() throws {
        refusals = 1
        refusal = ("org.bluez.Error.NotReady", "Resource Not Ready")
        let discovery = Discovery(client: client, adapter: try client.adapter(named: "hci0"))
        XCTAssertThrowsError(try discovery.start())
        XCTAssertEqual(startCalls, 1)
    }

    func testOtherChangesDoNotEndTheScan() throws {
        XCTAssertNil(try scanEnding {
            try tree.emitPropertiesChanged(path: Self.adapter, interface: BlueZ.adapterInterface, names: ["Powered"])  // still on
            try tree.emitInterfacesRemoved(path: Self.adapter + "/dev_00_AA_01_00_00_01", interfaces: [BlueZ.deviceInterface])
        })
    }
}
