import BLCommand
import BLDBus

/// A link to a remote device, made or found by `BlueZClient.connect`.
public final class Peer {
    public let client: BlueZClient
    public let device: DeviceInfo
    /// True when this process made the connection; only then does `disconnect()` end it. A link
    /// is shared by every process using the device (bluez-notes §9.6).
    public let madeConnection: Bool
    /// True when the link was already up as `BlueZClient.connect` began (not brought up by a
    /// connection attempt, ours or another process's, while it waited).
    public let foundConnected: Bool
    /// Disconnect was sent, or the link is to stay up (another process uses it, or
    /// ``leaveUp(because:)``).
    private var disconnected = false
    /// bluetoothd's objects, listed while this link was already up with its services resolved
    /// (and found up again as `connect` began, `foundConnected`): `characteristic` looks there
    /// first. Were the link to go and come back within those milliseconds, a path found there
    /// that no longer exists would fail its first call.
    var resolvedListing: BlueZObjects?

    init(client: BlueZClient, device: DeviceInfo, madeConnection: Bool, foundConnected: Bool) {
        self.client = client
        self.device = device
        self.madeConnection = madeConnection
        self.foundConnected = foundConnected
    }

    public var path: String { device.path }

    /// Is the link still up? (Reads the property: the change signal is not always sent, §9.5.)
    public var isConnected: Bool {
        (try? client.property(path, BlueZ.deviceInterface, "Connected", what: "").bool) ?? false
    }

    /// What this process itself took on the device's characteristics, as "PATH PROPERTY"
    /// (NotifyAcquired, WriteAcquired, Notifying): bluetoothd clears those only some time after
    /// they are given back, so they do not count as another process's use.
    var ownUse: Set<String> = []

    /// Leaves a link this process made up when it ends (``disconnect(timeout:)`` does nothing),
    /// saying why: ending it could lose what bluetoothd still has to send.
    public func leaveUp(because reason: String) {
        guard madeConnection, !disconnected else { return }
        disconnected = true
        Tool.warn("leaving the connection to \(device.address) up: \(reason)")
    }

    /// Ends the link if this process made it, unless another process is seen using the device
    /// (the link is shared, bluez-notes §9.6); otherwise leaves it to its owner.
    public func disconnect(timeout: Double = 5) {
        guard madeConnection, !disconnected else { return }
        if let use = otherUse() {
            // (Unless a second signal, while bluetoothd was being asked, has disconnected.)
            guard !disconnected else { return }
            disconnected = true
            Tool.note("leaving the connection to \(device.address) up: another process uses \(use)")
            return
        }
        guard !disconnected else { return }
        disconnected = true
        _ = try? client.call(path, BlueZ.deviceInterface, "Disconnect", timeout: timeout, what: "disconnecting")
    }

    /// The same when the process is about to exit (a second signal): bluetoothd is given a moment
    /// to say whether another process uses the link, then Disconnect is sent without waiting for
    /// its answer. Also while ``disconnect(timeout:)`` is still asking.
    public func disconnectBeforeExit() {
        guard madeConnection, !disconnected else { return }
        if otherUse(timeout: 0.3) == nil {
            client.bus.call(destination: BlueZ.service, path: path, interface: BlueZ.deviceInterface,
                            member: "Disconnect", timeout: 1) { _ in }
            client.bus.flush(timeout: 1)
        }
        disconnected = true
    }

    /// What another process is seen using on the device: a characteristic's notifications
    /// (AcquireNotify or StartNotify) or its write socket (AcquireWrite). Writes through
    /// WriteValue leave no trace. Nil when nothing is seen, or bluetoothd cannot be asked.
    func otherUse(timeout: Double = 10) -> String? {
        guard let objects = try? client.managedObjects(timeout: timeout) else { return nil }
        for charPath in objects.paths(with: BlueZ.gattCharacteristicInterface, under: path) {
            guard let properties = objects.properties(charPath, BlueZ.gattCharacteristicInterface) else { continue }
            for (key, what) in [("NotifyAcquired", "the notifications"), ("Notifying", "the notifications"),
                                ("WriteAcquired", "the write socket")]
            where properties[key]?.bool == true && !ownUse.contains("\(charPath) \(key)") {
                return "\(what) of \(properties["UUID"]?.string?.lowercased() ?? charPath)"
            }
        }
        return nil
    }

