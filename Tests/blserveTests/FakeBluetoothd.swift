import XCTest
#if canImport(Glibc)
import Glibc
#endif
import BLBlueZ
import BLCommand
import BLDBus

/// A stand-in for bluetoothd on a private bus, for unit tests only (the integration suite on the
/// bench uses the real one). It owns `org.bluez`, offers adapter `hci0` with GattManager1 and
/// LEAdvertisingManager1, and registers like bluetoothd does: RegisterApplication reads the
/// application's objects with GetManagedObjects before it answers, RegisterAdvertisement reads
/// the advertisement with Properties.GetAll (bluez-notes §3.1, §4.1). It then plays the centrals:
/// `write`/`read` call the server's characteristic the way bluetoothd does, with the `device` and
/// `mtu` options, and `notifications` collects the Value changes the server emits.
final class FakeBluetoothd {
    let address: String
    let loop: EventLoop
    private(set) var connection: DBusConnection!
    private var tree: ExportedObjectTree!

    /// (sender, app path) → the objects its GetManagedObjects returned.
    private(set) var applications: [String: [String: [String: [String: DBusValue]]]] = [:]
    /// (sender, path) → the advertisement's properties.
    private(set) var advertisements: [String: [String: DBusValue]] = [:]
    private(set) var registerCalls = 0
    /// When each RegisterApplication came (MonotonicClock seconds).
    private(set) var registerTimes: [Double] = []
    /// (sender, path) → the capability of each agent registered with AgentManager1 (one per
    /// sender, as in bluetoothd).
    private(set) var agents: [String: String] = [:]
    /// RegisterAgent and RegisterApplication calls in the order they came ("agent", "application").
    private(set) var registrationOrder: [String] = []
    /// How many RegisterAgent calls to come are refused (with Failed).
    var agentRefusals = 0
    private(set) var agentCalls = 0
    /// How many RegisterApplication and RegisterAdvertisement calls to come are refused.
    var applicationRefusals = 0
    var advertisementRefusals = 0
    private(set) var advertisementCalls = 0
    /// The next RegisterApplication is held this many seconds, then refused (as bluetoothd
    /// refuses an application whose objects it cannot use). Meanwhile the application counts as
    /// registered: BlueZ 5.66 queues it before reading its objects, so another RegisterApplication
    /// for it gets AlreadyExists and UnregisterApplication removes it (the late refusal is
    /// then never sent).
    var holdNextRegistration = 0.0
    private var heldApplications: [String: TimerToken] = [:]
    /// Advertisements being registered (their properties asked for): as in BlueZ 5.66, an
    /// UnregisterAdvertisement meanwhile removes one, and its registration then fails.
    private var pendingAdvertisements: Set<String> = []
    /// Values of the server's PropertiesChanged(Value) signals, in order.
    private(set) var notifications: [[UInt8]] = []
    private var notificationToken: SubscriptionToken?
    private var adapterObject: ExportedObject?
    var serverName = ""
    /// Seconds before UnregisterAdvertisement is answered (a busy bluetoothd answers late).
    var unregisterDelay = 0.0

    static let adapterPath = "/org/bluez/hci0"
    static let charPath = "/org/blpipe/blserve/service0/char0"

    init(address: String, loop: EventLoop) throws {
        self.address = address
        self.loop = loop
        try connect()
    }

