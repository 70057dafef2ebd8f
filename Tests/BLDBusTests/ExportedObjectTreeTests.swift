import XCTest
import BLCommand
@testable import BLDBus

/// A GATT-application-shaped tree on B, inspected by A through the standard interfaces.
final class ExportedObjectTreeTests: BusTestCase {
    var tree: ExportedObjectTree!
    var handle: UInt16 = 0
    var written: [[UInt8]] = []

    override func setUpWithError() throws {
        try super.setUpWithError()
        tree = ExportedObjectTree(root: "/app")
        let service = ExportedInterface("org.bluez.GattService1")
            .property("UUID") { .string("6e400001-b5a3-f393-e0a9-e50e24dcca9e") }
            .property("Primary") { .bool(true) }
        let chrc = ExportedInterface("org.bluez.GattCharacteristic1")
            .property("UUID") { .string("6e400002-b5a3-f393-e0a9-e50e24dcca9e") }
            .property("Service") { .objectPath("/app/service0") }
            .property("Flags") { .stringArray(["read", "write", "notify"]) }
            .property("Handle", set: { [unowned self] value throws(DBusError) in
                guard let h = value.uint16 else { throw DBusError.invalidArgs("Handle must be q") }
                self.handle = h
            }) { [unowned self] in .uint16(self.handle) }
            .method("ReadValue", inSignature: "a{sv}", outSignature: "ay") { call in
                let offset = Int(call.arguments[0]["offset"]?.uint16 ?? 0)
                call.reply(.bytes(Array([UInt8]("hello".utf8).dropFirst(offset))))
            }
            .method("WriteValue", inSignature: "aya{sv}") { [unowned self] call in
                self.written.append(call.arguments[0].bytes ?? [])
                call.reply()
            }
        try tree.add(ExportedObject(path: "/app/service0", interfaces: [service]))
        try tree.add(ExportedObject(path: "/app/service0/char0", interfaces: [chrc]))
        // An LE advertisement in the same tree type: GetAll + Release.
        let adv = ExportedInterface("org.bluez.LEAdvertisement1")
            .property("Type") { .string("peripheral") }
            .property("ServiceUUIDs") { .stringArray(["6e400001-b5a3-f393-e0a9-e50e24dcca9e"]) }
            .property("LocalName") { .string("blpipe") }
            .method("Release") { call in call.reply() }
        try tree.add(ExportedObject(path: "/app/adv0", interfaces: [adv]))
        try b.export(tree)
    }

    override func tearDown() {
        tree = nil
        super.tearDown()
    }

    private func call(_ path: String, _ interface: String, _ member: String, _ args: [DBusValue] = []) throws -> [DBusValue] {
        try a.callAndWait(destination: b.uniqueName, path: path, interface: interface, member: member, args: args, timeout: 5)
    }

    private func assertError(_ name: String, file: StaticString = #filePath, line: UInt = #line, _ body: () throws -> Void) {
        XCTAssertThrowsError(try body(), file: file, line: line) {
            XCTAssertEqual(($0 as? DBusError)?.name, name, "\($0)", file: file, line: line)
        }
    }

