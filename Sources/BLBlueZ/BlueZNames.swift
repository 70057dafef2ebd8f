import BLCommand
import BLDBus

/// Bus names, interfaces and the UUIDs of the protocols the tools speak.
public enum BlueZ {
    public static let service = "org.bluez"
    public static let adapterInterface = "org.bluez.Adapter1"
    public static let deviceInterface = "org.bluez.Device1"
    public static let gattServiceInterface = "org.bluez.GattService1"
    public static let gattCharacteristicInterface = "org.bluez.GattCharacteristic1"
    public static let gattDescriptorInterface = "org.bluez.GattDescriptor1"
    public static let gattManagerInterface = "org.bluez.GattManager1"
    public static let advertisingManagerInterface = "org.bluez.LEAdvertisingManager1"
    public static let advertisementInterface = "org.bluez.LEAdvertisement1"
    /// bluetoothd's object for AgentManager1 (and the parent of the adapters).
    public static let managerPath = "/org/bluez"
    public static let agentManagerInterface = "org.bluez.AgentManager1"
    public static let agentInterface = "org.bluez.Agent1"
}

/// The default service layouts.
public enum KnownUUIDs {
    /// RaspBLE (seed 000): one characteristic with read, write and notify.
    public static let raspBLEService = "54f06857-695e-47e4-aea8-c78184ad6c75"
    public static let raspBLECharacteristic = "30a5f1bb-61dc-45f0-9c52-2218d080fa77"
    /// Nordic UART Service: the central writes to RX and gets notifications from TX.
    public static let nusService = "6e400001-b5a3-f393-e0a9-e50e24dcca9e"
    public static let nusRX = "6e400002-b5a3-f393-e0a9-e50e24dcca9e"
    public static let nusTX = "6e400003-b5a3-f393-e0a9-e50e24dcca9e"
}

/// The service and characteristics a tool works with, from `--service`/`--char` or `--nus`
/// (the same three options in blsend, blrecv and blserve).
public struct GattLayout: Equatable, Sendable {
    public var service: String
    /// Where centrals write.
    public var write: String
    /// Where notifications and reads come from (the write characteristic except for --nus).
    public var notify: String

    public static let raspBLE = GattLayout(service: KnownUUIDs.raspBLEService, write: KnownUUIDs.raspBLECharacteristic,
                                           notify: KnownUUIDs.raspBLECharacteristic)
    public static let nus = GattLayout(service: KnownUUIDs.nusService, write: KnownUUIDs.nusRX, notify: KnownUUIDs.nusTX)

    public init(service: String, write: String, notify: String) {
        self.service = service
        self.write = write
        self.notify = notify
    }

    /// The layout the options ask for; the RaspBLE one by default.
    public init(_ options: ParsedOptions) throws(UsageError) {
        if options.has("nus") {
            if options.has("service") || options.has("char") {
                throw UsageError("--nus chooses the service and characteristics; it cannot be combined with --service or --char")
            }
            self = .nus
            return
        }
        let service = try GattLayout.uuid(options, "service") ?? KnownUUIDs.raspBLEService
        let characteristic = try GattLayout.uuid(options, "char") ?? KnownUUIDs.raspBLECharacteristic
        self.init(service: service, write: characteristic, notify: characteristic)
    }

    /// `--NAME` as a 128-bit UUID, or nil when the option is absent.
    public static func uuid(_ options: ParsedOptions, _ name: String) throws(UsageError) -> String? {
        guard let text = options.string(name) else { return nil }
        guard let uuid = BluetoothUUID.normalize(text) else {
            throw UsageError("--\(name) wants a 16-bit (180d) or 128-bit UUID, not '\(text)'")
        }
        return uuid
    }

    /// True for the Nordic UART layout (separate write and notify characteristics).
    public var splitsWriteAndNotify: Bool { write != notify }
}

/// Bluetooth UUIDs as BlueZ prints them: 128-bit, lower case.
public enum BluetoothUUID {
    static let baseSuffix = "-0000-1000-8000-00805f9b34fb"

    /// Accepts a 16-bit ("180d", "0x180D"), 32-bit or 128-bit UUID and returns the 128-bit form
    /// in lower case, or nil when `text` is not a UUID.
    public static func normalize(_ text: String) -> String? {
        var hex = text.lowercased()
        if hex.hasPrefix("0x") { hex.removeFirst(2) }
        let isHex = { (s: Substring) in !s.isEmpty && s.allSatisfy { $0.isHexDigit && $0.isASCII } }
        switch hex.count {
        case 4 where isHex(Substring(hex)):
            return "0000" + hex + baseSuffix
        case 8 where isHex(Substring(hex)):
            return hex + baseSuffix
        case 36:
            let groups = hex.split(separator: "-", omittingEmptySubsequences: false)
            guard groups.map(\.count) == [8, 4, 4, 4, 12], groups.allSatisfy(isHex) else { return nil }
            return hex
        default:
            return nil
        }
    }
}

