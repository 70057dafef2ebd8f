#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLBlueZ
import BLCommand
import BLDBus
import BLFrame

/// What each mode does with the calls bluetoothd makes.
protocol ServeMode: AnyObject {
    func write(_ value: [UInt8], _ options: GattRequestOptions, _ call: IncomingCall)
    func read(_ options: GattRequestOptions, _ call: IncomingCall)
    func connectionChanged(device: String, connected: Bool)
    func notifyingChanged(_ on: Bool)
    /// bluetoothd went away: every central is gone.
    func centralsLost()
    /// Stop every COMMAND (SIGINT/SIGTERM).
    func shutdown()
}

/// blserve: the peripheral, the event loop, and the mode that answers the centrals.
final class Server {
    let config: ServeConfig
    let loop: EventLoop
    let bus: DBusConnection
    let children: ChildProcesses
    /// COMMAND, found in PATH once.
    let handler: HandlerCommand
    let buffer = SharedReadBuffer()
    let application: GattApplication
    let peripheral: Peripheral
    let notifier: Notifier
    let adapterName: String
    private(set) var mode: ServeMode!
    /// The ATT MTU last seen in a call from each central (device path).
    private(set) var mtus: [String: Int] = [:]
    private(set) var stopping = false
    /// The central the last StartNotify came for: the only one connected then. nil when that
    /// was not known (several connected), when notifications went off, or when it disconnected
    /// without being bonded (a bonded central's subscription outlives its link, and bluetoothd
    /// does not ask again when it comes back).
    private(set) var startNotifySubscriber: String?
    private var lastState: Peripheral.State = .stopped
    /// What blserve exits with: set by the first reason to stop, or by stream mode as its
    /// COMMAND fails (before the stream's last notifications are sent: a signal meanwhile
    /// does not make that a success).
    var exitError: ToolError?

    var writeCharacteristic: GattCharacteristic { application.characteristics[0] }
    var notifyCharacteristic: GattCharacteristic { application.characteristics[application.characteristics.count - 1] }

    /// `handler` is COMMAND already looked up (nil: look it up now).
    init(config: ServeConfig, loop: EventLoop, bus: DBusConnection, adapterName: String,
         handler: HandlerCommand? = nil) throws(ToolError) {
        self.config = config
        self.loop = loop
        self.bus = bus
        self.adapterName = adapterName
        self.handler = handler ?? HandlerCommand(config.command)
        do {
            children = try ChildProcesses(loop: loop)
        } catch {
            throw ToolError(.osError, "cannot handle SIGCHLD: \(error)")
        }
        var characteristics = config.characteristics
        if config.mode == .stream {
            // Seed 001/002: read and notify; nothing to write to.
            characteristics = characteristics.map { c in (c.uuid, c.flags.filter { !$0.contains("write") }) }
            if config.nus { characteristics = [characteristics[1]] }
        }
        // Raw and stream modes notify in bulk: through a socket bluetoothd reads, not a D-Bus
        // signal per notification. Frame mode keeps signals (its replies are short).
        application = GattApplication(root: "/org/blpipe/blserve", serviceUUID: config.serviceUUID,
                                      characteristics: characteristics, notifySockets: config.mode != .frame)
        let name = config.name ?? LEAdvertisement.defaultLocalName()
        let advertisement = LEAdvertisement(path: "/org/blpipe/blserve_advertisement", serviceUUIDs: [config.serviceUUID],
                                            localName: name)
        // --secure: centrals must pair, and a headless machine has nobody to say yes (PairingAgent).
        let agent = config.secure ? PairingAgent(path: "/org/blpipe/blserve_agent") { _ in false } : nil
        peripheral = Peripheral(bus: bus, adapterName: adapterName, application: application, advertisement: advertisement,
                                agent: agent)
        notifier = Notifier(characteristic: application.characteristics[application.characteristics.count - 1], bus: bus)
        notifier.canPush = { [unowned self] device in self.canPush(to: device) }
        notifier.pieceSize = { [unowned self] device in self.notificationSize(for: device) }
        notifier.soleCentral = { [unowned self] in
            self.peripheral.connectedDevices.count == 1 ? self.peripheral.connectedDevices.first : nil
        }
        notifier.log = { [unowned self] message in self.debug(message) }
        switch config.mode {
        case .frame: mode = FrameMode(server: self)
        case .raw: mode = RawMode(server: self)
        case .stream: mode = StreamMode(server: self)
        }
        wireCallbacks()
    }

