import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// LinkWatch against a private bus where a stand-in owns org.bluez and sends what bluetoothd
/// sends: which signals end a link in use, and which do not.
final class LinkWatchTests: XCTestCase {
    private var bluez: BlueZStandIn!
    private var loop: EventLoop { bluez.loop }
    private var connected = true
    private var peer: Peer!
    private var losses: [LinkWatch.Loss] = []
    private var watch: LinkWatch!

    private static let device = "/org/bluez/hci0/dev_00_AA_01_00_00_01"
    private static let service = device + "/service0010"
    private static let char = service + "/char0011"

    override func setUpWithError() throws {
        try super.setUpWithError()
        bluez = try BlueZStandIn([ExportedObject(path: Self.device, interfaces: [
            ExportedInterface(BlueZ.deviceInterface).property("Connected") { [unowned self] in .bool(self.connected) },
        ])])
        peer = bluez.peer(Self.device)
        watch = try peer.watch(characteristics: [Self.char]) { [unowned self] in self.losses.append($0) }
    }

    override func tearDown() {
        watch = nil
        peer = nil
        bluez?.stop()
        bluez = nil
        super.tearDown()
    }

    private func removed(_ path: String, _ interfaces: [String]) throws {
        try bluez.tree.emitInterfacesRemoved(path: path, interfaces: interfaces)
    }

    /// Runs the loop for `seconds`, or until a loss is seen.
    private func settle(_ seconds: Double = 2) {
        _ = loop.run(until: { !self.losses.isEmpty }, timeout: seconds)
        // A second loss would come within the same time.
        _ = loop.run(until: { self.losses.count > 1 }, timeout: 0.7)
    }

    func testServiceRemovedWhileTheLinkStaysIsTheCharacteristicGoing() throws {
        try removed(Self.service, [BlueZ.gattServiceInterface])
        settle()
        XCTAssertEqual(losses, [.removed(Self.char)])
        XCTAssertEqual(peer.describe(losses[0], uuid: "fff1"), "characteristic fff1 of 00:AA:01:00:00:01 went away (its services changed)")
    }

    func testCharacteristicRemovedAsTheLinkGoesIsADisconnect() throws {
        // bluetoothd takes the objects out first, then says the link is down.
        try removed(Self.char, [BlueZ.gattCharacteristicInterface])
        connected = false
        try bluez.tree.emitPropertiesChanged(path: Self.device, interface: BlueZ.deviceInterface, names: ["Connected"])
        settle()
        XCTAssertEqual(losses, [.disconnected])
    }

    func testRemovalSeenWithTheLinkAlreadyDownIsADisconnect() throws {
        // No signal for Connected at all (bluez-notes §9.5): the property says it.
        connected = false
        try removed(Self.service, [BlueZ.gattServiceInterface])
        settle()
        XCTAssertEqual(losses, [.disconnected])
    }

    /// The link went before the watch began (no signal will come): the watch says so at once,
    /// once its maker holds it.
    func testALinkAlreadyDownIsToldAtOnce() throws {
        connected = false
        var early: [LinkWatch.Loss] = []
        let started = MonotonicClock.seconds()
        let second = try peer.watch(characteristics: [Self.char]) { early.append($0) }
        XCTAssertEqual(early, [], "told before the watch was returned")
        XCTAssertTrue(loop.run(until: { !early.isEmpty }, timeout: 2))
        XCTAssertLessThan(MonotonicClock.seconds() - started, 0.5)
        XCTAssertEqual(early, [.disconnected])
        second.cancel()
    }

    func testOtherObjectsAndOtherInterfacesEndNothing() throws {
        try removed("/org/bluez/hci0/dev_00_AA_01_00_00_02/service0010", [BlueZ.gattServiceInterface])
        try removed(Self.char + "/desc0013", ["org.bluez.GattDescriptor1"])
        try removed(Self.device, ["org.bluez.Battery1"])
        try removed("/org/bluez/hci0", ["org.bluez.Media1"])
        settle(1)
        XCTAssertEqual(losses, [])
        try removed(Self.device, [BlueZ.deviceInterface])
        settle()
        XCTAssertEqual(losses, [.disconnected])
    }

    func testAdapterRemovedIsADisconnect() throws {
        try removed("/org/bluez/hci0", [BlueZ.adapterInterface])
        settle()
        XCTAssertEqual(losses, [.disconnected])
    }

    func testBluetoothdLeavingTheBus() throws {
        bluez.connection.close()
        settle()
        XCTAssertEqual(losses, [.bluetoothdStopped])
    }

    /// The bus itself going (dbus-daemon killed: no NameOwnerChanged ever comes) ends the watch
    /// too, and says so.
    func testTheBusGoing() throws {
        bluez.bus.kill()
        settle()
        XCTAssertEqual(losses, [.bluetoothdStopped])
        XCTAssertEqual(peer.describe(.bluetoothdStopped, uuid: "fff1"), "lost the connection to the system bus")
    }

    func testCancelledWatchReportsNothing() throws {
        watch.cancel()
        try removed(Self.device, [BlueZ.deviceInterface])
        settle(1)
        XCTAssertEqual(losses, [])
    }
}