/// Bluetooth device addresses ("AA:BB:CC:DD:EE:FF").
public enum BluetoothAddress {
    /// The address in upper case with colons, or nil when `text` is not six hex bytes separated
    /// by colons, or by dashes ("AA-BB-CC-DD-EE-FF", as Windows and Android write them, and as
    /// bluetoothd names a device that has no name of its own).
    public static func normalize(_ text: String) -> String? {
        parse(text.utf8, separator: UInt8(ascii: ":")) ?? parse(text.utf8, separator: UInt8(ascii: "-"))
    }

    /// Six two-digit hex bytes separated by `separator`, as "AA:BB:CC:DD:EE:FF"; nil otherwise.
    /// Works on the UTF-8 bytes: blserve calls it (through a device path) for every GATT call.
    static func parse<Bytes: Collection>(_ bytes: Bytes, separator: UInt8) -> String? where Bytes.Element == UInt8 {
        guard bytes.count == 17 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(17)
        for (i, b) in bytes.enumerated() {
            if i % 3 == 2 {
                guard b == separator else { return nil }
                out.append(UInt8(ascii: ":"))
                continue
            }
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "A")...UInt8(ascii: "F"): out.append(b)
            case UInt8(ascii: "a")...UInt8(ascii: "f"): out.append(b - 32)
            default: return nil
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// BlueZ's object path for a device of `adapterPath`: `/org/bluez/hci0/dev_AA_BB_…`.
    public static func devicePath(adapterPath: String, address: String) -> String {
        adapterPath + "/dev_" + String(address.uppercased().map { $0 == ":" ? "_" : $0 })
    }
}

/// How a BlueZ or D-Bus error maps onto the tools' exit statuses, in one table.
public enum BlueZErrors {
    /// The exit status for a D-Bus error from bluetoothd.
    public static func exitCode(for error: DBusError) -> ExitCode {
        switch error.shortName {
        case "NoReply", "Timeout", "TimedOut":
            return .tempFail
        case "InProgress", "Busy":
            return .tempFail
        case "NotPermitted" where error.message.hasSuffix(" acquired"):
            // "Write acquired", "Notify acquired": another process holds the characteristic's socket.
            return .unavailable
        case "NotPermitted", "NotAuthorized", "AuthenticationFailed", "AuthenticationRejected", "AccessDenied":
            return .noPermission
        case "AuthenticationCanceled", "ConnectionAttemptFailed":
            // Canceled: also the link lost, or no resources, while pairing (5.66 device.c).
            return .unavailable
        case "AuthenticationTimeout":
            return .tempFail
        case "Blocked":
            return .unavailable
        case "InvalidArguments", "InvalidArgs", "InvalidLength", "InvalidValueLength", "InvalidOffset":
            return .dataError
        case "ServiceUnknown", "NameHasNoOwner", "ExecFailed", "ServiceNotFound", "ChildExited", "ChildSignaled", "UnknownObject", "DoesNotExist", "NotReady", "NotAvailable",
             "NotConnected", "NotSupported", "Disconnected", "NoSuchAdapter":
            return .unavailable
        default:
            // Failed "Not connected", "le-connection-abort-by-local", "Operation already in progress"…
            let text = error.message.lowercased()
            // "Blocked through rfkill": the adapter cannot be powered on (airplane mode).
            if text.contains("not connected") || text.contains("abort") || text.contains("not available") || text.contains("rfkill") {
                return .unavailable
            }
            if text.contains("in progress") { return .tempFail }
            return .ioError
        }
    }

    /// A one-line tool error for a failed BlueZ operation: "what: the BlueZ error".
    public static func toolError(_ what: String, _ error: DBusError) -> ToolError {
        // No bluetoothd on the bus; the bus may also have tried to start one (Spawn.*) and failed.
        if error.name == DBusError.Name.serviceUnknown || error.name == DBusError.Name.nameHasNoOwner
            || error.name.hasPrefix("org.freedesktop.DBus.Error.Spawn.") {
            return ToolError(.unavailable, "\(what): bluetoothd is not running (no org.bluez on the system bus)")
        }
        if error.shortName == "NotPermitted" && error.message == "Write acquired" {
            return ToolError(.unavailable, "\(what): another process holds its write socket (Write acquired)")
        }
        if error.shortName == "NotPermitted" && error.message == "Not paired" {
            // The device answered "insufficient encryption", "insufficient authentication" or
            // "key size": no bond at all (--pair), or one it does not take (it lost its keys, or
            // wants a pairing with a passkey, which Just Works is not).
            return ToolError(.noPermission, "\(what): the device wants an encrypted link with a bond it accepts (Not paired):"
                             + " pair with --pair; if already paired, it may have lost its keys (bluetoothctl remove ADDR, then --pair)")
        }
        return ToolError(exitCode(for: error), "\(what): \(error.oneLine)")
    }
}
