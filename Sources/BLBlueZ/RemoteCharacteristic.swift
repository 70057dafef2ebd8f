import BLCommand
import BLDBus

/// A characteristic of a connected device (`org.bluez.GattCharacteristic1` under the device).
public final class RemoteCharacteristic {
    public let peer: Peer
    public let path: String
    public let uuid: String
    /// "read", "write", "write-without-response", "notify", "indicate"…
    public let flags: [String]
    /// The listing of bluetoothd's objects this characteristic was found in.
    private let listing: BlueZObjects?

    init(peer: Peer, path: String, properties: [String: DBusValue], listing: BlueZObjects? = nil) {
        self.peer = peer
        self.path = path
        uuid = properties["UUID"]?.string?.lowercased() ?? ""
        flags = properties["Flags"]?.stringArray ?? []
        self.listing = listing
    }

    var client: BlueZClient { peer.client }

    public func has(_ flag: String) -> Bool { flags.contains(flag) }

    /// The ATT MTU of the link, read from the property (its change signal is not always sent,
    /// bluez-notes §9.2). 23 before the exchange or when bluetoothd is older than 5.62.
    public var mtu: Int {
        (try? client.property(path, BlueZ.gattCharacteristicInterface, "MTU", what: "").uint16).map(Int.init) ?? 23
    }

    /// The largest value one write may carry: MTU-3 for the ATT header, and at most 510 because
    /// a BlueZ 5.66 peripheral refuses longer writes (bluez-notes §9.1; fixed upstream in 5.69).
    public static func writeLimit(mtu: Int) -> Int { max(20, min(mtu - 3, 510)) }

    // MARK: Read

    /// Reads the value (bluetoothd continues with Read Blob requests up to 512 bytes).
    /// The corresponding BlueZ method is `ReadValue`.
    public func read(offset: Int = 0, timeout: Double = 30, completion: @escaping (Result<[UInt8], ToolError>) -> Void) {
        var options: [(String, DBusValue)] = []
        if offset > 0 { options.append(("offset", .uint16(UInt16(clamping: offset)))) }
        client.bus.call(destination: BlueZ.service, path: path, interface: BlueZ.gattCharacteristicInterface,
                        member: "ReadValue", args: [.stringDict(ordered: options)], timeout: timeout) { result in
            switch result {
            case .success(let values):
                completion(.success(values.first?.bytes ?? []))
            case .failure(let error):
                completion(.failure(BlueZErrors.toolError("reading \(self.uuid)", error)))
            }
        }
    }

    public func read(offset: Int = 0, timeout: Double = 30) throws(ToolError) -> [UInt8] {
        let reply = try client.call(path, BlueZ.gattCharacteristicInterface, "ReadValue",
                                    [offset > 0 ? .stringDict(ordered: [("offset", .uint16(UInt16(clamping: offset)))]) : .stringDict(ordered: [])],
                                    timeout: timeout, what: "reading \(uuid)")
        return reply.first?.bytes ?? []
    }

    // MARK: Ordering reads

    /// A read whose answer proves that the Write Commands queued before it have left.
    ///
    /// bluetoothd sends queued commands before the next request on the link (shared/att.c
    /// pick_next_send_op()), so the answer to a read comes only after them. A Client
    /// Characteristic Configuration descriptor is read in preference to the characteristic:
    /// reading it never has side effects, while a RaspBLE-style server hands out the next piece
    /// of a reply on every read of its characteristic.
    public struct OrderingRead {
        let peer: Peer
        let path: String
        let interface: String
        /// What is read, for messages: "the CCC descriptor of …" or the characteristic's UUID.
        public let what: String

        /// The corresponding BlueZ method is `ReadValue` (GattDescriptor1 or GattCharacteristic1).
        public func read(timeout: Double, completion: @escaping (Result<Void, ToolError>) -> Void) {
            peer.client.bus.call(destination: BlueZ.service, path: path, interface: interface, member: "ReadValue",
                                 args: [.stringDict(ordered: [])], timeout: timeout) { result in
                switch result {
                case .success: completion(.success(()))
                case .failure(let error): completion(.failure(BlueZErrors.toolError("reading \(what)", error)))
                }
            }
        }
    }

