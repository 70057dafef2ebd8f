import BLCommand
import BLDBus

/// bluetoothd's object tree, as returned by ObjectManager.GetManagedObjects:
/// path → interface → property → value.
public struct BlueZObjects {
    public var objects: [String: [String: [String: DBusValue]]]

    public init(_ objects: [String: [String: [String: DBusValue]]]) { self.objects = objects }

    /// The properties of `interface` at `path`, if that object has it.
    public func properties(_ path: String, _ interface: String) -> [String: DBusValue]? {
        objects[path]?[interface]
    }

    /// Paths carrying `interface`, optionally only those under `prefix` (a path namespace), sorted.
    public func paths(with interface: String, under prefix: String? = nil) -> [String] {
        objects.compactMap { path, interfaces in
            guard interfaces[interface] != nil else { return nil }
            if let prefix, !path.hasPrefix(prefix + "/") { return nil }
            return path
        }.sorted()
    }

    public var adapters: [Adapter] {
        paths(with: BlueZ.adapterInterface).compactMap { Adapter(path: $0, properties: properties($0, BlueZ.adapterInterface)!) }
    }

    public func devices(of adapter: Adapter) -> [DeviceInfo] {
        paths(with: BlueZ.deviceInterface, under: adapter.path).map {
            DeviceInfo(path: $0, properties: properties($0, BlueZ.deviceInterface)!)
        }
    }
}

/// A local Bluetooth adapter (`/org/bluez/hciN`).
public struct Adapter: Sendable, Equatable {
    public var path: String
    /// "hci0".
    public var name: String { String(path.split(separator: "/").last ?? "") }
    public var address: String
    public var powered: Bool

    init(path: String, properties: [String: DBusValue]) {
        self.path = path
        address = properties["Address"]?.string ?? ""
        powered = properties["Powered"]?.bool ?? false
    }
}

/// What bluetoothd knows about a remote device (`org.bluez.Device1`).
public struct DeviceInfo {
    public var path: String
    public var properties: [String: DBusValue]

    public init(path: String, properties: [String: DBusValue]) {
        self.path = path
        self.properties = properties
    }

    public var address: String { properties["Address"]?.string ?? "" }
    public var addressType: String { properties["AddressType"]?.string ?? "public" }
    public var name: String? { properties["Name"]?.string }
    public var alias: String? { properties["Alias"]?.string }
    public var rssi: Int? { properties["RSSI"]?.int16.map(Int.init) }
    public var uuids: [String] { properties["UUIDs"]?.stringArray ?? [] }
    public var connected: Bool { properties["Connected"]?.bool ?? false }
    public var servicesResolved: Bool { properties["ServicesResolved"]?.bool ?? false }
    /// Known only by a private address that the device changes from time to time (a resolvable
    /// or non-resolvable one: a random address whose two top bits are not 11, which a static one
    /// has), and not paired (bluetoothd knows a paired device by its identity address). Phones
    /// and many peripherals advertise so; the address bluetoothd remembers may be gone.
    public var knownByPrivateAddress: Bool {
        guard addressType == "random", properties["Paired"]?.bool != true,
              let first = UInt8(address.prefix(2), radix: 16) else { return false }
        return first & 0xC0 != 0xC0
    }

    /// Known over BR/EDR (classic): a public address with a Class of Device, which only BR/EDR
    /// carries (5.66 has no property naming the bearer of a link). A dual-mode device can also be
    /// connected over LE.
    public var knownOverBREDR: Bool { addressType == "public" && properties["Class"] != nil }

    /// Applies a PropertiesChanged.
    public mutating func update(changed: [String: DBusValue], invalidated: [String]) {
        for (key, value) in changed { properties[key] = value }
        for key in invalidated { properties[key] = nil }
    }
}

/// The tools' connection to bluetoothd: the system bus, the event loop, and the calls every tool
/// needs. Errors come out as `ToolError`s with the sysexits status of `BlueZErrors`.
public final class BlueZClient {
    public let loop: EventLoop
    public let bus: DBusConnection

    /// How long connecting to the system bus may take (registering with it).
    public static let busTimeout = 25.0

    /// Connects to the system bus (honouring DBUS_SYSTEM_BUS_ADDRESS): 69 when it cannot, 75
    /// when the bus takes the connection and does not answer within ``busTimeout``.
    /// `opened`: see ``DBusConnection/init(address:loop:timeout:opened:)``.
    public init(loop: EventLoop, opened: (() -> Void)? = nil) throws(ToolError) {
        self.loop = loop
        do {
            bus = try DBusConnection.system(loop: loop, timeout: Self.busTimeout, opened: opened)
        } catch where error.name == DBusError.Name.noReply {
            throw ToolError(.tempFail, "the system bus did not answer within \(formatSeconds(Self.busTimeout)) s")
        } catch {
            throw ToolError(.unavailable, "cannot connect to the system bus: \(error.oneLine)")
        }
    }

    /// Uses `bus` (a private bus in tests).
    public init(loop: EventLoop, bus: DBusConnection) {
        self.loop = loop
        self.bus = bus
    }