    private func wireCallbacks() {
        if let agent = peripheral.agent {
            agent.accept = { [unowned self] device in self.mayPair(device) }
            agent.onDecision = { [unowned self] device, accepted in
                // Another adapter's device is named by its path (it may be this adapter's own address).
                let who = self.ownDeviceAddress(device) ?? device
                if accepted {
                    self.debug("\(who): pairing accepted")
                } else if self.config.verbose {
                    Tool.warn("\(who): pairing refused")
                }
            }
        }
        for c in application.characteristics {
            if c.flags.contains(where: { $0.contains("write") }) {
                c.onWrite = { [unowned self] value, options, call in
                    guard self.admit(options, call) else { return }
                    self.mode.write(value, options, call)
                }
            }
            c.onRead = { [unowned self] options, call in
                guard self.admit(options, call) else { return }
                self.mode.read(options, call)
            }
        }
        for c in application.characteristics where c.offersNotifySocket {
            c.isCentralConnected = { [unowned self] device in self.peripheral.connectedDevices.contains(device) }
            c.log = { [unowned self] message in self.debug(message) }
            c.onNotifySocketAcquired = { [unowned self] options in
                // A subscriber that has not read or written yet: its MTU comes with the socket.
                if let device = options.device, self.ownDeviceAddress(device) != nil { self.mtus[device] = options.mtu }
            }
        }
        notifyCharacteristic.onStartNotify = { [unowned self] in
            // bluetoothd says which central subscribes only with a socket (AcquireNotify);
            // StartNotify comes for a central enabling notifications, whoever it is.
            let connected = self.peripheral.connectedDevices
            self.startNotifySubscriber = connected.count == 1 ? connected.first : nil
        }
        notifyCharacteristic.onNotifyingChanged = { [unowned self] on in
            self.debug("notifications \(on ? "on" : "off")")
            if !on { self.startNotifySubscriber = nil }
            self.mode.notifyingChanged(on)
        }
        peripheral.onConnectionChange = { [unowned self] device, connected in
            self.debug("\(Self.centralName(device)) \(connected ? "connected" : "disconnected")")
            if !connected {
                self.mtus[device] = nil
                if self.startNotifySubscriber == device, !self.peripheral.bondedDevices.contains(device) {
                    self.startNotifySubscriber = nil
                }
                for c in self.application.characteristics where c.offersNotifySocket { c.centralDisconnected(device) }
            }
            self.mode.connectionChanged(device: device, connected: connected)
        }
        peripheral.onStateChange = { [unowned self] state in
            defer { self.lastState = state }
            switch state {
            case .registered:
                if self.peripheral.registrationCount > 1 {
                    Tool.warn("registered again on \(self.adapterName)")
                } else {
                    self.debug("registered on \(self.adapterName): service \(self.config.serviceUUID), name '\(self.peripheral.advertisement?.localName ?? "")'")
                }
            case .waiting(let why):
                if self.lastState == .registered {
                    // bluetoothd or the adapter went away: every central and subscription with it.
                    Tool.warn("\(why); registering again when it is back")
                    self.notifier.reset()
                    self.mode.centralsLost()
                } else {
                    self.debug(why)
                }
            case .registering, .stopped:
                break
            }
        }
        bus.onDisconnect = { [unowned self] in
            self.shutdown(ToolError(.unavailable, "lost the connection to the system bus"))
        }
    }

    /// A central may pair (Just Works, --secure) when it is a device of this adapter that --allow
    /// lets in. bluetoothd asks its default agent about every adapter's pairings; for the others
    /// the answer is no, as it is with no agent at all. So it is, without --allow, for a device
    /// known over BR/EDR (a Class of Device): a classic pairing (a headset, a keyboard, a phone's
    /// audio), not a central of ours. A device --allow names is agreed to either way (a
    /// dual-mode central, such as another Linux machine, may have shown a Class).
    private func mayPair(_ device: String) -> Bool {
        guard let address = ownDeviceAddress(device) else { return false }
        if !config.allow.isEmpty { return config.allow.contains(address) }
        return !peripheral.classicDevices.contains(device)
    }

    /// The address of `device` (an object path) when it is a device of this adapter, else nil.
    private func ownDeviceAddress(_ device: String) -> String? {
        device.hasPrefix(peripheral.adapterPath + "/") ? BluetoothAddress.fromDevicePath(device) : nil
    }

    /// Applies --allow and records the central's MTU. A refused call is answered here.
    private func admit(_ options: GattRequestOptions, _ call: IncomingCall) -> Bool {
        guard let device = options.device, let address = address(ofDevice: device) else {
            call.fail(GattError.notPermitted("No device"))
            return false
        }
        if !isAllowed(device) {
            if config.verbose { Tool.warn("\(address): refused: not in --allow") }
            call.fail(WriteRefusal.notAllowed.dbusError)
            return false
        }
        if stopping {
            call.fail(GattError.notPermitted("Shutting down"))
            return false
        }
        mtus[device] = options.mtu
        return true
    }

    /// Whether --allow lets `device` (an object path) read and write.
    func isAllowed(_ device: String) -> Bool {
        config.allow.isEmpty || address(ofDevice: device).map(config.allow.contains) == true
    }