    /// The read to fence Write Commands with: a CCC descriptor of this service, else this
    /// characteristic when it is readable, else nil. (Not another service's: it may need a
    /// security level this one does not.)
    public func orderingRead() -> OrderingRead? {
        let ccc = "00002902" + BluetoothUUID.baseSuffix
        let servicePath = String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)])
        if let objects = try? client.managedObjects(reusing: listing),
           let found = objects.paths(with: BlueZ.gattDescriptorInterface, under: servicePath).first(where: {
               objects.properties($0, BlueZ.gattDescriptorInterface)?["UUID"]?.string?.lowercased() == ccc
           }) {
            return OrderingRead(peer: peer, path: found, interface: BlueZ.gattDescriptorInterface,
                                what: "a CCC descriptor (\(found))")
        }
        if has("read") {
            return OrderingRead(peer: peer, path: path, interface: BlueZ.gattCharacteristicInterface, what: uuid)
        }
        return nil
    }

    // MARK: Write

    public enum WriteType: String, Sendable {
        case request, command
    }

    /// Writes one value. bluetoothd refuses a second write on the same characteristic while one
    /// is pending (InProgress), so callers keep at most one in flight. That pending write may be
    /// another client's (bluetoothd keeps one per characteristic, whoever asked): a refused
    /// write never left, so it is sent again after a short pause, for up to `timeout` seconds
    /// (each attempt waits up to `timeout` for its answer).
    /// The corresponding BlueZ method is `WriteValue`.
    @discardableResult
    public func write(_ bytes: [UInt8], type: WriteType, timeout: Double = 30,
                      completion: @escaping (Result<Void, ToolError>) -> Void) -> PendingWrite {
        let pending = PendingWrite(loop: client.loop)
        let busyUntil = MonotonicClock.seconds() + timeout
        func attempt() {
            client.bus.call(destination: BlueZ.service, path: path, interface: BlueZ.gattCharacteristicInterface,
                            member: "WriteValue", args: [.bytes(bytes), .stringDict(ordered: [("type", .string(type.rawValue))])],
                            timeout: timeout) { [weak self] result in
                guard let self, !pending.isCancelled else { return }
                switch result {
                case .success:
                    completion(.success(()))
                case .failure(let error) where error.shortName == "InProgress":
                    let pause = Double.random(in: Self.busyPause)
                    guard MonotonicClock.seconds() + pause < busyUntil else {
                        completion(.failure(ToolError(.tempFail, "writing to \(self.uuid): another client kept "
                                                      + "writing to it for \(formatSeconds(timeout)) s (\(error.oneLine))")))
                        return
                    }
                    pending.retry = self.client.loop.schedule(after: pause) {
                        pending.retry = nil
                        attempt()
                    }
                case .failure(let error):
                    completion(.failure(BlueZErrors.toolError("writing to \(self.uuid)", error)))
                }
            }
        }
        attempt()
        return pending
    }

    /// How long a write refused as InProgress waits before it is sent again (random, so that
    /// two writers do not keep colliding).
    static let busyPause = 0.002...0.02

    /// A write under way, which may be waiting to be sent again.
    public final class PendingWrite {
        private let loop: EventLoop
        fileprivate var retry: TimerToken?
        public private(set) var isCancelled = false

        init(loop: EventLoop) { self.loop = loop }

        /// Nothing more is sent for this write, and its completion is not called.
        public func cancel() {
            isCancelled = true
            if let retry { loop.cancel(retry) }
            retry = nil
        }
    }

    // MARK: Acquired sockets

    /// A SOCK_SEQPACKET socket from AcquireWrite or AcquireNotify: one datagram per ATT value.
    public struct AcquiredSocket {
        public let fd: OwnedFD
        /// The ATT MTU bluetoothd reported (not the payload size).
        public let mtu: Int
    }

    /// Each datagram written becomes one Write Command. Needs `write-without-response`.
    /// The corresponding BlueZ method is `AcquireWrite`.
    public func acquireWrite() throws(ToolError) -> AcquiredSocket {
        try acquire("AcquireWrite")
    }

    /// Each notification arrives as one datagram; `Value` signals stop meanwhile.
    /// The corresponding BlueZ method is `AcquireNotify`.
    public func acquireNotify(timeout: Double = 10) throws(ToolError) -> AcquiredSocket {
        try acquire("AcquireNotify", timeout: timeout)
    }

    private func acquire(_ member: String, timeout: Double = 10) throws(ToolError) -> AcquiredSocket {
        let reply = try client.call(path, BlueZ.gattCharacteristicInterface, member, [.stringDict(ordered: [])],
                                    timeout: timeout, what: "\(member) on \(uuid)")
        guard reply.count == 2, let fd = reply[0].fd, let mtu = reply[1].uint16 else {
            throw ToolError(.software, "\(member) returned \(reply.map(\.signature).joined())")
        }
        peer.ownUse.insert("\(path) \(member == "AcquireWrite" ? "WriteAcquired" : "NotifyAcquired")")
        return AcquiredSocket(fd: fd, mtu: Int(mtu))
    }

    /// Subscribes through `StartNotify`; values then arrive as PropertiesChanged(Value), which a
    /// ReadValue also raises (bluez-notes fact 4).
    public func startNotify(onValue: @escaping ([UInt8]) -> Void) throws(ToolError) -> SubscriptionToken {
        let token: SubscriptionToken
        do {
            token = try client.bus.subscribePropertiesChanged(sender: BlueZ.service, path: path,
                                                              interface: BlueZ.gattCharacteristicInterface) { _, _, changed, _ in
                if let value = changed["Value"]?.bytes { onValue(value) }
            }
        } catch {
            throw BlueZErrors.toolError("subscribing to \(uuid)", error)
        }
        // Notifying already true: another client's session (the usual reason to be here), which
        // must go on counting as another process's use after ours.
        let othersNotifying = (try? client.property(path, BlueZ.gattCharacteristicInterface, "Notifying", what: ""))?.bool
        do {
            _ = try client.call(path, BlueZ.gattCharacteristicInterface, "StartNotify", timeout: 10,
                                what: "StartNotify on \(uuid)")
        } catch {
            client.bus.unsubscribe(token)
            throw error
        }
        if othersNotifying == false { peer.ownUse.insert("\(path) Notifying") }
        return token
    }

    public func stopNotify(_ token: SubscriptionToken) {
        client.bus.unsubscribe(token)
        client.bus.call(destination: BlueZ.service, path: path, interface: BlueZ.gattCharacteristicInterface,
                        member: "StopNotify", timeout: 5) { _ in }
    }
}
