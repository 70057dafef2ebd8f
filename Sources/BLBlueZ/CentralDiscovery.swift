import BLCommand
import BLDBus

/// A discovery session on one adapter: sets a filter, starts scanning, and reports every
/// advertising report bluetoothd passes on as a "sighting" of a device.
///
/// bluetoothd creates Device objects before it applies any filter and merges the filters of all
/// clients (bluez-notes §1.2), so callers must filter what they receive themselves. With a filter
/// set, bluetoothd signals RSSI on every report, which is how devices it already knew are seen
/// again.
public final class Discovery {
    /// What bluetoothd is asked to filter by, besides LE. Not service UUIDs: bluetoothd 5.87
    /// crashes on the first advertisement with a service UUID while a client's filter has
    /// UUIDs (bluez/bluez#2282, fixed after 5.87), and callers check UUIDs themselves anyway.
    public struct Filter {
        /// RSSI threshold in dBm handed to the kernel, or nil.
        public var rssi: Int?
        public init(rssi: Int? = nil) {
            self.rssi = rssi
        }
    }

    public let client: BlueZClient
    public let adapter: Adapter
    public let filter: Filter
    /// Every device under the adapter bluetoothd knows, kept up to date while scanning.
    public private(set) var devices: [String: DeviceInfo] = [:]
    /// Called for each advertising report (a new device or a known one reporting again).
    public var onSighting: ((DeviceInfo) -> Void)?
    /// Called when bluetoothd forgets a device.
    public var onRemoved: ((String) -> Void)?
    /// Called, with the reason, when the scan cannot go on: bluetoothd left the bus (its objects
    /// go without a signal, and so does the scan) or the connection to the bus was lost, or the
    /// adapter went away or was powered off.
    public var onGone: ((String) -> Void)?

    private var tokens: [SubscriptionToken] = []
    private var scanning = false
    private var goneReported = false
    private var goneTimer: TimerToken?
    /// How long the adapter's going waits for bluetoothd's own leaving to be the reason.
    static let adapterGoneDelay = 0.2

    /// Reports (once) that the scan cannot go on, now or after `delay` seconds.
    private func gone(_ reason: String, after delay: Double = 0) {
        guard !goneReported else { return }
        scanning = false
        if delay > 0 {
            if goneTimer == nil {
                goneTimer = client.loop.schedule(after: delay) { [weak self] in
                    self?.goneTimer = nil
                    self?.gone(reason)
                }
            }
            return
        }
        if let goneTimer { client.loop.cancel(goneTimer) }
        goneTimer = nil
        goneReported = true
        onGone?(reason)
    }

    public init(client: BlueZClient, adapter: Adapter, filter: Filter = Filter()) {
        self.client = client
        self.adapter = adapter
        self.filter = filter
    }

    deinit { stop() }