    /// The last device path admit() saw, and its address (every GATT call names its central,
    /// mostly the same one).
    private var lastDevice: (path: String, address: String)?

    /// The address of `path` when it is a device of this adapter (bluetoothd names the
    /// central of each call; a device of another adapter is none of ours), else nil.
    private func address(ofDevice path: String) -> String? {
        if let last = lastDevice, last.path == path { return last.address }
        guard let address = ownDeviceAddress(path) else { return nil }
        lastDevice = (path, address)
        return address
    }

    /// True when a notification now reaches `device` and no other central: notifications are
    /// on and `device` is the only device connected to the adapter (BlueZ 5.66 sends every
    /// notification to every subscriber, bluez-notes §3.8). Devices connected over BR/EDR
    /// count too, unlike for ``Peripheral/connectedCentrals``: bluetoothd serves GATT over
    /// BR/EDR as well, so one of them could be subscribed.
    ///
    /// In frame mode `device` must also be known to have subscribed: a bonded central that
    /// subscribed and left keeps its subscription in bluetoothd (no StopNotify), so
    /// notifications stay "on" with nobody connected to take them; and frame mode's replies
    /// have a way that always works, the pull. (Raw mode's output has none that a terminal
    /// app follows, so there the sole connected central is taken to be the subscriber.)
    func canPush(to device: String) -> Bool {
        guard notifyCharacteristic.notifying, peripheral.connectedDevices == [device] else { return false }
        if config.mode == .frame { return startNotifySubscriber == device }
        return true
    }

    /// Bytes per notification towards `device`; nil: towards every subscriber. bluetoothd names
    /// only the first subscriber (BlueZ 5.66 asks for one notification socket), so the value
    /// must fit every connected central (any device connected over LE): the smallest of their
    /// MTUs, and the MTU-less size (20) while any of them has not shown its MTU yet. A longer
    /// one would reach that central cut short, and nothing would say so.
    func notificationSize(for device: String?) -> Int {
        if let device { return config.notificationSize(mtu: mtus[device]) }
        var smallest: Int?
        for central in peripheral.connectedCentrals {
            guard let mtu = mtus[central] else { return config.notificationSize(mtu: nil) }
            smallest = min(smallest ?? mtu, mtu)
        }
        return config.notificationSize(mtu: smallest)
    }

    /// The variables blserve sets for its commands (``environment(device:)``, frame mode's
    /// BL_CODE and BL_SIZE).
    static let environmentNames = ["BL_CODE", "BL_SIZE", "BL_DEVICE", "BL_ADAPTER", "BL_MTU"]

    /// The environment every COMMAND gets (plus the mode's own variables).
    func environment(device: String?) -> [(String, String)] {
        var env: [(String, String)] = [("BL_ADAPTER", adapterName)]
        if let device {
            env.append(("BL_DEVICE", BluetoothAddress.fromDevicePath(device) ?? device))
            env.append(("BL_MTU", String(mtus[device] ?? 23)))
        }
        return env
    }

    func debug(_ message: String) {
        if config.verbose { Tool.warn(message) }
    }

    static func centralName(_ device: String) -> String {
        BluetoothAddress.fromDevicePath(device) ?? device
    }

    // MARK: - Running

    /// Registers and serves until SIGINT, SIGTERM or SIGHUP (or, in stream mode, the end of COMMAND),
    /// watched through `interrupts`. One that blserve started with ignored (`nohup`, a background
    /// job) stays ignored.
    func run(interrupts: InterruptWatch) throws(ToolError) {
        // SIGHUP too: a closed terminal must not leave the commands (in process groups of
        // their own, so the hangup does not reach them) running unsupervised.
        interrupts.onSecondInterrupt = { [unowned self] signal in
            // A second signal while the first one's shutdown waits (for commands that ignore
            // SIGTERM, for bluetoothd): end now (130). bluetoothd drops the application and the
            // advertisement with blserve's bus connection.
            Tool.warn("\(ProcessStatus.signalName(signal) ?? "signal \(signal)") while stopping: ending at once")
            self.children.killAll()
        }
        interrupts.onInterrupt = { [unowned self, unowned interrupts] in
            let signal = interrupts.received ?? 0
            self.debug("\(ProcessStatus.signalName(signal) ?? "signal \(signal)"): stopping")
            // Not from the signal's handler: the shutdown runs the loop while it waits, and a
            // signal that comes meanwhile must reach that handler again.
            self.loop.callSoon { [unowned self] in self.shutdown() }
        }
        var firstError: DBusError?
        peripheral.onAgentError = { error in Tool.warn(error.oneLine) }
        peripheral.onRegistrationError = { [unowned self] error in
            if self.peripheral.registrationCount == 0 {
                firstError = error
            } else {
                Tool.warn(error.oneLine)
            }
        }
        do {
            try peripheral.start()
        } catch {
            throw BlueZErrors.toolError("exporting the GATT application", error)
        }
        let ready = loop.run(until: { [unowned self] in
            self.peripheral.state == .registered || firstError != nil || self.stopping
        }, timeout: 30)
        if stopping {
            if let exitError { throw exitError }
            return
        }
        if let firstError {
            peripheral.stop(timeout: 1)
            throw ToolError(BlueZErrors.exitCode(for: firstError) == .unavailable ? .unavailable : .ioError, firstError.oneLine)
        }
        if !ready {
            let why = peripheral.state
            peripheral.stop(timeout: 1)
            throw ToolError(.unavailable, "not registered within 30 s (\(why))")
        }
        loop.run()
        if let exitError { throw exitError }
    }