    /// Why bluetoothd is out of reach, once it is: it left the bus, or the bus itself went
    /// (the dbus-daemon stopped or the socket broke; bluetoothd's objects are gone either way).
    public var bluetoothdGoneReason: String {
        bus.isConnected ? "bluetoothd stopped" : "lost the connection to the system bus"
    }

    /// Calls a method on a bluetoothd object and waits (the loop keeps running meanwhile).
    /// `what` names the operation in the error message.
    public func call(_ path: String, _ interface: String, _ member: String, _ args: [DBusValue] = [],
                     timeout: Double? = 25, what: String) throws(ToolError) -> [DBusValue] {
        do {
            return try bus.callAndWait(destination: BlueZ.service, path: path, interface: interface,
                                       member: member, args: args, timeout: timeout)
        } catch {
            throw BlueZErrors.toolError(what, error)
        }
    }

    /// The whole object tree.
    public func managedObjects(timeout: Double = 10) throws(ToolError) -> BlueZObjects {
        let reply = try call("/", DBusInterfaceName.objectManager, "GetManagedObjects", timeout: timeout,
                             what: "listing bluetoothd's objects")
        guard let objects = reply.first?.managedObjects else {
            throw ToolError(.software, "GetManagedObjects returned \(reply.first?.signature ?? "nothing")")
        }
        return BlueZObjects(objects)
    }

    /// `listed` when given (a listing the caller has just made), else a new listing.
    public func managedObjects(reusing listed: BlueZObjects?) throws(ToolError) -> BlueZObjects {
        if let listed { return listed }
        return try managedObjects()
    }

    public func property(_ path: String, _ interface: String, _ name: String, what: String) throws(ToolError) -> DBusValue {
        let reply = try call(path, DBusInterfaceName.properties, "Get", [.string(interface), .string(name)],
                             timeout: 10, what: what)
        guard let value = reply.first?.variant else { throw ToolError(.software, "\(what): malformed reply") }
        return value
    }

    public func setProperty(_ path: String, _ interface: String, _ name: String, _ value: DBusValue, what: String) throws(ToolError) {
        _ = try call(path, DBusInterfaceName.properties, "Set", [.string(interface), .string(name), .variant(value)],
                     timeout: 10, what: what)
    }

    /// The adapter to use: `name` ("hci1") if given, else the first powered adapter, else the first
    /// adapter. An adapter that is off is powered on (waiting up to `timeout` seconds).
    /// `listed`: bluetoothd's objects as just listed by the caller, saving a listing.
    public func adapter(named name: String?, in listed: BlueZObjects? = nil, timeout: Double = 5) throws(ToolError) -> Adapter {
        let adapters = try managedObjects(reusing: listed).adapters
        var chosen: Adapter
        if let name {
            let address = BluetoothAddress.normalize(name)
            guard let match = adapters.first(where: { $0.name == name || $0.address.uppercased() == address }) else {
                let known = adapters.map(\.name).joined(separator: ", ")
                throw ToolError(.unavailable, "no adapter \(name)" + (known.isEmpty ? "" : " (have \(known))"))
            }
            chosen = match
        } else {
            guard let first = adapters.first(where: \.powered) ?? adapters.first else {
                throw ToolError(.unavailable, "no Bluetooth adapter found")
            }
            chosen = first
        }
        if !chosen.powered {
            try setProperty(chosen.path, BlueZ.adapterInterface, "Powered", .bool(true), what: "powering on \(chosen.name)")
            let deadline = MonotonicClock.seconds() + timeout
            while true {
                if (try? property(chosen.path, BlueZ.adapterInterface, "Powered", what: "").bool) == true { break }
                if loop.isStopping { throw ToolError.quiet(.interrupted) }
                if MonotonicClock.seconds() > deadline {
                    throw ToolError(.unavailable, "\(chosen.name) did not power on within \(formatSeconds(timeout)) s")
                }
                loop.sleep(0.1)
            }
            chosen.powered = true
        }
        return chosen
    }
}

extension BlueZClient {
    /// What a central tool runs in: an event loop that also carries the diagnostics, a client of
    /// bluetoothd, and SIGINT/SIGTERM watched. After a signal, `body`'s failure is exit 130.
    public static func session(_ body: (BlueZClient, InterruptWatch) throws -> Void) throws {
        let loop = EventLoop()
        Tool.queueDiagnostics(on: loop)
        guard let (client, interrupted) = try connect(loop: loop) else { throw ToolError.quiet(.interrupted) }
        try interrupted.guarding { try body(client, interrupted) }
    }

    /// Connects to the system bus with SIGINT, SIGTERM and SIGHUP watched from the moment its
    /// socket is connected (that connect() is libdbus's, blocking: until then a signal has its
    /// default action), so that a signal ends the wait for a bus that does not answer as it
    /// ends any other wait. Nil when a signal did.
    public static func connect(loop: EventLoop) throws(ToolError) -> (client: BlueZClient, interrupts: InterruptWatch)? {
        var watch: InterruptWatch?
        let client: BlueZClient
        do {
            client = try BlueZClient(loop: loop) { watch = InterruptWatch(loop: loop) }
        } catch {
            if watch?.received != nil { return nil }
            throw error
        }
        // `opened` has run: the connection was made.
        return (client, watch!)
    }
}
