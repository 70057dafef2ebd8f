import BLCommand
import BLDBus

extension Peer {
    /// The object path of the agent a central tool registers while it pairs.
    public static let pairingAgentPath = "/org/blpipe/central_agent"

    /// Pairs with the device ("Just Works": no PIN, no passkey) unless bluetoothd already has a
    /// bond with it, for peripherals whose characteristics want an encrypted link (such as
    /// `blserve --secure`). Returns false when the device was already paired.
    ///
    /// Since Linux 5.8 the kernel asks bluetoothd to confirm even a Just Works pairing.
    /// bluetoothd agrees by itself to one that a program asked for (`Device1.Pair`), but only
    /// when that program has an agent registered, or else there is a default agent; on a
    /// machine with none (a headless one) every pairing fails. So a ``PairingAgent``
    /// (NoInputNoOutput, which makes the pairing Just Works) is registered for the time of the
    /// call. bluetoothd does not ask it about this pairing; should it ask about anything else
    /// meanwhile (while no other agent is registered it is the default one), only this device
    /// is agreed to, and only bluetoothd is answered. If `Pair` outlasts `timeout`, or a signal
    /// comes, the pairing is cancelled unless it has just completed.
    @discardableResult
    public func pairUnlessPaired(timeout: Double) throws(ToolError) -> Bool {
        let what = "pairing with \(device.address)"
        if try isPaired(what) {
            Tool.note("already paired with \(device.address)")
            return false
        }
        let bus = client.bus
        let loop = client.loop
        let owner = bus.nameOwner(BlueZ.service)
        let devicePath = path
        let agent = PairingAgent(path: Self.pairingAgentPath) { $0 == devicePath }
        agent.acceptCall = { call in owner != nil && call.sender == owner }
        agent.onDecision = { device, accepted in
            Tool.note("\(accepted ? "agreed to" : "refused") bluetoothd's question about \(device)")
        }
        var registering = false
        defer {
            // Also after a signal: the calls below must not give up at once.
            loop.clearStop()
            if registering { agent.unregister(from: bus, timeout: 2) }
            bus.unexport(agent.tree)
        }
        do {
            try bus.export(agent.tree)
            registering = true
            _ = try bus.callAndWait(destination: BlueZ.service, path: BlueZ.managerPath,
                                    interface: BlueZ.agentManagerInterface, member: "RegisterAgent",
                                    args: [.objectPath(agent.path), .string(PairingAgent.capability)], timeout: 10)
        } catch {
            if error.is(DBusError.Name.interrupted) { throw ToolError.quiet(.interrupted) }
            // Another agent (a desktop's) may still let the pairing through.
            Tool.warn("\(what): could not register a pairing agent (\(error.oneLine)); trying without")
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
            guard interrupted || timedOut else { throw BlueZErrors.toolError(what, error) }
            loop.clearStop()
            // bluetoothd goes on pairing unless told to stop. But CancelPairing with no pairing
            // under way removes the bond (and drops the link): not if it has just completed.
            // (A pairing completing between this look and the cancel would still be undone.)
            if (try? isPaired(what)) == true {
                if interrupted { throw ToolError.quiet(.interrupted) }
                Tool.note("paired with \(device.address), after the wait for bluetoothd's answer")
                return true
            }
            _ = try? bus.callAndWait(destination: BlueZ.service, path: path, interface: BlueZ.deviceInterface,
                                     member: "CancelPairing", timeout: 2)
            if interrupted { throw ToolError.quiet(.interrupted) }
            throw ToolError(.tempFail, "\(what): not done within \(formatSeconds(timeout)) s")
        }
        Tool.note("paired with \(device.address) in \(Int((MonotonicClock.seconds() - started) * 1000)) ms")
        return true
    }

    private func isPaired(_ what: String) throws(ToolError) -> Bool {
        try client.property(path, BlueZ.deviceInterface, "Paired", what: what).bool == true
    }
}
