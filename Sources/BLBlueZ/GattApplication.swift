#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLCommand
import BLDBus

/// The options bluetoothd passes with every `ReadValue`/`WriteValue` call to a server
/// characteristic (bluez-notes §3.4, §3.5): `device`, `mtu`, `link`, and `offset` only when it is
/// not zero. There is never a `type`.
public struct GattRequestOptions: Sendable, Equatable {
    /// The central's object path, e.g. `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF`.
    public var device: String?
    /// The ATT MTU of that central's link (23 if bluetoothd did not say).
    public var mtu: Int
    /// The byte offset of a Read Blob or of a prepared write (0 when absent).
    public var offset: Int
    /// "LE" or "BR/EDR".
    public var link: String?
    /// True on the empty WriteValue that only asks whether a prepared write may go ahead.
    public var prepareAuthorize: Bool

    public init(device: String? = nil, mtu: Int = 23, offset: Int = 0, link: String? = nil, prepareAuthorize: Bool = false) {
        self.device = device
        self.mtu = mtu
        self.offset = offset
        self.link = link
        self.prepareAuthorize = prepareAuthorize
    }

    /// The options and the written value (empty if none) of a GATT call, read straight from
    /// its message: every ReadValue, WriteValue and AcquireNotify comes through here.
    static func of(_ call: IncomingCall) -> (options: GattRequestOptions, value: [UInt8]) {
        var options = GattRequestOptions()
        var value: [UInt8] = []
        call.message.scanArguments(bytes: { _, bytes in value = bytes },
                                   entry: { _, key, v in options.take(key, v) })
        return (options, value)
    }

    private mutating func take(_ key: String, _ value: DBusValue) {
        switch key {
        case "device": device = value.objectPath ?? value.string
        case "mtu": if let v = value.uint16 { mtu = Int(v) }
        case "offset": if let v = value.uint16 { offset = Int(v) }
        case "link": link = value.string
        case "prepare-authorize": prepareAuthorize = value.bool ?? false
        default: break
        }
    }

    /// The central's address ("AA:BB:CC:DD:EE:FF") taken from ``device``, or nil.
    public var address: String? { device.flatMap(BluetoothAddress.fromDevicePath) }
}

extension BluetoothAddress {
    /// "AA:BB:CC:DD:EE:FF" from a device object path `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF`,
    /// or nil when the last element is not `dev_` and an address.
    public static func fromDevicePath(_ path: String) -> String? {
        let bytes = Array(path.utf8)
        let start = bytes.count - 17 - 4
        guard start >= 0, bytes[start..<start + 4].elementsEqual("dev_".utf8),
              start == 0 || bytes[start - 1] == UInt8(ascii: "/") else { return nil }
        let tail = bytes[(start + 4)...]
        return parse(tail, separator: UInt8(ascii: "_"))
    }

    /// "hci0" from `/org/bluez/hci0/dev_…`, or nil.
    public static func adapterName(ofDevicePath path: String) -> String? {
        let parts = path.split(separator: "/")
        guard parts.count >= 3, parts[0] == "org", parts[1] == "bluez" else { return nil }
        return String(parts[2])
    }
}

extension ExportedObjectTree {
    /// Answers only the calls `accepts` approves (nil, its owner gone: none); every other call
    /// to the tree gets NotPermitted (bluez-notes §3.6: ATT 0x02/0x03 if bluetoothd relays it).
    func admitOnly(_ accepts: @escaping (IncomingCall) -> Bool?) {
        admit = { call in
            if accepts(call) == true { return true }
            call.fail(GattError.notPermitted("Not bluetoothd"))
            return false
        }
    }
}

/// The D-Bus errors a GATT server method can answer with, and the ATT error each becomes
/// (bluez-notes §3.6, `dbus_error_to_att_ecode()`).
public enum GattError {
    /// ATT 0x02 Read Not Permitted (for a read) or 0x03 Write Not Permitted (for a write).
    public static func notPermitted(_ message: String = "Not permitted") -> DBusError {
        DBusError(name: "org.bluez.Error.NotPermitted", message: message)
    }
    /// ATT 0x07 Invalid Offset.
    public static func invalidOffset(_ message: String = "Invalid offset") -> DBusError {
        DBusError(name: "org.bluez.Error.InvalidOffset", message: message)
    }
    /// ATT 0x0D Invalid Attribute Value Length.
    public static func invalidValueLength(_ message: String = "Invalid value length") -> DBusError {
        DBusError(name: "org.bluez.Error.InvalidValueLength", message: message)
    }
    /// ATT 0x06 Request Not Supported.
    public static func notSupported(_ message: String = "Not supported") -> DBusError {
        DBusError(name: "org.bluez.Error.NotSupported", message: message)
    }
    /// An application error code, 0x80–0x9F: bluetoothd sends exactly that ATT code when the
    /// message of `org.bluez.Error.Failed` is the number.
    public static func application(_ code: UInt8) -> DBusError {
        precondition(code >= 0x80 && code <= 0x9F, "ATT application errors are 0x80-0x9F")
        return DBusError(name: "org.bluez.Error.Failed", message: "0x" + hexDigits(code))
    }
}