    /// Ends every COMMAND, unregisters, and makes ``run()`` return. `error` becomes the exit
    /// status; the first call decides it (what fails because of the stop, a COMMAND ended by
    /// its SIGTERM, is not a reason to exit otherwise).
    func shutdown(_ error: ToolError? = nil) {
        if stopping { return }
        if exitError == nil { exitError = error }
        stopping = true
        mode.shutdown()
        children.terminateAll(signal: SIGTERM, grace: 2)
        peripheral.stop(timeout: 2)
        bus.flush()
        loop.stop()
    }
}

extension Server {
    /// bluetoothd's objects while blserve waits at start for an adapter; nil while bluetoothd is
    /// not there (restarting: looked for again later). It is not started through the bus (a
    /// bluetoothd stopped on purpose stays stopped); any other failure ends the wait.
    static func lookWhileWaiting(_ client: BlueZClient) throws(ToolError) -> BlueZObjects? {
        do {
            let message = try DBusMessage.methodCall(destination: BlueZ.service, path: "/",
                                                     interface: DBusInterfaceName.objectManager, member: "GetManagedObjects")
            message.autoStart = false
            let reply = try client.bus.callAndWait(message, timeout: 10)
            return BlueZObjects(reply.arguments.first?.managedObjects ?? [:])
        } catch {
            if [DBusError.Name.serviceUnknown, DBusError.Name.nameHasNoOwner, DBusError.Name.noReply].contains(error.name) {
                return nil
            }
            throw BlueZErrors.toolError("listing bluetoothd's objects", error)
        }
    }

    /// blserve's whole life: check the command, connect, pick the adapter, serve.
    static func main(_ config: ServeConfig) throws(ToolError) {
        Signals.ignoreSIGPIPE()
        // What the commands find in these comes from blserve only (a value inherited from its
        // own environment would pass for a request's, e.g. BL_CODE with --prestart).
        for name in Server.environmentNames { unsetenv(name) }
        let handler = HandlerCommand(config.command)
        guard handler.resolvedPath != nil else {
            throw ToolError(.unavailable, "\(handler.name): \(Subprocess.whyNotFound(handler.name))")
        }
        let loop = EventLoop()
        Tool.queueDiagnostics(on: loop)
        // Signals are watched from the moment the bus's socket is connected: one before the
        // registration ends blserve as cleanly (exit 0) as one after it. (Until then, while
        // libdbus's connect() may block, a signal has its default action: nothing is started.)
        guard let (client, interrupts) = try BlueZClient.connect(loop: loop) else { return }
        if let error = interrupts.setupError { throw ToolError(.osError, "cannot handle signals: \(error)") }
        let server: Server
        do {
            var objects = try client.managedObjects()
            // No adapter at all yet (at boot, a Raspberry Pi's controller is attached after
            // bluetoothd has started): a server waits for one, as it does when one goes away.
            var delay = Peripheral.retryInterval
            while objects.adapters.isEmpty {
                if delay == Peripheral.retryInterval { Tool.warn("no Bluetooth adapter yet: waiting for one") }
                loop.sleep(delay)
                if interrupts.received != nil { return }
                delay = min(delay * 2, Peripheral.longestRetryInterval)
                objects = try lookWhileWaiting(client) ?? BlueZObjects([:])
            }
            let adapter = try client.adapter(named: config.adapter, in: objects)
            server = try Server(config: config, loop: loop, bus: client.bus, adapterName: adapter.name, handler: handler)
        } catch where interrupts.received != nil {
            return  // the signal stopped a wait: not a failure
        } catch where error.message.contains("org.freedesktop.DBus.Error.Spawn") {
            // The bus tried to start org.bluez on demand and could not: bluetoothd is not running.
            throw ToolError(.unavailable, "bluetoothd is not running (\(error.message))")
        }
        // A signal seen by a wait that still succeeded stopped the loop all the same.
        if interrupts.received != nil { return }
        try server.run(interrupts: interrupts)
    }
}