    /// Subscribes to device signals, sets the discovery filter and starts scanning.
    ///
    /// - Parameter busyLimit: for how long StartDiscovery is asked again while bluetoothd
    ///   answers InProgress (seconds; callers give the time they scan for).
    public func start(busyLimit: Double = 5) throws(ToolError) {
        let bus = client.bus
        let prefix = adapter.path + "/"
        do {
            tokens.append(try bus.subscribeInterfacesAdded(sender: BlueZ.service) { [weak self] path, interfaces in
                guard let self, path.hasPrefix(prefix), let properties = interfaces[BlueZ.deviceInterface] else { return }
                var info = self.devices[path] ?? DeviceInfo(path: path, properties: [:])
                info.update(changed: properties, invalidated: [])
                self.devices[path] = info
                self.onSighting?(info)
            })
            tokens.append(try bus.subscribeInterfacesRemoved(sender: BlueZ.service) { [weak self] path, interfaces in
                guard let self, interfaces.contains(BlueZ.deviceInterface), self.devices.removeValue(forKey: path) != nil else { return }
                self.onRemoved?(path)
            })
            tokens.append(try bus.subscribeNameOwnerChanged(BlueZ.service) { [weak self] _, _, new in
                guard let self, (new ?? "").isEmpty else { return }
                self.gone(self.client.bluetoothdGoneReason)
            })
            // The adapter unplugged (InterfacesRemoved) or powered off ends the scan too. A
            // bluetoothd that is stopping powers its adapters off and removes them just before it
            // leaves the bus: its leaving, if it comes within a moment, is the reason given.
            tokens.append(try bus.subscribeInterfacesRemoved(sender: BlueZ.service) { [weak self] path, interfaces in
                guard let self, path == self.adapter.path, interfaces.contains(BlueZ.adapterInterface) else { return }
                self.gone("\(self.adapter.name) went away", after: Self.adapterGoneDelay)
            })
            tokens.append(try bus.subscribePropertiesChanged(sender: BlueZ.service, pathNamespace: adapter.path,
                                                             interface: BlueZ.adapterInterface) { [weak self] path, _, changed, _ in
                guard let self, path == self.adapter.path, changed["Powered"]?.bool == false else { return }
                self.gone("\(self.adapter.name) was powered off", after: Self.adapterGoneDelay)
            })
            tokens.append(try bus.subscribePropertiesChanged(sender: BlueZ.service, pathNamespace: adapter.path,
                                                             interface: BlueZ.deviceInterface) { [weak self] path, _, changed, invalidated in
                guard let self, var info = self.devices[path] else { return }
                info.update(changed: changed, invalidated: invalidated)
                self.devices[path] = info
                // A report carries RSSI (always signalled with a filter set) or advertising data.
                let reportKeys = ["RSSI", "ManufacturerData", "ServiceData", "UUIDs", "Name", "TxPower"]
                if changed.keys.contains(where: reportKeys.contains) { self.onSighting?(info) }
            })
        } catch {
            stop()
            throw BlueZErrors.toolError("watching bluetoothd's devices", error)
        }
        for device in try client.managedObjects().devices(of: adapter) { devices[device.path] = device }

        var entries: [(String, DBusValue)] = [("Transport", .string("le")), ("DuplicateData", .bool(true))]
        if let rssi = filter.rssi { entries.append(("RSSI", .int16(Int16(clamping: rssi)))) }
        _ = try client.call(adapter.path, BlueZ.adapterInterface, "SetDiscoveryFilter", [.stringDict(ordered: entries)],
                            timeout: 10, what: "setting the discovery filter on \(adapter.name)")
        try startScanning(busyLimit: busyLimit)
        scanning = true
    }

    /// StartDiscovery, asked again for up to `busyLimit` seconds while bluetoothd answers
    /// InProgress. This client has no discovery of its own yet, so that answer means the kernel
    /// refused to start one (Busy): the adapter's last discovery has not ended yet. That is the
    /// one of a tool that has just ended until it is stopped (bluetoothd stops it when its client
    /// leaves, and Discovery.stop does not wait), and one a bluetoothd that crashed or was killed
    /// had started until the kernel's own limit ends it (about 10 s; seen on the bench).
    private func startScanning(busyLimit: Double) throws(ToolError) {
        let what = "starting discovery on \(adapter.name)"
        let until = MonotonicClock.seconds() + busyLimit
        var pause = 0.05
        while true {
            do {
                _ = try client.bus.callAndWait(destination: BlueZ.service, path: adapter.path, interface: BlueZ.adapterInterface,
                                               member: "StartDiscovery", timeout: 10)
                return
            } catch {
                guard BlueZClient.isInProgress(error), !client.loop.isStopping,
                      MonotonicClock.seconds() + pause < until else {
                    throw BlueZErrors.toolError(what, error)
                }
                if pause == 0.05 { Tool.note("\(adapter.name) has not ended an earlier discovery yet: asking again") }
                client.loop.sleep(pause)
                pause = min(pause * 2, 0.5)
            }
        }
    }