/// One characteristic of a ``GattApplication``: its UUID, flags, and the callbacks that answer
/// bluetoothd's calls.
///
/// `onRead` and `onWrite` get the ``IncomingCall`` and must answer it (at once or later): a read
/// with `call.reply(.bytes(value))`, a write with `call.reply([])`, a refusal with
/// `call.fail(GattError…)`. A write flagged no-reply (characteristics with
/// `write-without-response`: bluetoothd has already acknowledged it) needs no answer.
///
/// Not `Sendable`.
public final class GattCharacteristic {
    public let uuid: String
    public let path: String
    public let servicePath: String
    /// The `Flags` property (bluez-notes §3.3).
    public let flags: [String]
    /// True between `StartNotify` and `StopNotify`, or while bluetoothd holds a notification
    /// socket (bluetoothd calls them for the first and the last subscribed central only, and
    /// without saying which central), or while a central is counted as subscribed without one
    /// (see ``centralDisconnected(_:)``).
    public var notifying: Bool { startNotified || !notifySockets.isEmpty || !withoutSocket.isEmpty }

    /// Set by the server: whether a central (a device object path) is connected.
    public var isCentralConnected: ((String) -> Bool)?
    /// Diagnostics (-v).
    public var log: ((String) -> Void)?
    /// Whether bluetoothd is offered sockets for this characteristic's notifications
    /// (`NotifyAcquired` exported, so it calls `AcquireNotify` instead of `StartNotify`).
    public let offersNotifySocket: Bool

    public var onRead: ((GattRequestOptions, IncomingCall) -> Void)?
    public var onWrite: ((_ value: [UInt8], GattRequestOptions, IncomingCall) -> Void)?
    public var onNotifyingChanged: ((Bool) -> Void)?
    /// Called for every StartNotify (bluetoothd makes one for each central that enables
    /// notifications when it has no socket to use: 5.66 and 5.87 `ccc_write_cb()`), before
    /// ``onNotifyingChanged``.
    public var onStartNotify: (() -> Void)?
    /// Called when bluetoothd acquires a notification socket for a central, with the options of
    /// that call (the central's `device` and `mtu`).
    public var onNotifySocketAcquired: ((GattRequestOptions) -> Void)?
    /// Called when a notification socket can take more after ``sendThroughSocket(_:to:)``
    /// returned `.full`, or when one is gone.
    public var onNotifySocketWritable: (() -> Void)?

    weak var tree: ExportedObjectTree?
    private var startNotified = false

    /// Our end of a socket bluetoothd reads notifications from (AcquireNotify).
    private final class NotifySocket {
        let fd: OwnedFD
        var watch: WatchToken?
        init(fd: OwnedFD) { self.fd = fd }
    }
    /// By the device object path bluetoothd named in AcquireNotify ("" if none).
    private var notifySockets: [String: NotifySocket] = [:]
    private weak var notifySocketLoop: EventLoop?
    /// Centrals still counted as subscribed after bluetoothd closed their socket while they
    /// stayed connected: for a second (`pending`: a timer), or for good (nil) once another
    /// central's disconnect showed the closing was BlueZ's mistake (``centralDisconnected(_:)``).
    private var withoutSocket: [String: TimerToken?] = [:]
    /// The last central that disconnected, and when.
    private var lastDisconnect: (central: String, at: Double)?

    /// How close (seconds) a socket's end and another central's disconnect must be to be one event.
    static let disconnectWindow = 1.0

    init(uuid: String, path: String, servicePath: String, flags: [String], offersNotifySocket: Bool = false) {
        self.uuid = uuid
        self.path = path
        self.servicePath = servicePath
        self.flags = flags
        self.offersNotifySocket = offersNotifySocket && flags.contains("notify")
    }

    /// The largest message bluetoothd reads from a notification socket (5.66 `sock_io_read()`
    /// reads into 512 bytes; a longer SEQPACKET message would be cut).
    public static let socketNotificationLimit = 512