    /// Finds a characteristic of a service, both given as 128-bit UUIDs. bluetoothd may report
    /// ServicesResolved before every object is listed (bluez/bluez#1489), so it looks again for
    /// up to `timeout` seconds. Where the device has several with that UUID, the first with one
    /// of the flags in `preferring` is taken (else the first).
    public func characteristic(service: String, uuid: String, preferring: [String] = [],
                               timeout: Double = 3) throws(ToolError) -> RemoteCharacteristic {
        let deadline = MonotonicClock.seconds() + timeout
        var earlier = resolvedListing
        while true {
            let listedEarlier = earlier != nil
            let objects = try client.managedObjects(reusing: earlier)
            earlier = nil
            let services = objects.paths(with: BlueZ.gattServiceInterface, under: path).filter {
                objects.properties($0, BlueZ.gattServiceInterface)?["UUID"]?.string?.lowercased() == service
            }
            var found: [(path: String, properties: [String: DBusValue])] = []
            for servicePath in services {
                for charPath in objects.paths(with: BlueZ.gattCharacteristicInterface, under: servicePath) {
                    let properties = objects.properties(charPath, BlueZ.gattCharacteristicInterface)!
                    if properties["UUID"]?.string?.lowercased() == uuid { found.append((charPath, properties)) }
                }
            }
            let usable = found.first { ($0.properties["Flags"]?.stringArray ?? []).contains(where: preferring.contains) }
            if let (charPath, properties) = usable ?? found.first {
                if found.count > 1 { Tool.note("\(found.count) characteristics \(uuid) on \(device.address): taking \(charPath)") }
                Tool.note("characteristic \(uuid) at \(charPath), flags \(properties["Flags"]?.stringArray?.joined(separator: ",") ?? "?")")
                // The fence's descriptor is looked up in the same listing only when it
                // was made before the link's use began; a new one may predate a late
                // export (bluez/bluez#1489), so the fence then lists again.
                return RemoteCharacteristic(peer: self, path: charPath, properties: properties,
                                            listing: listedEarlier ? objects : nil)
            }
            if listedEarlier { continue }  // not in the earlier listing: look in a new one at once
            if MonotonicClock.seconds() >= deadline {
                let what = services.isEmpty ? "service \(service)" : "characteristic \(uuid) in service \(service)"
                throw ToolError(.unavailable, "\(device.address) has no \(what)")
            }
            client.loop.sleep(0.2)
        }
    }
}

/// Watches a link in use for its end: the device disconnecting, bluetoothd leaving the bus (its
/// objects then go without a signal), or one of the characteristics in use going away while the
/// link stays up (the peer's GATT database changed: bluez-notes §3.9). Calls `onLoss` once.
/// Cancelled by ``cancel()`` or when released.
public final class LinkWatch {
    public enum Loss: Equatable {
        case disconnected
        /// bluetoothd left the bus, or the connection to the bus was lost.
        case bluetoothdStopped
        /// The characteristic at this object path was removed.
        case removed(String)
    }

    private let bus: DBusConnection
    private let loop: EventLoop
    private var tokens: [SubscriptionToken] = []
    private var onLoss: ((Loss) -> Void)?
    private var settling: TimerToken?