    private func connect() throws {
        connection = try DBusConnection(address: address, loop: loop)
        tree = ExportedObjectTree(root: "/")
        let adapter = ExportedObject(path: Self.adapterPath, interfaces: [
            ExportedInterface(BlueZ.adapterInterface)
                .property("Address") { .string("00:AA:01:00:00:00") }
                .property("Powered") { .bool(true) },
            ExportedInterface(BlueZ.gattManagerInterface)
                .method("RegisterApplication", inSignature: "oa{sv}") { [unowned self] call in self.registerApplication(call) }
                .method("UnregisterApplication", inSignature: "o") { [unowned self] call in
                    let key = (call.sender ?? "") + (call.arguments[0].objectPath ?? "")
                    if let held = self.heldApplications.removeValue(forKey: key) {
                        self.loop.cancel(held)
                    } else if self.applications.removeValue(forKey: key) == nil {
                        return call.fail(name: "org.bluez.Error.DoesNotExist", message: "Does Not Exist")
                    }
                    call.reply([])
                },
            ExportedInterface(BlueZ.advertisingManagerInterface)
                .method("RegisterAdvertisement", inSignature: "oa{sv}") { [unowned self] call in self.registerAdvertisement(call) }
                .method("UnregisterAdvertisement", inSignature: "o") { [unowned self] call in
                    let key = (call.sender ?? "") + (call.arguments[0].objectPath ?? "")
                    let pending = self.pendingAdvertisements.remove(key) != nil
                    if self.advertisements.removeValue(forKey: key) == nil && !pending {
                        return call.fail(name: "org.bluez.Error.DoesNotExist", message: "Does Not Exist")
                    }
                    if self.unregisterDelay > 0 {
                        _ = self.loop.schedule(after: self.unregisterDelay) { call.reply([]) }
                    } else {
                        call.reply([])
                    }
                },
        ])
        try tree.add(adapter, announce: false)
        try tree.add(ExportedObject(path: BlueZ.managerPath, interfaces: [
            ExportedInterface(BlueZ.agentManagerInterface)
                .method("RegisterAgent", inSignature: "os") { [unowned self] call in
                    self.registrationOrder.append("agent")
                    self.agentCalls += 1
                    if self.agentRefusals > 0 {
                        self.agentRefusals -= 1
                        return call.fail(name: "org.bluez.Error.Failed", message: "Resource temporarily unavailable")
                    }
                    let sender = call.sender ?? ""
                    if self.agents.keys.contains(where: { $0.hasPrefix(sender + "/") }) {
                        return call.fail(name: "org.bluez.Error.AlreadyExists", message: "Already Exists")
                    }
                    self.agents[sender + (call.arguments[0].objectPath ?? "")] = call.arguments[1].string ?? ""
                    call.reply([])
                }
                .method("UnregisterAgent", inSignature: "o") { [unowned self] call in
                    let key = (call.sender ?? "") + (call.arguments[0].objectPath ?? "")
                    if self.agents.removeValue(forKey: key) == nil { return call.fail(name: "org.bluez.Error.DoesNotExist", message: "No such agent") }
                    call.reply([])
                },
        ]), announce: false)
        try connection.export(tree)
        XCTAssertEqual(try connection.requestName(BlueZ.service), .primaryOwner)
    }

    /// Simulates a bluetoothd restart: the old connection (and with it every registration) goes,
    /// a new one takes org.bluez. With `gone`, the bus has no org.bluez for that many seconds
    /// in between (the loop runs meanwhile).
    func restart(gone seconds: Double = 0) throws {
        for key in Array(notifySockets.keys) { closeNotifySocket(key) }
        connection.close()
        connection = nil
        applications.removeAll()
        advertisements.removeAll()
        agents.removeAll()
        for held in heldApplications.values { loop.cancel(held) }
        heldApplications.removeAll()
        pendingAdvertisements.removeAll()
        notificationToken = nil
        if seconds > 0 { _ = loop.run(until: { false }, timeout: seconds) }
        try connect()
        if !serverName.isEmpty { try watchNotifications(of: serverName) }
    }

    private func registerApplication(_ call: IncomingCall) {
        registerCalls += 1
        registerTimes.append(MonotonicClock.seconds())
        registrationOrder.append("application")
        guard let sender = call.sender, let path = call.arguments[0].objectPath else { return call.fail(name: "org.bluez.Error.InvalidArguments") }
        let key = sender + path
        if applications[key] != nil || heldApplications[key] != nil {
            return call.fail(name: "org.bluez.Error.AlreadyExists", message: "Already Exists")
        }
        if applicationRefusals > 0 {
            applicationRefusals -= 1
            return call.fail(name: "org.bluez.Error.Failed", message: "Failed to create entry in database")
        }
        if holdNextRegistration > 0 {
            heldApplications[key] = loop.schedule(after: holdNextRegistration) { [unowned self] in
                self.heldApplications[key] = nil
                call.fail(name: "org.bluez.Error.Failed", message: "No object received")
            }
            holdNextRegistration = 0
            return
        }
        connection.call(destination: sender, path: path, interface: DBusInterfaceName.objectManager, member: "GetManagedObjects",
                        timeout: 5) { [unowned self] result in
            switch result {
            case .success(let args):
                guard let objects = args.first?.managedObjects, !objects.isEmpty else {
                    return call.fail(name: "org.bluez.Error.Failed", message: "No object received")
                }
                self.applications[sender + path] = objects
                call.reply([])
            case .failure(let error):
                call.fail(name: "org.bluez.Error.Failed", message: error.message)
            }
        }
    }