    /// Whether a notification socket can carry `value`: not empty (bluetoothd takes an empty
    /// message for end of file) and at most ``socketNotificationLimit`` bytes.
    public static func socketCanCarry(_ value: [UInt8]) -> Bool {
        !value.isEmpty && value.count <= socketNotificationLimit
    }

    /// The centrals (device object paths) whose AcquireNotify sockets are held.
    public var notifySocketCentrals: [String] { Array(notifySockets.keys) }

    /// Whether any AcquireNotify socket is held.
    public var hasNotifySockets: Bool { !notifySockets.isEmpty }

    /// Whether the AcquireNotify socket of `central` (a device object path) is held.
    public func hasNotifySocket(for central: String) -> Bool { notifySockets[central] != nil }

    /// Bytes written to the notification sockets that bluetoothd has not read yet.
    public var notifySocketBacklog: Int {
        notifySockets.values.reduce(0) { $0 + FileIO.unreadBytes($1.fd.rawValue) }
    }

    public enum SocketSend {
        /// bluetoothd has it.
        case sent
        /// The socket is full; ``onNotifySocketWritable`` is called when it takes more.
        case full
        /// No socket for that central (any more), or a value a socket cannot carry (empty,
        /// over 512 bytes).
        case unavailable
    }

    /// Hands `value` to bluetoothd through the socket it acquired when `central` (a device object
    /// path) subscribed, without a D-Bus message. Who gets it depends on the BlueZ version (bluez-notes §3.8):
    /// up to 5.75 every subscribed central, like ``notify(_:)``; from 5.76 `central` only. So
    /// it reaches exactly `central` when that is the only central connected. An empty value
    /// cannot go this way: bluetoothd takes an empty message for end of file.
    public func sendThroughSocket(_ value: [UInt8], to central: String) -> SocketSend {
        guard let socket = notifySockets[central], Self.socketCanCarry(value) else { return .unavailable }
        do {
            let sent = try value.withUnsafeBytes { raw in
                try Result { () throws(Errno) in try FileIO.sendNow(socket.fd.rawValue, raw) }.get()
            }
            if sent { return .sent }
            if let loop = notifySocketLoop, let watch = socket.watch { loop.setEvents(watch, [.readable, .writable]) }
            return .full
        } catch {
            dropNotifySocket(central)
            return .unavailable
        }
    }

