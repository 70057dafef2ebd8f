import XCTest
import BLCommand
@testable import BLDBus

/// Values sent from one connection to an echo method on another (through a real dbus-daemon)
/// must come back identical.
final class DBusValueTests: BusTestCase {
    var tree: ExportedObjectTree!

    override func setUpWithError() throws {
        try super.setUpWithError()
        tree = ExportedObjectTree(root: "/test")
        let echo = ExportedInterface("org.example.Echo")
            .method("Echo") { call in call.reply(call.arguments) }
            .method("Signature") { call in call.reply(.string(call.message.signature)) }
        try tree.add(ExportedObject(path: "/test/echo", interfaces: [echo]))
        try b.export(tree)
    }

    override func tearDown() {
        tree = nil
        super.tearDown()
    }

    private func echo(_ values: [DBusValue], file: StaticString = #filePath, line: UInt = #line) throws -> [DBusValue] {
        try a.callAndWait(destination: b.uniqueName, path: "/test/echo", interface: "org.example.Echo",
                          member: "Echo", args: values, timeout: 10)
    }

    private static var managedObjectsSample: DBusValue {
        // a{oa{sa{sv}}}, as in GetManagedObjects.
        .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", [
            (key: .objectPath("/org/bluez/hci0"), value: .dictionary(keySignature: "s", valueSignature: "a{sv}", [
                (key: .string("org.bluez.Adapter1"), value: .stringDict(ordered: [
                    ("Address", .string("00:11:22:33:44:55")),
                    ("Powered", .bool(true)),
                    ("UUIDs", .stringArray(["1800", "1801"])),
                ])),
                (key: .string("org.freedesktop.DBus.Properties"), value: .stringDict([:])),
            ])),
            (key: .objectPath("/org/bluez/hci0/dev_AA"), value: .dictionary(keySignature: "s", valueSignature: "a{sv}", [])),
        ])
    }

    func testEveryTypeRoundTrips() throws {
        let values: [DBusValue] = [
            .byte(0xFF), .byte(0),
            .bool(true), .bool(false),
            .int16(.min), .uint16(.max),
            .int32(.min), .uint32(.max),
            .int64(.min), .uint64(.max),
            .double(-1.5), .double(.pi),
            .string(""), .string("héllo ✓ 😀"),
            .objectPath("/"), .objectPath("/org/bluez/hci0/dev_AA_BB"),
            .signature(""), .signature("a{oa{sa{sv}}}"),
            .stringArray(["a", "b", ""]),
            .objectPathArray([]),
            .array(elementSignature: "a{sv}", []),
            .array(elementSignature: "(so)", [.structure([.string("x"), .objectPath("/x")])]),
            .array(elementSignature: "ay", [.bytes([1, 2]), .bytes([])]),
            .bytes([]),
            .bytes([0, 1, 2, 255]),
            .stringDict(["UUID": .string("180d"), "Primary": .bool(true), "Handle": .uint16(0x10)]),
            .dictionary(keySignature: "q", valueSignature: "v", [(key: .uint16(0x004C), value: .variant(.bytes([1, 2, 3])))]),
            .dictionary(keySignature: "s", valueSignature: "s", []),
            Self.managedObjectsSample,
            .structure([.string("s"), .uint32(7), .variant(.variant(.variant(.int32(-3))))]),
            .variant(.stringArray(["nested"])),
            .variant(.structure([.bytes([9]), .dictionary(keySignature: "s", valueSignature: "v", [])])),
            .variant(.variant(Self.managedObjectsSample)),
        ]
        let back = try echo(values)
        XCTAssertEqual(back.count, values.count)
        for (i, (sent, received)) in zip(values, back).enumerated() {
            XCTAssertEqual(sent, received, "value \(i): \(sent.signature)")
            XCTAssertEqual(sent.signature, received.signature)
        }
        let signature = try a.callAndWait(destination: b.uniqueName, path: "/test/echo", interface: "org.example.Echo",
                                          member: "Signature", args: values)
        XCTAssertEqual(signature.first?.string, values.map(\.signature).joined())
    }

    func testManagedObjectsAccessors() throws {
        let back = try echo([Self.managedObjectsSample])
        let objects = try XCTUnwrap(back.first?.managedObjects)
        XCTAssertEqual(Set(objects.keys), ["/org/bluez/hci0", "/org/bluez/hci0/dev_AA"])
        let adapter = try XCTUnwrap(objects["/org/bluez/hci0"]?["org.bluez.Adapter1"])
        XCTAssertEqual(adapter["Address"]?.string, "00:11:22:33:44:55")
        XCTAssertEqual(adapter["Powered"]?.bool, true)
        XCTAssertEqual(adapter["UUIDs"]?.stringArray, ["1800", "1801"])
        XCTAssertEqual(objects["/org/bluez/hci0/dev_AA"]?.isEmpty, true)
        XCTAssertEqual(back.first?["/org/bluez/hci0"]?["org.bluez.Adapter1"]?["Powered"]?.bool, true)
    }

    func testLargeAndEmptyByteArrays() throws {
        var big = [UInt8](repeating: 0, count: 1 << 20)
        for i in big.indices { big[i] = UInt8(truncatingIfNeeded: i &* 31 &+ i >> 8) }
        let back = try echo([.bytes([]), .bytes(big), .bytes([0x42])])
        XCTAssertEqual(back.count, 3)
        XCTAssertEqual(back[0].bytes, [])
        XCTAssertEqual(back[1].bytes?.count, big.count)
        XCTAssertTrue(back[1].bytes == big, "1 MiB payload must survive intact")
        XCTAssertEqual(back[2].bytes, [0x42])
    }

    func testAnArrayOfBytesDecodesAsTheBytesFastPath() throws {
        let back = try echo([.array(elementSignature: "y", [.byte(1), .byte(2)])])
        XCTAssertEqual(back.first, .bytes([1, 2]))
        XCTAssertEqual(back.first?.array, [.byte(1), .byte(2)])
    }

    /// The light scan of a received call (GATT calls' hot path) gives each `ay` and each entry
    /// of a string-keyed dictionary whose value is basic with its argument's index, and skips
    /// everything else: an option blserve never reads (an array, a dictionary, a descriptor)
    /// must not be decoded, or bluetoothd's one 30 MB option costs a server hundreds of MB.
    func testScanArgumentsOfAReceivedCall() throws {
        var bytes: [String] = []
        var entries: [String] = []
        let scan = ExportedInterface("org.example.Scan").method("Scan") { call in
            call.message.scanArguments(bytes: { i, b in bytes.append("\(i):\(b)") },
                                       entry: { i, k, v in entries.append("\(i):\(k)=\(v)") })
            call.reply([])
        }
        try tree.add(ExportedObject(path: "/test/scan", interfaces: [scan]))
        _ = try a.callAndWait(destination: b.uniqueName, path: "/test/scan", interface: "org.example.Scan", member: "Scan", args: [
            .bytes([1, 2, 3]),
            .string("skipped"),
            .stringDict(ordered: [("device", .objectPath("/org/bluez/hci0/dev_00_11_22_33_44_55")),
                                  ("mtu", .uint16(517)), ("nested", .variant(.variant(.string("x")))),
                                  ("junk", .array(elementSignature: "q", [.uint16(1), .uint16(2)])),
                                  ("deep", .variant(.variant(.stringDict(ordered: [("k", .string("v"))])))),
                                  ("fd", .unixFD(OwnedFD(taking: dup(0)))),
                                  ("link", .string("LE"))]),
            .dictionary(keySignature: "o", valueSignature: "v", [(key: .objectPath("/a"), value: .variant(.int32(1)))]),
            .stringArray(["not", "scanned"]),
            .bytes([]),
        ], timeout: 10)
        XCTAssertEqual(bytes, ["0:[1, 2, 3]", "5:[]"])
        XCTAssertEqual(entries, ["2:device=\(DBusValue.objectPath("/org/bluez/hci0/dev_00_11_22_33_44_55"))",
                                 "2:mtu=\(DBusValue.uint16(517))", "2:nested=\(DBusValue.string("x"))",
                                 "2:link=\(DBusValue.string("LE"))"])
    }

    func testInvalidValuesAreRejectedBeforeLibdbusSeesThem() throws {
        let m = try DBusMessage.methodCall(destination: nil, path: "/x", interface: nil, member: "M")
        let invalid: [DBusValue] = [
            .objectPath("not/a/path"),
            .objectPath("/trailing/"),
            .signature("a{"),
            .string("nul\0inside"),
            .array(elementSignature: "s", [.string("ok"), .uint32(1)]),
            .dictionary(keySignature: "v", valueSignature: "s", []),
            .dictionary(keySignature: "s", valueSignature: "v", [(key: .string("k"), value: .string("not a variant"))]),
            .structure([]),
            .unixFD(OwnedFD(taking: -1)),
            // Inside a variant the whole-value check sees only "v": libdbus would abort on these.
            .variant(.array(elementSignature: String(repeating: "a", count: 32) + "y", [])),
            .variant(.structure(Array(repeating: .byte(0), count: 300))),
            .variant(.variant(.array(elementSignature: String(repeating: "a", count: 40) + "s", []))),
            // Over libdbus's 64 MiB array limit (it aborts rather than failing).
            .bytes([UInt8](repeating: 0, count: 64 * 1024 * 1024 + 1)),
        ]
        for v in invalid {
            XCTAssertThrowsError(try m.append(v), "\(v)") { error in
                XCTAssertEqual((error as? DBusError)?.name, DBusError.Name.invalidArgs, "\(v)")
            }
        }
        XCTAssertEqual(m.signature, "", "nothing may be appended when validation fails")
        XCTAssertThrowsError(try DBusMessage.methodCall(destination: nil, path: "bad", interface: nil, member: "M"))
        XCTAssertThrowsError(try DBusMessage.methodCall(destination: nil, path: "/x", interface: "no-dots", member: "M"))
        XCTAssertThrowsError(try DBusMessage.signal(path: "/x", interface: "a.b", member: "has.dot"))
    }

    func testSignaturesAndConvenienceAccessors() {
        XCTAssertEqual(DBusValue.stringDict(["b": .bool(true), "a": .uint16(1)]).signature, "a{sv}")
        XCTAssertEqual(DBusValue.stringDict(["b": .bool(true), "a": .uint16(1)]).entries?.map(\.key), [.string("a"), .string("b")],
                       "keys sorted for a deterministic wire order")
        XCTAssertEqual(DBusValue.structure([.string("a"), .array(elementSignature: "i", [])]).signature, "(sai)")
        XCTAssertEqual(DBusValue.variant(.variant(.string("x"))).string, "x", "accessors look through variants")
        XCTAssertNil(DBusValue.objectPath("/x").string)
        XCTAssertEqual(DBusValue.objectPath("/x").objectPath, "/x")
        XCTAssertEqual(DBusSignature.split("sa{sv}(ii)aay"), ["s", "a{sv}", "(ii)", "aay"])
        XCTAssertNil(DBusSignature.split("a{vs}"))
        XCTAssertNil(DBusSignature.split("{sv}"))
        XCTAssertNil(DBusSignature.split("()"))
    }

    func testDBusErrorText() {
        let e = DBusError(name: "org.bluez.Error.Failed", message: "Not connected")
        XCTAssertEqual(e.description, "org.bluez.Error.Failed: Not connected")
        XCTAssertEqual(e.shortName, "Failed")
        XCTAssertEqual(DBusError(name: "org.bluez.Error.InProgress").description, "org.bluez.Error.InProgress")
        XCTAssertEqual(DBusError(name: "x.Y", message: "two\nlines\t here ").oneLine, "x.Y: two lines here")
        XCTAssertEqual(DBusError.oneLineMessage(e), "org.bluez.Error.Failed: Not connected")
    }
}