    init(peer: Peer, characteristics: [String], onLoss: @escaping (Loss) -> Void) throws(ToolError) {
        bus = peer.client.bus
        loop = peer.client.loop
        self.onLoss = onLoss
        let device = peer.path
        do {
            tokens.append(try bus.subscribePropertiesChanged(sender: BlueZ.service, path: device,
                                                             interface: BlueZ.deviceInterface) { [weak self] _, _, changed, _ in
                if changed["Connected"]?.bool == false { self?.lost(.disconnected) }
            })
            tokens.append(try bus.subscribeNameOwnerChanged(BlueZ.service) { [weak self] _, _, new in
                if (new ?? "").isEmpty { self?.lost(.bluetoothdStopped) }
            })
            tokens.append(try bus.subscribeInterfacesRemoved(sender: BlueZ.service) { [weak self] object, interfaces in
                if device == object || device.hasPrefix(object + "/") {
                    // The device itself (or its adapter) went; not just another of its interfaces.
                    if interfaces.contains(object == device ? BlueZ.deviceInterface : BlueZ.adapterInterface) {
                        self?.lost(.disconnected)
                    }
                    return
                }
                // A characteristic in use, or its service. bluetoothd also removes them as a link
                // goes down, perhaps before it says so: what it was is settled a moment later.
                if let path = characteristics.first(where: { $0 == object || $0.hasPrefix(object + "/") }) {
                    self?.settle(peer, .removed(path))
                }
            })
        } catch {
            cancel()
            throw BlueZErrors.toolError("watching \(peer.device.address)", error)
        }
        // A link that went before the signals were watched (while the caller looked up its
        // characteristic, say) is told now, once the caller holds the watch: not at its first
        // use, which may wait for input for ever.
        if (try? peer.client.property(device, BlueZ.deviceInterface, "Connected", what: "").bool) == false {
            loop.callSoon { [weak self] in self?.lost(.disconnected) }
        }
    }

    deinit { cancel() }

    public func cancel() {
        for token in tokens { bus.unsubscribe(token) }
        tokens = []
        if let settling { loop.cancel(settling) }
        settling = nil
        onLoss = nil
    }

    /// `loss`, unless the link turns out to be down within half a second.
    private func settle(_ peer: Peer, _ loss: Loss) {
        guard settling == nil, onLoss != nil else { return }
        settling = loop.schedule(after: 0.5) { [weak self, weak peer] in
            guard let self else { return }
            self.settling = nil
            self.lost(peer?.isConnected == true ? loss : .disconnected)
        }
    }

    private func lost(_ loss: Loss) {
        guard let onLoss else { return }
        cancel()
        onLoss(loss)
    }
}

extension Peer {
    /// Calls `onLoss` when the link ends or one of `characteristics` (object paths) goes away;
    /// see ``LinkWatch``. Keep the watch as long as it is wanted.
    public func watch(characteristics: [String], onLoss: @escaping (LinkWatch.Loss) -> Void) throws(ToolError) -> LinkWatch {
        try LinkWatch(peer: self, characteristics: characteristics, onLoss: onLoss)
    }

    /// A one-line reason for `loss`.
    public func describe(_ loss: LinkWatch.Loss, uuid: String) -> String {
        switch loss {
        case .disconnected: return "\(device.address) disconnected"
        case .bluetoothdStopped: return client.bluetoothdGoneReason
        case .removed: return "characteristic \(uuid) of \(device.address) went away (its services changed)"
        }
    }
}

