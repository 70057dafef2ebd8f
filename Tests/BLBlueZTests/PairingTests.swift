import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// `--pair` (Peer.pairUnlessPaired) against a stand-in owning org.bluez on a private bus: the
/// device's Pair and CancelPairing, the agent manager, and bluetoothd's questions to the agent.
final class PairingTests: XCTestCase {
    private var bluez: BlueZStandIn!
    private var loop: EventLoop { bluez.loop }
    /// What the tool asked bluetoothd, in order: "RegisterAgent PATH CAPABILITY", "Pair",
    /// "CancelPairing", "UnregisterAgent PATH".
    private var calls: [String] = []
    private var paired = false
    /// How the stand-in answers Pair: nil to leave it unanswered.
    private var pairOutcome: DBusError?? = .some(nil)
    /// The pairing completes but its answer does not come (with `pairOutcome` nil).
    private var pairedWithoutAnswer = false
    private var registerFails = false
    /// bluetoothd's questions to the agent during Pair, as (device, answer: nil when agreed).
    private var questions: [String] = []
    private var answers: [String: String] = [:]
    /// A Pair call left unanswered (kept, or it would be answered with an error as it goes).
    private var unanswered: IncomingCall?
    /// Another client on the bus, asking the agent as if it were bluetoothd.
    private var intruder: DBusConnection!

    private static let device = "/org/bluez/hci0/dev_00_AA_01_00_00_01"
    private static let otherDevice = "/org/bluez/hci0/dev_00_AA_01_00_00_02"

    override func setUpWithError() throws {
        try super.setUpWithError()
        let manager = ExportedInterface(BlueZ.agentManagerInterface)
            .method("RegisterAgent") { [unowned self] call in
                self.calls.append("RegisterAgent \(call.arguments.first?.objectPath ?? "") \(call.arguments.last?.string ?? "")")
                if self.registerFails {
                    call.fail(name: "org.bluez.Error.Failed", message: "no")
                } else {
                    _ = call.reply([])
                }
            }
            .method("UnregisterAgent") { [unowned self] call in
                self.calls.append("UnregisterAgent \(call.arguments.first?.objectPath ?? "")")
                _ = call.reply([])
            }
        let device = ExportedInterface(BlueZ.deviceInterface)
            .property("Paired") { [unowned self] in .bool(self.paired) }
            .method("Pair") { [unowned self] call in
                self.calls.append("Pair")
                self.askAgent(of: call.sender ?? "") {
                    guard case .some(let failure) = self.pairOutcome else {
                        if self.pairedWithoutAnswer { self.paired = true }
                        self.unanswered = call
                        return
                    }
                    if let failure {
                        call.fail(failure)
                    } else {
                        self.paired = true
                        _ = call.reply([])
                    }
                }
            }
            .method("CancelPairing") { [unowned self] call in
                self.calls.append("CancelPairing")
                _ = call.reply([])
            }
        bluez = try BlueZStandIn([ExportedObject(path: BlueZ.managerPath, interfaces: [manager]),
                                  ExportedObject(path: Self.device, interfaces: [device])])
        intruder = try DBusConnection(address: bluez.bus.address, loop: bluez.loop)
    }

    override func tearDown() {
        intruder = nil
        unanswered = nil
        bluez?.stop()
        bluez = nil
        super.tearDown()
    }

    /// Asks the tool's agent what bluetoothd might ask it (its device, another device) and what
    /// another client might, recording the answers in `answers`, then calls `then`. (bluetoothd
    /// 5.66 agrees to the Just Works pairing Pair started without asking; the agent answers
    /// what else it may be asked meanwhile, as the default agent when it is the only one.)
    private func askAgent(of client: String, then: @escaping () -> Void) {
        let asks: [(String, DBusConnection, String)] = [("own", bluez.connection, Self.device),
                                                        ("other device", bluez.connection, Self.otherDevice),
                                                        ("not bluetoothd", intruder, Self.device)]
        var left = asks.count
        for (label, connection, device) in asks {
            _ = connection.call(destination: client, path: Peer.pairingAgentPath, interface: BlueZ.agentInterface,
                                member: "RequestAuthorization", args: [.objectPath(device)], timeout: 5) { [unowned self] result in
                switch result {
                case .success: self.answers[label] = "agreed"
                case .failure(let error): self.answers[label] = error.shortName
                }
                left -= 1
                if left == 0 { then() }
            }
        }
    }

    private func pair(timeout: Double = 5) -> Result<Bool, ToolError> {
        let peer = bluez.peer(Self.device)
        return Result { () throws(ToolError) in try peer.pairUnlessPaired(timeout: timeout) }
    }

    private var agentStillExported: Bool {
        let reply = try? intruder.callAndWait(destination: bluez.client.bus.uniqueName, path: Peer.pairingAgentPath,
                                              interface: DBusInterfaceName.introspectable, member: "Introspect", timeout: 2)
        return reply?.first?.string?.contains(BlueZ.agentInterface) == true
    }

