import BLCommand

/// `--adapter HCI`, the same in every tool.
public enum AdapterOption {
    public static let spec = OptionSpec("adapter", short: "a", value: "HCI", help: "use this adapter (hci0…); default: the first powered one")

    /// The adapter given, or nil for the first powered one.
    public static func value(_ options: ParsedOptions) throws(UsageError) -> String? {
        guard let name = options.string("adapter") else { return nil }
        if name.isEmpty { throw UsageError("--adapter wants a name like hci0") }
        return name
    }
}

/// The device options blsend and blrecv share, and what they resolve to.
public struct CentralTarget {
    public var selector: DeviceSelector
    public var adapterName: String?
    public var service: String
    /// The characteristic written to.
    public var writeCharacteristic: String
    /// The characteristic notifications and reads come from.
    public var notifyCharacteristic: String
    public var scanTimeout: Double
    public var connectTimeout: Double
    /// Pair with the device after connecting, unless already paired (`--pair`).
    public var pair: Bool

    /// Seconds a pairing may take: the other side may ask a person (a phone shows a dialog).
    public static let pairingTimeout: Double = 30

    /// The options, for a tool's CommandSpec: `nus` says what `--nus` means to it.
    public static func options(nus: String) -> [OptionSpec] { [
        AdapterOption.spec,
        OptionSpec("service", value: "UUID", help: "service UUID (16- or 128-bit); default: the RaspBLE service"),
        OptionSpec("char", value: "UUID", help: "characteristic UUID; default: the RaspBLE characteristic"),
        OptionSpec("nus", help: nus),
        OptionSpec("scan-timeout", value: "S", help: "seconds to scan for DEV when bluetoothd does not know it (10)"),
        OptionSpec("connect-timeout", value: "S", help: "seconds to connect and resolve services (10)"),
        OptionSpec("pair", help: "pair with DEV (Just Works, no PIN) unless already paired: for devices that want an encrypted link"),
        OptionSpec("verbose", short: "v", help: "say on stderr what is being done (adapter, device, MTU, rate)"),
    ] }

    public init(_ options: ParsedOptions) throws {
        guard !options.operands[0].isEmpty else { throw UsageError("DEV is empty: give an address or a name") }
        selector = DeviceSelector(options.operands[0])
        Tool.verbosity = options.count("verbose")
        adapterName = try AdapterOption.value(options)
        let layout = try GattLayout(options)
        service = layout.service
        writeCharacteristic = layout.write
        notifyCharacteristic = layout.notify
        scanTimeout = try options.seconds("scan-timeout", in: 0...3600) ?? 10
        connectTimeout = try options.seconds("connect-timeout", in: 0.1...3600) ?? 10
        pair = options.has("pair")
    }

    /// Connects (`connect`) and runs `body` with the peer. A link made here is ended when `body`
    /// returns or throws, and also by a second signal, which does not wait for anything more.
    public func withPeer(_ client: BlueZClient, _ interrupted: InterruptWatch, _ body: (Peer) throws -> Void) throws {
        let peer = try connect(client)
        defer {
            client.loop.clearStop()
            peer.disconnect()
        }
        interrupted.onSecondInterrupt = { _ in peer.disconnectBeforeExit() }
        try body(peer)
    }

    /// Finds and connects to the device. The caller disconnects (`Peer.disconnect`) when done.
    public func connect(_ client: BlueZClient) throws(ToolError) -> Peer {
        // One listing serves the adapter, the device and, when the device is already connected
        // with its services resolved, the characteristics: each listing of bluetoothd's objects
        // is a round trip and a parse of the whole tree.
        let listed = try client.managedObjects()
        let adapter = try client.adapter(named: adapterName, in: listed)
        Tool.note("adapter \(adapter.name) (\(adapter.address))")
        let device = try client.findDevice(selector, on: adapter, scanTimeout: scanTimeout, listed: listed)
        Tool.note("device \(device.address) \(device.name.map { "'\($0)' " } ?? "")at \(device.path)")
        let started = MonotonicClock.seconds()
        let peer = try client.connect(device, timeout: connectTimeout) { (left: Double) throws(ToolError) in
            try client.findDevice(selector, on: adapter, scanTimeout: min(scanTimeout, left))
        }
        Tool.note((peer.madeConnection ? "connected" : "already connected")
                  + ", services resolved in \(Int((MonotonicClock.seconds() - started) * 1000)) ms")
        if pair {
            // Before any characteristic is used: a pairing changes nothing in bluetoothd's
            // listing of the device's services. On failure the link made here is ended.
            do {
                try peer.pairUnlessPaired(timeout: Self.pairingTimeout)
            } catch {
                client.loop.clearStop()  // after a signal, so that Disconnect is still sent
                peer.disconnect()
                throw error
            }
        }
        if peer.foundConnected, let before = listed.properties(peer.path, BlueZ.deviceInterface),
           before["Connected"]?.bool == true, before["ServicesResolved"]?.bool == true {
            peer.resolvedListing = listed
        }
        return peer
    }
}