extension BlueZClient {
    /// Connects to `device` (unless it already is connected) and waits for its services to be
    /// resolved, all within `timeout` seconds. Transient failures that users of other BlueZ
    /// clients report (le-connection-abort-by-local, "Operation already in progress", a
    /// connection that failed to be established) are retried until the time is up.
    /// `rediscover` finds the device again, within the seconds it is given, when bluetoothd
    /// removed it after a failed attempt.
    public func connect(_ device: DeviceInfo, timeout: Double,
                        rediscover: ((Double) throws(ToolError) -> DeviceInfo)? = nil) throws(ToolError) -> Peer {
        var device = device
        let deadline = MonotonicClock.seconds() + timeout
        let connectedNow = (try? property(device.path, BlueZ.deviceInterface, "Connected", what: "").bool) ?? false
        var made = false
        var attempt = 0
        // A link we made that fell while its services were being resolved is made again.
        connecting: while true {
            if !connectedNow || made {
                made = false
                while true {
                    if loop.isStopping { throw ToolError.quiet(.interrupted) }
                    // bluetoothd answers Connect with success at once when the link is up: after
                    // a failed attempt, a link up now is another's (it came up while we
                    // waited), and ours to use, not to end.
                    if attempt > 0, (try? property(device.path, BlueZ.deviceInterface, "Connected", what: "").bool) == true {
                        made = false
                        break
                    }
                    attempt += 1
                    let left = deadline - MonotonicClock.seconds()
                    do {
                        _ = try bus.callAndWait(destination: BlueZ.service, path: device.path, interface: BlueZ.deviceInterface,
                                                member: "Connect", timeout: max(1, left))
                        made = true
                        break
                    } catch {
                        let left = deadline - MonotonicClock.seconds()
                        if error.shortName == "AlreadyConnected" { break }
                        if error.name == DBusError.Name.interrupted {
                            // Our Connect goes on in bluetoothd: cancel it, or the link comes up
                            // after we have gone and stays (bluez-notes §7).
                            loop.clearStop()
                            _ = try? call(device.path, BlueZ.deviceInterface, "Disconnect", timeout: 5, what: "cancelling the connection")
                            throw ToolError.quiet(.interrupted)
                        }
                        if error.name == DBusError.Name.noReply || left <= 0 {
                            if error.name == DBusError.Name.noReply {
                                // Our Connect is still pending in bluetoothd: cancel it, or the link
                                // may come up after we gave up and stay (bluez-notes §7).
                                _ = try? call(device.path, BlueZ.deviceInterface, "Disconnect", timeout: 5, what: "cancelling the connection")
                            }
                            throw ToolError(.tempFail, "could not connect to \(device.address) within \(formatSeconds(timeout)) s"
                                            + " (\(attempt) attempt\(attempt == 1 ? "" : "s"); last: \(error.oneLine))")
                        }
                        if error.shortName == "UnknownObject", attempt > 1, let rediscover {
                            // A device found by scanning is temporary: after a failed attempt
                            // bluetoothd may remove it (bluez-notes §7). Find it again.
                            Tool.note("\(device.address) was removed after a failed attempt; looking for it again")
                            device = try rediscover(max(0.5, left))
                            continue
                        }
                        guard BlueZClient.isTransientConnectError(error) else {
                            throw BlueZErrors.toolError("connecting to \(device.address)", error)
                        }
                        if BlueZClient.isInProgress(error) {
                            // Someone else (another tool, bluetoothd's auto-connect) is connecting:
                            // use that link when it comes up, and leave it to its maker.
                            let until = MonotonicClock.seconds() + min(5, max(0, left))
                            var connected = false
                            while !connected && !loop.isStopping && MonotonicClock.seconds() < until {
                                loop.sleep(0.1)
                                connected = (try? property(device.path, BlueZ.deviceInterface, "Connected", what: "").bool) == true
                            }
                            if connected { break }
                            continue
                        }
                        loop.sleep(min(0.5, max(0, left)))
                    }
                }
            }
            let peer = Peer(client: self, device: device, madeConnection: made, foundConnected: connectedNow)
            let connectedAt = MonotonicClock.seconds()
            while true {
                if (try? property(device.path, BlueZ.deviceInterface, "ServicesResolved", what: "").bool) == true { break }
                if loop.isStopping {
                    // Interrupted: every wait now gives up at once. End the link we made first.
                    loop.clearStop()
                    peer.disconnect()
                    throw ToolError.quiet(.interrupted)
                }
                if MonotonicClock.seconds() >= deadline {
                    peer.disconnect()
                    throw ToolError(.tempFail, "\(device.address): services not resolved within \(formatSeconds(timeout)) s")
                }
                if !peer.isConnected && MonotonicClock.seconds() > connectedAt + 1 {
                    if made && MonotonicClock.seconds() < deadline - 1 {
                        // The link fell (a supervision timeout, interference): try again while
                        // there is time.
                        Tool.note("\(device.address) disconnected while its services were being resolved; connecting again")
                        continue connecting
                    }
                    // Also when the property could not be read: a link we made must not stay.
                    peer.disconnect()
                    throw ToolError(.unavailable, "\(device.address) disconnected while its services were being resolved")
                }
                loop.sleep(0.05)
            }
            return peer
        }
    }

    static func isInProgress(_ error: DBusError) -> Bool {
        error.shortName == "InProgress" || error.message.lowercased().contains("in progress")
    }

    static func isTransientConnectError(_ error: DBusError) -> Bool {
        if isInProgress(error) { return true }
        let text = error.message.lowercased()
        return ["abort-by-local", "in progress", "failed to be established", "connection abort",
                "connection refused", "page timeout", "connection timed out"].contains { text.contains($0) }
    }
}