    private func registerAdvertisement(_ call: IncomingCall) {
        advertisementCalls += 1
        guard let sender = call.sender, let path = call.arguments[0].objectPath else { return call.fail(name: "org.bluez.Error.InvalidArguments") }
        if advertisements[sender + path] != nil {
            return call.fail(name: "org.bluez.Error.AlreadyExists", message: "Already Exists")
        }
        if advertisementRefusals > 0 {
            advertisementRefusals -= 1
            return call.fail(name: "org.bluez.Error.NotPermitted", message: "Maximum advertisements reached")
        }
        pendingAdvertisements.insert(sender + path)
        connection.call(destination: sender, path: path, interface: DBusInterfaceName.properties, member: "GetAll",
                        args: [.string(BlueZ.advertisementInterface)], timeout: 5) { [unowned self] result in
            switch result {
            case .success(let args):
                guard self.pendingAdvertisements.remove(sender + path) != nil else {
                    return call.fail(name: "org.bluez.Error.Failed", message: "Unregistered meanwhile")
                }
                self.advertisements[sender + path] = args.first?.dictionary ?? [:]
                call.reply([])
            case .failure:
                self.pendingAdvertisements.remove(sender + path)
                call.fail(name: "org.bluez.Error.Failed", message: "Failed to register advertisement")
            }
        }
    }

    /// Drops the server's advertisement as bluetoothd does by itself (its advertising manager
    /// went, or the kernel removed the instance): forgets it, then calls Release.
    func releaseAdvertisement(of server: String, path: String) {
        advertisements[server + path] = nil
        connection.call(destination: server, path: path, interface: BlueZ.advertisementInterface, member: "Release",
                        timeout: 5) { _ in }
    }

    /// Collects the Value changes `server` emits (what bluetoothd turns into notifications).
    func watchNotifications(of server: String) throws {
        serverName = server
        notificationToken = try connection.subscribePropertiesChanged(sender: server, pathNamespace: "/org/blpipe") {
            [unowned self] _, interface, changed, _ in
            if interface == BlueZ.gattCharacteristicInterface, let value = changed["Value"]?.bytes {
                self.notifications.append(value)
                self.notificationSources.append("signal")
            }
        }
    }

    /// Calls `member` of the agent `server` registered at `path`, as bluetoothd does when a
    /// central pairs (RequestAuthorization for Just Works).
    func askAgent(of server: String, path: String, _ member: String, _ args: [DBusValue]) -> Result<Void, DBusError> {
        Result { () throws(DBusError) in
            _ = try connection.callAndWait(destination: server, path: path, interface: BlueZ.agentInterface, member: member,
                                           args: args, timeout: 5)
        }
    }

    // MARK: - Playing the centrals

    static func device(_ n: Int) -> String { "/org/bluez/hci0/dev_00_00_00_00_00_0\(n)" }

    private func options(_ device: String, mtu: Int, offset: Int, type: String? = nil) -> DBusValue {
        var o: [String: DBusValue] = ["device": .objectPath(device), "mtu": .uint16(UInt16(mtu)), "link": .string("LE")]
        if offset > 0 { o["offset"] = .uint16(UInt16(offset)) }
        if let type { o["type"] = .string(type) }
        return .stringDict(o)
    }

    func write(_ value: [UInt8], from device: String, mtu: Int = 185, offset: Int = 0, path: String = charPath) -> Result<Void, DBusError> {
        Result { () throws(DBusError) in
            _ = try connection.callAndWait(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                                           member: "WriteValue", args: [.bytes(value), options(device, mtu: mtu, offset: offset)],
                                           timeout: 5)
        }
    }

    /// A write command as bluetoothd passes it on: a WriteValue call that wants no reply.
    func writeCommand(_ value: [UInt8], from device: String, mtu: Int = 185, path: String = charPath) throws {
        let m = try DBusMessage.methodCall(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                                           member: "WriteValue")
        try m.append([.bytes(value), options(device, mtu: mtu, offset: 0, type: "command")])
        m.noReply = true
        _ = try connection.send(m)
    }

    func read(from device: String, mtu: Int = 185, offset: Int = 0, path: String = charPath) -> Result<[UInt8], DBusError> {
        Result { () throws(DBusError) in
            let reply = try connection.callAndWait(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                                                   member: "ReadValue", args: [options(device, mtu: mtu, offset: offset)], timeout: 5)
            return reply.first?.bytes ?? []
        }
    }

    /// Sends a read and returns at once; `completion` gets the value (or the error) once the
    /// server answers, while the loop runs.
    func startRead(from device: String, mtu: Int = 185, path: String = charPath,
                   completion: @escaping (Result<[UInt8], DBusError>) -> Void) {
        _ = connection.call(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                            member: "ReadValue", args: [options(device, mtu: mtu, offset: 0)], timeout: 5) { result in
            completion(result.map { $0.first?.bytes ?? [] })
        }
    }

    /// Reads until an empty value, as the seed client does; returns everything read.
    func readAll(from device: String, mtu: Int = 185, path: String = charPath) -> [UInt8] {
        var out: [UInt8] = []
        for _ in 0..<100_000 {
            guard case .success(let piece) = read(from: device, mtu: mtu, path: path), !piece.isEmpty else { break }
            out += piece
        }
        return out
    }