    private func acquireNotify(_ call: IncomingCall) {
        guard let loop = tree?.connection?.loop else {
            call.fail(GattError.notSupported("Not exported"))
            return
        }
        var fds: [Int32] = [-1, -1]
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, type, 0, &fds) == 0 else {
            // Not Failed: with any other error bluetoothd falls back to StartNotify (bluez-notes §3.8).
            call.fail(GattError.notSupported("socketpair: \(Errno.current)"))
            return
        }
        let ours = NotifySocket(fd: OwnedFD(taking: fds[0]))
        let theirs = OwnedFD(taking: fds[1])
        let options = GattRequestOptions.of(call).options
        guard call.reply([.unixFD(theirs), .uint16(UInt16(clamping: options.mtu))]) else { return }
        // The reply holds its own duplicate; ours must go, or bluetoothd's end never sees EOF.
        theirs.close()
        let central = options.device ?? ""
        let was = notifying
        // Asked again for the same central: the new socket replaces the old one. (5.66 can also
        // ask twice for two centrals, when the second subscribes while the first call is under
        // way; it then closes only the second socket when the last central unsubscribes, and the
        // first stays open until that central subscribes again and this replaces it.)
        dropNotifySocket(central, announce: false)
        forgetWithoutSocket(central)
        notifySockets[central] = ours
        notifySocketLoop = loop
        let raw = ours.fd.rawValue
        ours.watch = loop.watch(fd: raw, events: .readable) { [weak self] events in
            self?.notifySocketEvent(central, fd: raw, events)
        }
        onNotifySocketAcquired?(options)
        if !was { onNotifyingChanged?(true) }
    }

    private func notifySocketEvent(_ central: String, fd: Int32, _ events: IOEvents) {
        guard let socket = notifySockets[central], socket.fd.rawValue == fd else { return }
        if events.contains(.writable) {
            if let loop = notifySocketLoop, let watch = socket.watch { loop.setEvents(watch, .readable) }
            onNotifySocketWritable?()
        }
        guard events.contains(.readable) || events.contains(.hangup) || events.contains(.error) else { return }
        // bluetoothd writes nothing here for notifications (5.80+ writes a byte per confirmed
        // indication); end of file or an error means that subscription ended (the central
        // unsubscribed or left) or bluetoothd went away.
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
        if n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if !events.contains(.hangup) && !events.contains(.error) { return }
        }
        socketEnded(central)
    }

    /// bluetoothd closed `central`'s socket: that central unsubscribed or left, or (BlueZ 5.69
    /// to at least 5.87, bluez/bluez#1452) another subscribed central disconnected and
    /// bluetoothd closed the first subscriber's socket along with its own, keeping that
    /// subscription (its CCC) and never asking again. A central still connected is therefore
    /// counted as subscribed for ``disconnectWindow``, for good if another central disconnects
    /// within it (it is notified by signal from then on), and dropped otherwise.
    private func socketEnded(_ central: String) {
        announcingAnEnd {
            dropNotifySocket(central, announce: false)
            guard isCentralConnected?(central) == true, let loop = notifySocketLoop else { return }
            if let last = lastDisconnect, last.central != central,
               MonotonicClock.seconds() - last.at <= Self.disconnectWindow {
                keepWithoutSocket(central, because: last.central)
                return
            }
            withoutSocket[central] = loop.schedule(after: Self.disconnectWindow) { [weak self] in
                guard let self, self.withoutSocket[central] != nil else { return }
                self.announcingAnEnd { self.withoutSocket[central] = nil }
            }
        }
    }

    /// Runs `change`; if notifications were on before it and are off after, says so.
    private func announcingAnEnd(_ change: () -> Void) {
        let was = notifying
        change()
        if was && !notifying { onNotifyingChanged?(false) }
    }

    private func keepWithoutSocket(_ central: String, because other: String) {
        if let pending = withoutSocket[central], let pending { notifySocketLoop?.cancel(pending) }
        withoutSocket[central] = .some(nil)
        log?("\(central): bluetoothd closed its notification socket as \(other) disconnected (bluez/bluez#1452); notifying it by signal")
    }

    private func forgetWithoutSocket(_ central: String) {
        if let pending = withoutSocket.removeValue(forKey: central), let pending { notifySocketLoop?.cancel(pending) }
    }

    /// Tells the characteristic that `central` disconnected. Its subscription is gone, and if
    /// it had one, a socket of another central that bluetoothd closed just now was closed by
    /// mistake.
    public func centralDisconnected(_ central: String) {
        announcingAnEnd {
            let subscribed = notifySockets[central] != nil || withoutSocket[central] != nil
            forgetWithoutSocket(central)
            guard subscribed else { return }
            lastDisconnect = (central, MonotonicClock.seconds())
            for case let (other, _?) in withoutSocket {
                keepWithoutSocket(other, because: central)
            }
        }
    }

    private func dropNotifySocket(_ central: String, announce: Bool = true) {
        guard let socket = notifySockets.removeValue(forKey: central) else { return }
        if let watch = socket.watch, let loop = notifySocketLoop { loop.remove(watch) }
        onNotifySocketWritable?()
        if announce && !notifying { onNotifyingChanged?(false) }
    }

    private func dropNotifySockets() {
        for central in Array(notifySockets.keys) { dropNotifySocket(central, announce: false) }
        for central in Array(withoutSocket.keys) { forgetWithoutSocket(central) }
    }

    /// Sends `value` as a notification (or indication) to every subscribed central: a
    /// `PropertiesChanged` of `Value` on this object, which bluetoothd turns into ATT
    /// notifications, cut to MTU-3 (MTU-5 towards BlueZ centrals) and to 512 bytes. An empty
    /// value gives an empty notification. BlueZ cannot address one central this way
    /// (bluez-notes §3.8).
    ///
    /// The corresponding BlueZ mechanism is `PropertiesChanged` on `GattCharacteristic1.Value`.
    public func notify(_ value: [UInt8]) throws(DBusError) {
        guard let tree else { throw DBusError(name: DBusError.Name.disconnected, message: "The application is not exported") }
        try tree.emitPropertiesChanged(path: path, interface: BlueZ.gattCharacteristicInterface,
                                       changed: ["Value": .bytes(value)])
    }

    func makeInterface() -> ExportedInterface {
        let interface = ExportedInterface(BlueZ.gattCharacteristicInterface)
            .property("UUID") { [uuid] in .string(uuid) }
            .property("Service") { [servicePath] in .objectPath(servicePath) }
            .property("Flags") { [flags] in .stringArray(flags) }
            .method("ReadValue", inSignature: "a{sv}", outSignature: "ay") { [weak self] call in
                guard let self, let onRead = self.onRead else {
                    call.fail(GattError.notSupported("Read not supported"))
                    return
                }
                onRead(GattRequestOptions.of(call).options, call)
            }
            .method("WriteValue", inSignature: "aya{sv}", outSignature: "") { [weak self] call in
                guard let self, let onWrite = self.onWrite else {
                    call.fail(GattError.notSupported("Write not supported"))
                    return
                }
                let (options, value) = GattRequestOptions.of(call)
                onWrite(value, options, call)
            }
            .method("StartNotify", inSignature: "", outSignature: "") { [weak self] call in
                call.reply([])
                self?.onStartNotify?()
                self?.setNotifying(true)
            }
            .method("StopNotify", inSignature: "", outSignature: "") { [weak self] call in
                call.reply([])
                self?.setNotifying(false)
            }
            .method("Confirm", inSignature: "", outSignature: "") { call in
                call.reply([])
            }
        if offersNotifySocket {
            // Its presence alone makes bluetoothd call AcquireNotify (bluez-notes §3.8).
            interface
                .property("NotifyAcquired") { [weak self] in .bool(self?.hasNotifySockets ?? false) }
                .method("AcquireNotify", inSignature: "a{sv}", outSignature: "hq") { [weak self] call in
                        guard let self else {
                        call.fail(GattError.notSupported("Gone"))
                        return
                    }
                    self.acquireNotify(call)
                }
        }
        return interface
    }

    /// Records the subscription state; also used when bluetoothd goes away (its subscriptions go
    /// with it).
    func setNotifying(_ on: Bool) {
        let was = notifying
        startNotified = on
        if !on { dropNotifySockets() }
        if notifying != was { onNotifyingChanged?(notifying) }
    }
}