    func testGetManagedObjects() throws {
        let reply = try call("/app", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")
        XCTAssertEqual(reply.count, 1)
        XCTAssertEqual(reply[0].signature, "a{oa{sa{sv}}}")
        XCTAssertEqual(reply[0].entries?.map(\.key), [.objectPath("/app/adv0"), .objectPath("/app/service0"),
                                                      .objectPath("/app/service0/char0")], "sorted by path")
        let objects = try XCTUnwrap(reply[0].managedObjects)
        let chrc = try XCTUnwrap(objects["/app/service0/char0"]?["org.bluez.GattCharacteristic1"])
        XCTAssertEqual(chrc["Service"]?.objectPath, "/app/service0")
        XCTAssertEqual(chrc["Flags"]?.stringArray, ["read", "write", "notify"])
        XCTAssertEqual(objects["/app/service0"]?["org.bluez.GattService1"]?["Primary"]?.bool, true)
        // Property order is the order of definition.
        let chrcEntries = reply[0]["/app/service0/char0"]?["org.bluez.GattCharacteristic1"]?.entries?.map { $0.key.string! }
        XCTAssertEqual(chrcEntries, ["UUID", "Service", "Flags", "Handle"])
        // Only the root is an object manager.
        assertError(DBusError.Name.unknownMethod) {
            _ = try self.call("/app/service0", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")
        }
    }

    func testPropertiesGetGetAllSet() throws {
        let p = "org.freedesktop.DBus.Properties"
        let c = "org.bluez.GattCharacteristic1"
        XCTAssertEqual(try call("/app/service0/char0", p, "Get", [.string(c), .string("UUID")]),
                       [.variant(.string("6e400002-b5a3-f393-e0a9-e50e24dcca9e"))])
        let all = try call("/app/adv0", p, "GetAll", [.string("org.bluez.LEAdvertisement1")])
        XCTAssertEqual(all.first?.signature, "a{sv}")
        XCTAssertEqual(all.first?.dictionary?["LocalName"]?.string, "blpipe")
        XCTAssertEqual(all.first?.dictionary?.count, 3)

        // bluetoothd reports the handle it assigned through Set (bluez-notes §3.1).
        _ = try call("/app/service0/char0", p, "Set", [.string(c), .string("Handle"), .variant(.uint16(0x2A))])
        XCTAssertEqual(handle, 0x2A)
        XCTAssertEqual(try call("/app/service0/char0", p, "Get", [.string(c), .string("Handle")]).first?.uint16, 0x2A)

        assertError(DBusError.Name.invalidArgs) {
            _ = try self.call("/app/service0/char0", p, "Set", [.string(c), .string("Handle"), .variant(.string("x"))])
        }
        assertError(DBusError.Name.propertyReadOnly) {
            _ = try self.call("/app/service0/char0", p, "Set", [.string(c), .string("UUID"), .variant(.string("x"))])
        }
        assertError(DBusError.Name.unknownProperty) {
            _ = try self.call("/app/service0/char0", p, "Get", [.string(c), .string("Nope")])
        }
        assertError(DBusError.Name.unknownInterface) {
            _ = try self.call("/app/service0/char0", p, "GetAll", [.string("org.example.Nope")])
        }
        assertError(DBusError.Name.invalidArgs) {
            _ = try self.call("/app/service0/char0", p, "Get", [.string(c)])
        }
    }

    func testMethodsDispatchAndSignatureCheck() throws {
        let c = "org.bluez.GattCharacteristic1"
        let options: DBusValue = .stringDict(["device": .objectPath("/org/bluez/hci0/dev_AA"), "mtu": .uint16(517),
                                              "offset": .uint16(2)])
        XCTAssertEqual(try call("/app/service0/char0", c, "ReadValue", [options]), [.bytes(Array("llo".utf8))])
        _ = try call("/app/service0/char0", c, "WriteValue", [.bytes([1, 2, 3]), .stringDict([:])])
        XCTAssertEqual(written, [[1, 2, 3]])
        assertError(DBusError.Name.invalidArgs) {
            _ = try self.call("/app/service0/char0", c, "WriteValue", [.string("wrong")])
        }
        // No interface given: found by member name.
        let m = try DBusMessage.methodCall(destination: b.uniqueName, path: "/app/adv0", interface: nil, member: "Release")
        XCTAssertEqual(try a.callAndWait(m).kind, .methodReturn)
    }

    func testUnknownMethodObjectAndInterface() {
        assertError(DBusError.Name.unknownMethod) {
            _ = try self.call("/app/service0/char0", "org.bluez.GattCharacteristic1", "Explode")
        }
        assertError(DBusError.Name.unknownMethod) {
            _ = try self.call("/app/service0/char0", "org.example.NotThere", "ReadValue", [.stringDict([:])])
        }
        assertError(DBusError.Name.unknownObject) {
            _ = try self.call("/app/service0/char9", "org.bluez.GattCharacteristic1", "ReadValue", [.stringDict([:])])
        }
        assertError(DBusError.Name.unknownObject) {
            _ = try self.call("/app/nothing", "org.freedesktop.DBus.Properties", "GetAll", [.string("x.y")])
        }
    }

    func testIntrospect() throws {
        let i = "org.freedesktop.DBus.Introspectable"
        let root = try XCTUnwrap(try call("/app", i, "Introspect").first?.string)
        XCTAssertTrue(root.contains("<interface name=\"org.freedesktop.DBus.ObjectManager\">"), root)
        XCTAssertTrue(root.contains("<node name=\"service0\"/>"), root)
        XCTAssertTrue(root.contains("<node name=\"adv0\"/>"), root)
        XCTAssertFalse(root.contains("<node name=\"char0\"/>"), "only immediate children")
        let chrc = try XCTUnwrap(try call("/app/service0/char0", i, "Introspect").first?.string)
        XCTAssertTrue(chrc.contains("<interface name=\"org.bluez.GattCharacteristic1\">"), chrc)
        XCTAssertTrue(chrc.contains("<method name=\"WriteValue\"><arg type=\"ay\" direction=\"in\"/><arg type=\"a{sv}\" direction=\"in\"/></method>"), chrc)
        XCTAssertTrue(chrc.contains("<property name=\"Handle\" type=\"q\" access=\"readwrite\"/>"), chrc)
        XCTAssertTrue(chrc.contains("<property name=\"UUID\" type=\"s\" access=\"read\"/>"), chrc)
        assertError(DBusError.Name.unknownObject) { _ = try self.call("/app/zzz", i, "Introspect") }
    }

    func testSecondExportOfTheSameRootFails() {
        let other = ExportedObjectTree(root: "/app")
        XCTAssertThrowsError(try b.export(other)) {
            XCTAssertEqual(($0 as? DBusError)?.name, DBusError.Name.objectPathInUse, "\($0)")
        }
        XCTAssertNil(other.connection)
        XCTAssertThrowsError(try a.export(tree), "a tree is exported on one connection at a time")
    }

    func testUnexportStopsServing() throws {
        b.unexport(tree)
        XCTAssertNil(tree.connection)
        // Nothing is registered any more: libdbus itself answers (UnknownMethod in 1.14).
        XCTAssertThrowsError(try call("/app", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")) {
            let name = ($0 as? DBusError)?.name
            XCTAssertTrue(name == DBusError.Name.unknownMethod || name == DBusError.Name.unknownObject, "\($0)")
        }
    }

    func testObjectsOutsideTheRootAreRefused() {
        XCTAssertThrowsError(try tree.add(ExportedObject(path: "/other"))) {
            XCTAssertEqual(($0 as? DBusError)?.name, DBusError.Name.invalidArgs)
        }
        XCTAssertThrowsError(try tree.add(ExportedObject(path: "/application")), "a prefix of a component is not below")
    }
}