    /// Sockets from AcquireNotify, by characteristic path and device, and their watches.
    private var notifySockets: [String: (fd: OwnedFD, watch: WatchToken)] = [:]
    /// Where each notification came from, in order: the device of the socket, or "signal".
    private(set) var notificationSources: [String] = []
    /// How many notifications arrived through a socket rather than as signals.
    var socketNotifications: Int { notificationSources.filter { $0 != "signal" }.count }

    /// A subscription as BlueZ makes it: AcquireNotify when the characteristic exports
    /// NotifyAcquired (then every message read from the socket is a notification, read one per
    /// turn of the loop as bluetoothd does), else StartNotify. 5.66 asks once, for the first
    /// central; from 5.69 once per central.
    func startNotify(path: String = charPath, device: String = FakeBluetoothd.device(1), mtu: Int = 185) throws {
        let exported = applications.values.contains { $0[path]?[BlueZ.gattCharacteristicInterface]?["NotifyAcquired"] != nil }
        guard exported else {
            _ = try connection.callAndWait(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                                           member: "StartNotify", timeout: 5)
            return
        }
        let reply = try connection.callAndWait(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                                               member: "AcquireNotify", args: [options(device, mtu: mtu, offset: 0)], timeout: 5)
        guard case .unixFD(let fd)? = reply.first else { throw DBusError.failed("AcquireNotify gave no fd") }
        let raw = fd.rawValue
        let key = path + " " + device
        let watch = loop.watch(fd: raw, events: .readable) { [unowned self] _ in
            var buffer = [UInt8](repeating: 0, count: 512)
            let n = recv(raw, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if n > 0 {
                self.notifications.append(Array(buffer[..<n]))
                self.notificationSources.append(device)
            } else if n == 0 || (errno != EAGAIN && errno != EINTR) {
                self.closeNotifySocket(key)
            }
        }
        notifySockets[key] = (fd, watch)
    }

    /// A subscription ends: its socket is closed (`ccc_write_cb()`), or StopNotify.
    func stopNotify(path: String = charPath, device: String = FakeBluetoothd.device(1)) throws {
        if notifySockets[path + " " + device] != nil {
            closeNotifySocket(path + " " + device)
            return
        }
        _ = try connection.callAndWait(destination: serverName, path: path, interface: BlueZ.gattCharacteristicInterface,
                                       member: "StopNotify", timeout: 5)
    }

    /// Stops (or resumes) reading the notification sockets, as a busy bluetoothd would.
    func pauseSocketReads(_ paused: Bool) {
        for socket in notifySockets.values { loop.setEvents(socket.watch, paused ? [] : .readable) }
    }

    private func closeNotifySocket(_ key: String) {
        guard let socket = notifySockets.removeValue(forKey: key) else { return }
        loop.remove(socket.watch)
        socket.fd.close()
    }

    /// Emits Device1.Connected for `device`, as bluetoothd does when a central connects.
    func setConnected(_ device: String, _ connected: Bool) throws {
        try tree.emitPropertiesChanged(path: device, interface: BlueZ.deviceInterface, changed: ["Connected": .bool(connected)])
        // A round trip through the server, so it has seen the signal.
        _ = try connection.callAndWait(destination: serverName, path: "/", interface: DBusInterfaceName.peer, member: "Ping", timeout: 5)
    }

    /// Emits Device1.Paired for `device` (a bonded central's subscriptions outlive its link).
    func setPaired(_ device: String, _ paired: Bool) throws {
        try setDeviceProperties(device, ["Paired": .bool(paired)])
    }

    /// Emits a PropertiesChanged of Device1 for `device`, and waits until the server has seen it.
    func setDeviceProperties(_ device: String, _ changed: [String: DBusValue]) throws {
        try tree.emitPropertiesChanged(path: device, interface: BlueZ.deviceInterface, changed: changed)
        _ = try connection.callAndWait(destination: serverName, path: "/", interface: DBusInterfaceName.peer, member: "Ping", timeout: 5)
    }

    func clearNotifications() {
        notifications.removeAll()
        notificationSources.removeAll()
    }

    /// The adapter disappears (InterfacesRemoved), as when its controller is unplugged.
    func removeAdapter() throws {
        adapterObject = tree.remove(path: Self.adapterPath, announce: false)
        try tree.emitInterfacesRemoved(path: Self.adapterPath, interfaces: [BlueZ.adapterInterface])
        applications.removeAll()
        advertisements.removeAll()
    }

    /// The adapter comes back (InterfacesAdded).
    func addAdapter() throws {
        guard let adapterObject else { return }
        try tree.add(adapterObject, announce: true)
    }
}
