import XCTest
import BLCommand
import BLDBus
@testable import BLBlueZ

final class BlueZNamesTests: XCTestCase {
    func testUUIDNormalisation() {
        XCTAssertEqual(BluetoothUUID.normalize("180d"), "0000180d-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(BluetoothUUID.normalize("0x180D"), "0000180d-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(BluetoothUUID.normalize("0000FEED"), "0000feed-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(BluetoothUUID.normalize("54F06857-695E-47E4-AEA8-C78184AD6C75"), KnownUUIDs.raspBLEService)
        for bad in ["", "18d", "180g", "54f06857695e47e4aea8c78184ad6c75", "54f06857-695e-47e4-aea8-c78184ad6c7g",
                    "54f0685-7695e-47e4-aea8-c78184ad6c75", "0x"] {
            XCTAssertNil(BluetoothUUID.normalize(bad), bad)
        }
    }

    func testAddresses() {
        XCTAssertEqual(BluetoothAddress.normalize("aa:bb:cc:dd:ee:0f"), "AA:BB:CC:DD:EE:0F")
        XCTAssertNil(BluetoothAddress.normalize("aa:bb:cc:dd:ee"))
        XCTAssertNil(BluetoothAddress.normalize("aa:bb:cc:dd:ee:fg"))
        XCTAssertNil(BluetoothAddress.normalize("aabb:cc:dd:ee:ff"))
        XCTAssertEqual(BluetoothAddress.devicePath(adapterPath: "/org/bluez/hci1", address: "aa:bb:cc:dd:ee:ff"),
                       "/org/bluez/hci1/dev_AA_BB_CC_DD_EE_FF")
        XCTAssertNil(BluetoothAddress.normalize("aa:bb:cc:dd:ee:f\u{e9}"))
        XCTAssertEqual(BluetoothAddress.normalize("aa-bb-cc-dd-ee-ff"), "AA:BB:CC:DD:EE:FF")
        XCTAssertNil(BluetoothAddress.normalize("aa-bb:cc-dd-ee-ff"), "separators mixed")
        XCTAssertNil(BluetoothAddress.normalize("aabbccddeeff"))
    }

    func testAddressFromDevicePath() {
        XCTAssertEqual(BluetoothAddress.fromDevicePath("/org/bluez/hci0/dev_AA_BB_CC_DD_EE_0F"), "AA:BB:CC:DD:EE:0F")
        XCTAssertEqual(BluetoothAddress.fromDevicePath("/org/bluez/hci12/dev_aa_bb_cc_dd_ee_0f"), "AA:BB:CC:DD:EE:0F")
        XCTAssertEqual(BluetoothAddress.fromDevicePath("dev_01_23_45_67_89_AB"), "01:23:45:67:89:AB")
        for bad in ["", "/org/bluez/hci0", "/org/bluez/hci0/dev_AA_BB_CC_DD_EE", "/org/bluez/hci0/dev_AA_BB_CC_DD_EE_0G",
                    "/org/bluez/hci0/xdev_AA_BB_CC_DD_EE_FF", "/org/bluez/hci0/dev_AA:BB:CC:DD:EE:FF",
                    "/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF/service0010", "/org/bluez/hci0/dev_AA_BB_CC_DD_EE_F\u{e9}"] {
            XCTAssertNil(BluetoothAddress.fromDevicePath(bad), bad)
        }
    }

    func testDeviceSelector() {
        let device = DeviceInfo(path: "/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF", properties: [
            "Address": .string("AA:BB:CC:DD:EE:FF"), "Name": .string("my-raspbverry-pi"), "Alias": .string("pi"),
        ])
        XCTAssertTrue(DeviceSelector("aa:bb:cc:dd:ee:ff").matches(device))
        XCTAssertTrue(DeviceSelector("my-raspbverry-pi").matches(device))
        XCTAssertTrue(DeviceSelector("pi").matches(device))
        XCTAssertFalse(DeviceSelector("my-raspberry-pi").matches(device))
        XCTAssertFalse(DeviceSelector("AA:BB:CC:DD:EE:00").matches(device))
    }

    func testKnownOverBREDR() {
        func device(_ properties: [String: DBusValue]) -> DeviceInfo {
            DeviceInfo(path: "/org/bluez/hci0/dev_00_11_22_33_44_55", properties: ["Address": .string("00:11:22:33:44:55")].merging(properties) { $1 })
        }
        // A headset: public address, class of device.
        XCTAssertTrue(device(["AddressType": .string("public"), "Class": .uint32(0x240404)]).knownOverBREDR)
        XCTAssertFalse(device(["AddressType": .string("public")]).knownOverBREDR)
        XCTAssertFalse(device(["AddressType": .string("random"), "Class": .uint32(0x5a020c)]).knownOverBREDR)
    }

    func testKnownByPrivateAddress() {
        func device(_ address: String, _ type: String, paired: Bool = false) -> DeviceInfo {
            DeviceInfo(path: "/org/bluez/hci0/dev_X", properties: [
                "Address": .string(address), "AddressType": .string(type), "Paired": .bool(paired),
            ])
        }
        XCTAssertTrue(device("5A:11:22:33:44:55", "random").knownByPrivateAddress)   // resolvable (01)
        XCTAssertTrue(device("3A:11:22:33:44:55", "random").knownByPrivateAddress)   // non-resolvable (00)
        XCTAssertFalse(device("C3:11:22:33:44:55", "random").knownByPrivateAddress)  // static (11)
        XCTAssertFalse(device("5A:11:22:33:44:55", "public").knownByPrivateAddress)
        XCTAssertFalse(device("5A:11:22:33:44:55", "random", paired: true).knownByPrivateAddress)
    }

    func testErrorMapping() {
        func code(_ name: String, _ message: String = "") -> ExitCode {
            BlueZErrors.exitCode(for: DBusError(name: name, message: message))
        }
        XCTAssertEqual(code("org.freedesktop.DBus.Error.NoReply"), .tempFail)
        XCTAssertEqual(code("org.bluez.Error.InProgress"), .tempFail)
        // Another process holds the socket: unavailable, not a permission (77) to fix.
        XCTAssertEqual(code("org.bluez.Error.NotPermitted", "Notify acquired"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.NotPermitted", "Write acquired"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.NotPermitted", "Read not permitted"), .noPermission)
        XCTAssertEqual(code("org.bluez.Error.NotPermitted"), .noPermission)
        // An adapter rfkill keeps off (airplane mode) cannot be powered on.
        XCTAssertEqual(code("org.bluez.Error.Failed", "Blocked through rfkill"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.Blocked"), .unavailable)
        let held = BlueZErrors.toolError("writing to x", DBusError(name: "org.bluez.Error.NotPermitted", message: "Write acquired"))
        XCTAssertEqual(held.code, .unavailable)
        XCTAssertTrue(held.message.contains("another process holds its write socket"), held.message)
        // A device wanting an encrypted link, unpaired: the message says what to do.
        let unpaired = BlueZErrors.toolError("writing to x", DBusError(name: "org.bluez.Error.NotPermitted", message: "Not paired"))
        XCTAssertEqual(unpaired.code, .noPermission)
        XCTAssertTrue(unpaired.message.contains("encrypted link") && unpaired.message.contains("--pair"), unpaired.message)
        XCTAssertEqual(code("org.bluez.Error.AuthenticationCanceled"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.AuthenticationTimeout"), .tempFail)
        XCTAssertEqual(code("org.bluez.Error.ConnectionAttemptFailed"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.InvalidArguments", "Invalid Length"), .dataError)
        XCTAssertEqual(code("org.bluez.Error.NotReady"), .unavailable)
        XCTAssertEqual(code("org.freedesktop.DBus.Error.UnknownObject"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.Failed", "Not connected"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.Failed", "le-connection-abort-by-local"), .unavailable)
        XCTAssertEqual(code("org.bluez.Error.Failed", "Operation already in progress"), .tempFail)
        XCTAssertEqual(code("org.bluez.Error.Failed", "Operation failed with ATT error: 0x80"), .ioError)
        let missing = BlueZErrors.toolError("listing", DBusError(name: DBusError.Name.serviceUnknown, message: "x"))
        XCTAssertEqual(missing.code, .unavailable)
        XCTAssertTrue(missing.message.contains("bluetoothd is not running"), missing.message)
        let spawnFailed = BlueZErrors.toolError("listing", DBusError(name: "org.freedesktop.DBus.Error.Spawn.ChildExited", message: "x"))
        XCTAssertEqual(spawnFailed.code, .unavailable)
        XCTAssertTrue(spawnFailed.message.contains("bluetoothd is not running"), spawnFailed.message)
    }

    func testTransientConnectErrors() {
        XCTAssertTrue(BlueZClient.isTransientConnectError(DBusError(name: "org.bluez.Error.Failed", message: "le-connection-abort-by-local")))
        XCTAssertTrue(BlueZClient.isTransientConnectError(DBusError(name: "org.bluez.Error.InProgress")))
        XCTAssertTrue(BlueZClient.isTransientConnectError(DBusError(name: "org.bluez.Error.Failed", message: "Operation already in progress")))
        XCTAssertFalse(BlueZClient.isTransientConnectError(DBusError(name: "org.bluez.Error.NotReady")))
        XCTAssertFalse(BlueZClient.isTransientConnectError(DBusError(name: "org.bluez.Error.Failed", message: "Input/output error")))
    }

    func testWriteLimitFollowsMTUAndTheBlueZCap() {
        XCTAssertEqual(RemoteCharacteristic.writeLimit(mtu: 23), 20)
        XCTAssertEqual(RemoteCharacteristic.writeLimit(mtu: 247), 244)
        XCTAssertEqual(RemoteCharacteristic.writeLimit(mtu: 517), 510)
    }

    func testObjectTreeQueries() {
        let objects = BlueZObjects([
            "/org/bluez/hci1": [BlueZ.adapterInterface: ["Address": .string("00:AA:01:01:00:01"), "Powered": .bool(false)]],
            "/org/bluez/hci0": [BlueZ.adapterInterface: ["Address": .string("00:AA:01:00:00:00"), "Powered": .bool(true)]],
            "/org/bluez/hci0/dev_11_22_33_44_55_66": [BlueZ.deviceInterface: ["Address": .string("11:22:33:44:55:66")]],
            "/org/bluez/hci1/dev_11_22_33_44_55_77": [BlueZ.deviceInterface: ["Address": .string("11:22:33:44:55:77")]],
        ])
        XCTAssertEqual(objects.adapters.map(\.name), ["hci0", "hci1"])
        XCTAssertEqual(objects.adapters.map(\.powered), [true, false])
        XCTAssertEqual(objects.devices(of: objects.adapters[0]).map(\.address), ["11:22:33:44:55:66"])
    }

    func testGattLayoutFromOptions() throws {
        let spec = CommandSpec(name: "t", usage: [], summary: "", options: [
            OptionSpec("service", value: "UUID", help: ""), OptionSpec("char", value: "UUID", help: ""),
            OptionSpec("nus", help: ""),
        ])
        XCTAssertEqual(try GattLayout(spec.parse([])), .raspBLE)
        XCTAssertEqual(try GattLayout(spec.parse(["--nus"])), .nus)
        XCTAssertTrue(GattLayout.nus.splitsWriteAndNotify)
        let custom = try GattLayout(spec.parse(["--service", "fff0", "--char", "FFF1"]))
        XCTAssertEqual(custom.service, "0000fff0-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(custom.write, "0000fff1-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(custom.notify, custom.write)
        XCTAssertThrowsError(try GattLayout(spec.parse(["--nus", "--char", "fff1"])))
        XCTAssertThrowsError(try GattLayout(spec.parse(["--service", "xyz"])))
    }
}
