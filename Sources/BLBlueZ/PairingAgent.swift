import BLCommand
import BLDBus

/// A pairing agent (`org.bluez.Agent1`) for a machine with no keyboard and no display, such as a
/// Raspberry Pi serving centrals: it accepts "Just Works" pairing (no PIN, no passkey) from the
/// devices ``accept`` approves and refuses everything else.
///
/// Why a peripheral needs one: when a central pairs, the kernel (Linux 5.8 and later) asks
/// bluetoothd to confirm even a Just Works pairing, and bluetoothd asks its default agent
/// (`RequestAuthorization`); with no agent registered it refuses, and the central's pairing
/// fails ("No agent available" in bluetoothd's log). Registered with
/// `AgentManager1.RegisterAgent` and capability `NoInputNoOutput`, this agent becomes the
/// default one only when no other program (a desktop's Bluetooth applet) has registered one
/// before; bluetoothd then tells every adapter that this side can neither show nor enter a
/// number (which selects Just Works) and makes them bondable. While another agent is the
/// default, that one keeps answering, and this one takes over when it goes (BlueZ 5.51 and
/// later queue the agents registered).
///
/// Requests that need a person (a PIN, a passkey, comparing numbers) are refused: accepting
/// them unseen would defeat what the other side asked for. So are service authorisations
/// (`AuthorizeService`, for classic profiles), as bluetoothd itself refuses them with no agent.
///
/// Not `Sendable`.
public final class PairingAgent {
    public let path: String
    public let tree: ExportedObjectTree
    /// The capability it registers with.
    public static let capability = "NoInputNoOutput"
    /// Decides a Just Works pairing with the device at this object path.
    public var accept: (_ device: String) -> Bool
    /// Called after each decision (device object path, accepted), e.g. for a log.
    public var onDecision: ((_ device: String, _ accepted: Bool) -> Void)?
    /// Decides whether a call may be answered at all (only bluetoothd's); a refused one gets
    /// `org.bluez.Error.Rejected`. Default: every call is answered.
    public var acceptCall: (IncomingCall) -> Bool = { _ in true }

    public static let rejected = "org.bluez.Error.Rejected"

    public init(path: String = "/org/blpipe/agent", accept: @escaping (_ device: String) -> Bool) {
        self.path = path
        self.accept = accept
        tree = ExportedObjectTree(root: path)
        tree.providesObjectManager = false
        let interface = ExportedInterface(BlueZ.agentInterface)
        // Answered with nothing: bluetoothd has already let go of the agent, or gives up a
        // request it made.
        for member in ["Release", "Cancel"] {
            interface.method(member, inSignature: "", outSignature: "") { call in call.reply([]) }
        }
        interface.method("RequestAuthorization", inSignature: "o", outSignature: "") { [weak self] call in
            guard let self else { return }
            let device = call.arguments.first?.objectPath ?? ""
            let accepted = !device.isEmpty && self.accept(device)
            if accepted {
                call.reply([])
            } else {
                call.fail(name: Self.rejected, message: "Pairing refused")
            }
            self.onDecision?(device, accepted)
        }
        // What a person would have to see or type: refused (see above).
        for (member, inSignature, outSignature) in [("RequestPinCode", "o", "s"), ("RequestPasskey", "o", "u"),
                                                    ("DisplayPinCode", "os", ""), ("RequestConfirmation", "ou", ""),
                                                    ("AuthorizeService", "os", "")] {
            interface.method(member, inSignature: inSignature, outSignature: outSignature) { [weak self] call in
                guard let self else { return }
                call.fail(name: Self.rejected, message: "\(member): this agent has no input and no output")
                if let device = call.arguments.first?.objectPath { self.onDecision?(device, false) }
            }
        }
        // Shown to nobody: there is no display. (Not called for NoInputNoOutput.)
        interface.method("DisplayPasskey", inSignature: "ouq", outSignature: "") { call in call.reply([]) }
        try? tree.add(ExportedObject(path: path, interfaces: [interface]), announce: false)
        tree.admit = { [weak self] call in
            guard let self else {
                call.fail(name: Self.rejected, message: "No agent")
                return false
            }
            return self.admit(call)
        }
    }

    /// `AgentManager1.UnregisterAgent` for this agent, waiting up to `timeout` seconds (the loop
    /// keeps running); a failure (bluetoothd gone, not registered) is ignored.
    public func unregister(from bus: DBusConnection, timeout: Double) {
        _ = try? bus.callAndWait(destination: BlueZ.service, path: BlueZ.managerPath, interface: BlueZ.agentManagerInterface,
                                 member: "UnregisterAgent", args: [.objectPath(path)], timeout: timeout)
    }

    private func admit(_ call: IncomingCall) -> Bool {
        if acceptCall(call) { return true }
        call.fail(name: Self.rejected, message: "Not bluetoothd")
        return false
    }
}
