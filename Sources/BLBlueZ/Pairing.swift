import BLCommand
import BLDBus

extension Peer {
    /// The object path of the agent a central tool registers while it pairs.
    public static let pairingAgentPath = "/org/blpipe/central_agent"

    /// Pairs with the device ("Just Works": no PIN, no passkey) unless bluetoothd already has a
    /// bond with it, for peripherals whose characteristics want an encrypted link (such as
    /// `blserve --secure`). Returns false when the device was already paired.
    ///
    /// Since Linux 5.8 the kernel asks bluetoothd to confirm even a Just Works pairing, and
    /// bluetoothd agrees by itself only to one that a program asked for (`Device1.Pair`) and only
    /// when that program, or some other, has an agent registered; on a machine with none (a
    /// headless one) every pairing fails. So a ``PairingAgent`` (NoInputNoOutput, which makes the
    /// pairing Just Works) is registered for the time of the `Pair` call; it agrees to this device
    /// only and answers bluetoothd only. If `Pair` outlasts `timeout`, the pairing is cancelled.
    @discardableResult
    public func pairUnlessPaired(timeout: Double) throws(ToolError) -> Bool {
        let what = "pairing with \(device.address)"
        if try client.property(path, BlueZ.deviceInterface, "Paired", what: what).bool == true {
            Tool.note("already paired with \(device.address)")
            return false
        }
        let bus = client.bus
        let owner = try? bus.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                         interface: "org.freedesktop.DBus", member: "GetNameOwner",
                                         args: [.string(BlueZ.service)], timeout: 5).first?.string
        let devicePath = path
        let agent = PairingAgent(path: Self.pairingAgentPath) { $0 == devicePath }
        agent.acceptCall = { call in owner != nil && call.sender == owner }
        agent.onDecision = { device, accepted in
            Tool.note("\(accepted ? "agreed to" : "refused") bluetoothd's question about \(device)")
        }
        var registered = false
        do {
            try bus.export(agent.tree)
            _ = try bus.callAndWait(destination: BlueZ.service, path: BlueZ.managerPath,
                                    interface: BlueZ.agentManagerInterface, member: "RegisterAgent",
                                    args: [.objectPath(agent.path), .string(PairingAgent.capability)], timeout: 10)
            registered = true
        } catch {
            if error.is(DBusError.Name.interrupted) { throw ToolError.quiet(.interrupted) }
            // Another agent (a desktop's) may still let the pairing through.
            Tool.warn("\(what): could not register a pairing agent (\(error.oneLine)); trying without")
        }
        defer {
            if registered {
                _ = try? bus.callAndWait(destination: BlueZ.service, path: BlueZ.managerPath,
                                         interface: BlueZ.agentManagerInterface, member: "UnregisterAgent",
                                         args: [.objectPath(agent.path)], timeout: 2)
            }
            bus.unexport(agent.tree)
        }
        let started = MonotonicClock.seconds()
        do {
            _ = try bus.callAndWait(destination: BlueZ.service, path: path, interface: BlueZ.deviceInterface,
                                    member: "Pair", timeout: timeout)
        } catch {
            if error.shortName == "AlreadyExists" {  // paired meanwhile (by another process)
                Tool.note("already paired with \(device.address)")
                return false
            }
            let interrupted = error.is(DBusError.Name.interrupted)
            let timedOut = error.is(DBusError.Name.noReply) && MonotonicClock.seconds() - started >= timeout - 0.5
            if interrupted || timedOut {
                // bluetoothd goes on pairing unless told to stop.
                bus.call(destination: BlueZ.service, path: path, interface: BlueZ.deviceInterface,
                         member: "CancelPairing", timeout: 1) { _ in }
                bus.flush(timeout: 1)
                if interrupted { throw ToolError.quiet(.interrupted) }
                throw ToolError(.tempFail, "\(what): not done within \(formatSeconds(timeout)) s")
            }
            throw BlueZErrors.toolError(what, error)
        }
        Tool.note("paired with \(device.address) in \(Int((MonotonicClock.seconds() - started) * 1000)) ms")
        return true
    }
}