/// A GATT application for `GattManager1.RegisterApplication`: one primary service with its
/// characteristics, exported as an ``ExportedObjectTree`` whose root carries the ObjectManager
/// bluetoothd reads (bluez-notes §3.1, §3.2).
///
/// ```swift
/// let app = GattApplication(serviceUUID: KnownUUIDs.raspBLEService,
///                           characteristics: [(KnownUUIDs.raspBLECharacteristic, ["read", "write", "notify"])])
/// app.characteristics[0].onWrite = { value, options, call in …; call.reply([]) }
/// try bus.export(app.tree)
/// ```
/// Not `Sendable`.
public final class GattApplication {
    public let root: String
    public let serviceUUID: String
    public let servicePath: String
    public let tree: ExportedObjectTree
    public let characteristics: [GattCharacteristic]

    /// Decides whether a call to any of the application's objects may be answered at all (e.g.
    /// only calls from bluetoothd's unique name; Properties and GetManagedObjects too). A refused
    /// call gets NotPermitted. Default: every call is accepted.
    public var acceptCall: (IncomingCall) -> Bool = { _ in true }

    /// - Parameters:
    ///   - root: the application's object path (the ObjectManager); services go below it.
    ///   - characteristics: UUID and `Flags` of each characteristic, in order.
    ///   - notifySockets: offer bluetoothd a socket for the notifications of each characteristic
    ///     that has `notify` (see ``GattCharacteristic/sendThroughSocket(_:to:)``).
    public init(root: String = "/org/blpipe/gatt", serviceUUID: String, characteristics: [(uuid: String, flags: [String])],
                notifySockets: Bool = false) {
        self.root = root
        self.serviceUUID = serviceUUID
        servicePath = root + "/service0"
        tree = ExportedObjectTree(root: root)
        var made: [GattCharacteristic] = []
        for (i, c) in characteristics.enumerated() {
            made.append(GattCharacteristic(uuid: c.uuid, path: servicePath + "/char\(i)", servicePath: servicePath, flags: c.flags,
                                           offersNotifySocket: notifySockets))
        }
        self.characteristics = made

        let service = ExportedObject(path: servicePath, interfaces: [
            ExportedInterface(BlueZ.gattServiceInterface)
                .property("UUID") { [serviceUUID] in .string(serviceUUID) }
                .property("Primary") { .bool(true) }
                .property("Includes") { .objectPathArray([]) },
        ])
        // Only fails for a path outside the tree, which cannot happen here.
        try? tree.add(service, announce: false)
        for c in made {
            c.tree = tree
            try? tree.add(ExportedObject(path: c.path, interfaces: [c.makeInterface()]), announce: false)
        }
        tree.admitOnly { [weak self] call in self?.acceptCall(call) }
    }

    /// Tells every characteristic that no central is subscribed any more (bluetoothd went away).
    public func resetSubscriptions() {
        for c in characteristics { c.setNotifying(false) }
    }
}