    /// Stops scanning (bluetoothd keeps the radio scanning while other clients still are) and
    /// drops the subscriptions. Safe to call twice.
    public func stop() {
        for token in tokens { client.bus.unsubscribe(token) }
        tokens = []
        if let goneTimer { client.loop.cancel(goneTimer) }
        goneTimer = nil
        if scanning {
            scanning = false
            // Best effort, without waiting: bluetoothd also ends the session when we disconnect.
            client.bus.call(destination: BlueZ.service, path: adapter.path, interface: BlueZ.adapterInterface,
                            member: "StopDiscovery", timeout: 5) { _ in }
        }
    }
}

/// How a tool names a device: an address, or an advertised name.
public enum DeviceSelector: CustomStringConvertible, Sendable {
    case address(String)
    case name(String)

    public init(_ text: String) {
        if let address = BluetoothAddress.normalize(text) {
            self = .address(address)
        } else {
            self = .name(text)
        }
    }

    var isName: Bool {
        if case .name = self { return true }
        return false
    }

    public func matches(_ device: DeviceInfo) -> Bool {
        switch self {
        case .address(let address): return device.address.uppercased() == address
        case .name(let name): return device.name == name || device.alias == name
        }
    }

    public var description: String {
        switch self {
        case .address(let address): return address
        case .name(let name): return "'\(name)'"
        }
    }
}

extension BlueZClient {
    /// Finds a device: one bluetoothd already knows is used at once; otherwise the adapter scans
    /// for up to `scanTimeout` seconds. Exit status 69 when nothing matched in time.
    ///
    /// A name several known devices answer to (one of them perhaps long gone) is settled by
    /// scanning: the first of them heard advertising is taken, unless one is connected. So is a
    /// name whose one known device has a private address (``DeviceInfo/knownByPrivateAddress``):
    /// the device may advertise under another by now.
    /// `listed`: bluetoothd's objects as just listed by the caller, saving a listing.
    public func findDevice(_ selector: DeviceSelector, on adapter: Adapter, scanTimeout: Double,
                           listed: BlueZObjects? = nil) throws(ToolError) -> DeviceInfo {
        let known = try managedObjects(reusing: listed).devices(of: adapter).filter(selector.matches)
        // A connected device does not advertise, so prefer it; then the only known match.
        if let device = known.first(where: { $0.connected }) { return device }
        let privateOnly = known.count == 1 && known[0].knownByPrivateAddress && selector.isName
        if known.count == 1 && !privateOnly { return known[0] }
        let ambiguous = known.count > 1
        let addresses = known.map(\.address).joined(separator: ", ")
        if ambiguous {
            Tool.note("\(known.count) known devices are named \(selector) (\(addresses)): scanning for one that is there")
        } else if privateOnly {
            Tool.note("\(selector) is known by a private address (\(addresses)) it may no longer use: scanning for it")
        }
        let discovery = Discovery(client: self, adapter: adapter)
        var found: DeviceInfo?
        var gone: String?
        discovery.onSighting = { device in
            if found == nil && selector.matches(device) { found = device }
        }
        discovery.onGone = { reason in if gone == nil { gone = reason } }
        let deadline = MonotonicClock.seconds() + scanTimeout
        try discovery.start(busyLimit: scanTimeout)
        defer { discovery.stop() }
        _ = loop.run(until: { found != nil || gone != nil }, timeout: max(0, deadline - MonotonicClock.seconds()))
        guard let device = found else {
            if loop.isStopping { throw ToolError(.unavailable, "interrupted while scanning for \(selector)") }
            if let gone { throw ToolError(.unavailable, "\(gone) while scanning for \(selector)") }
            if ambiguous {
                throw ToolError(.unavailable, "\(known.count) devices named \(selector) are known (\(addresses)), "
                                + "none was heard on \(adapter.name) within \(formatSeconds(scanTimeout)) s: give an address")
            }
            if privateOnly {
                throw ToolError(.unavailable, "no device \(selector) heard on \(adapter.name) within \(formatSeconds(scanTimeout)) s"
                                + " (it was known by the private address \(addresses))")
            }
            throw ToolError(.unavailable, "no device \(selector) found on \(adapter.name) within \(formatSeconds(scanTimeout)) s")
        }
        return device
    }
}