    /// An unpaired device: an agent of the tool's own is registered (no input, no output: Just
    /// Works) before Pair and unregistered after; it agrees for that device alone, and only when
    /// bluetoothd asks.
    func testPairsWithAnAgentOfItsOwnThatAgreesForThatDeviceOnly() throws {
        XCTAssertEqual(try pair().get(), true)
        XCTAssertEqual(calls, ["RegisterAgent \(Peer.pairingAgentPath) NoInputNoOutput", "Pair",
                               "UnregisterAgent \(Peer.pairingAgentPath)"])
        XCTAssertEqual(answers, ["own": "agreed", "other device": "Rejected", "not bluetoothd": "Rejected"])
        XCTAssertTrue(paired)
        XCTAssertFalse(agentStillExported)
    }

    func testAPairedDeviceIsLeftAsItIs() throws {
        paired = true
        XCTAssertEqual(try pair().get(), false)
        XCTAssertEqual(calls, [])
    }

    /// Paired by another process between the look and the call: not an error.
    func testPairedMeanwhileIsNotAnError() throws {
        pairOutcome = .some(DBusError(name: "org.bluez.Error.AlreadyExists", message: "Already Exists"))
        XCTAssertEqual(try pair().get(), false)
        XCTAssertEqual(calls.last, "UnregisterAgent \(Peer.pairingAgentPath)")
    }

    func testARefusedPairingSaysSoAndUnregistersTheAgent() throws {
        pairOutcome = .some(DBusError(name: "org.bluez.Error.AuthenticationFailed", message: "Authentication Failed"))
        XCTAssertThrowsError(try pair().get()) { error in
            let failure = error as? ToolError
            XCTAssertEqual(failure?.code, .noPermission)
            XCTAssertEqual(failure?.message, "pairing with 00:AA:01:00:00:01: org.bluez.Error.AuthenticationFailed: Authentication Failed")
        }
        XCTAssertEqual(calls.last, "UnregisterAgent \(Peer.pairingAgentPath)")
        XCTAssertFalse(agentStillExported)
    }

    /// bluetoothd would go on pairing after the tool gave up: it is told to stop.
    func testAPairingNotDoneInTimeIsCancelled() throws {
        pairOutcome = .none
        let started = MonotonicClock.seconds()
        XCTAssertThrowsError(try pair(timeout: 0.6).get()) { error in
            let failure = error as? ToolError
            XCTAssertEqual(failure?.code, .tempFail)
            XCTAssertEqual(failure?.message, "pairing with 00:AA:01:00:00:01: not done within 0.6 s")
        }
        XCTAssertLessThan(MonotonicClock.seconds() - started, 4)
        XCTAssertTrue(loop.run(until: { self.calls.contains("CancelPairing") }, timeout: 2), "\(calls)")
        XCTAssertEqual(calls.first, "RegisterAgent \(Peer.pairingAgentPath) NoInputNoOutput")
        XCTAssertTrue(calls.contains("UnregisterAgent \(Peer.pairingAgentPath)"), "\(calls)")
        XCTAssertFalse(paired)
    }

    /// The pairing completed as the wait for its answer ended: CancelPairing would remove the
    /// new bond (and drop the link), so it is not sent.
    func testAPairingCompletedAsTheWaitEndedIsKept() throws {
        pairOutcome = .none
        pairedWithoutAnswer = true
        XCTAssertEqual(try pair(timeout: 0.6).get(), true)
        XCTAssertFalse(calls.contains("CancelPairing"), "\(calls)")
        XCTAssertTrue(paired)
        XCTAssertEqual(calls.last, "UnregisterAgent \(Peer.pairingAgentPath)")
    }

    /// A signal while pairing: the pairing is cancelled and the agent unregistered, although
    /// the loop was told to stop.
    func testASignalWhilePairingCancelsItAndUnregisters() throws {
        pairOutcome = .none
        _ = loop.schedule(after: 0.3) { [unowned self] in self.loop.stop() }
        XCTAssertThrowsError(try pair(timeout: 10).get()) { error in
            XCTAssertEqual((error as? ToolError)?.code, .interrupted)
        }
        XCTAssertEqual(calls, ["RegisterAgent \(Peer.pairingAgentPath) NoInputNoOutput", "Pair", "CancelPairing",
                               "UnregisterAgent \(Peer.pairingAgentPath)"])
        XCTAssertFalse(agentStillExported)
    }

    /// An agent that cannot be registered is no reason to stop: another (a desktop's) may
    /// still let the pairing through.
    func testPairsEvenIfTheAgentCannotBeRegistered() throws {
        registerFails = true
        XCTAssertEqual(try pair().get(), true)
        XCTAssertEqual(calls.prefix(2), ["RegisterAgent \(Peer.pairingAgentPath) NoInputNoOutput", "Pair"])
        XCTAssertFalse(agentStillExported)
    }
}
