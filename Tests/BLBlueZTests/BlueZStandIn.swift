import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// A stand-in owning org.bluez on a private bus for the BLBlueZ tests: the objects given are
/// exported under the root (ObjectManager included) by `connection`, and `client` talks to them
/// as the tools talk to bluetoothd.
final class BlueZStandIn {
    let bus: BusFixture
    let loop = EventLoop()
    /// org.bluez's side (close it, or release the name, to play bluetoothd leaving).
    let connection: DBusConnection
    /// Emits the signals bluetoothd would (InterfacesRemoved, PropertiesChanged).
    let tree = ExportedObjectTree(root: "/")
    let client: BlueZClient

    init(_ objects: [ExportedObject]) throws {
        bus = try BusFixture()
        connection = try DBusConnection(address: bus.address, loop: loop)
        for object in objects { try tree.add(object, announce: false) }
        try connection.export(tree)
        XCTAssertEqual(try connection.requestName(BlueZ.service), .primaryOwner)
        client = BlueZClient(loop: loop, bus: try DBusConnection(address: bus.address, loop: loop))
    }

    /// A link to the device at `path` (under /org/bluez/hciN), found up, not made by this process.
    func peer(_ path: String) -> Peer {
        Peer(client: client, device: DeviceInfo(path: path, properties: ["Address": .string(BluetoothAddress.fromDevicePath(path) ?? "")]),
             madeConnection: false, foundConnected: true)
    }

    func stop() {
        bus.stop()
    }
}
