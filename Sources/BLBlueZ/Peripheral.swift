import BLCommand
import BLDBus

/// A GATT application and an advertisement kept registered with bluetoothd on one adapter.
///
/// ``start()`` exports both object trees and registers them without ever blocking the loop on
/// bluetoothd: `RegisterApplication` and `RegisterAdvertisement` reply only after bluetoothd has
/// called back into this process (bluez-notes fact 7), so they are sent as pending calls and the
/// loop keeps answering those callbacks meanwhile.
///
/// Registrations live only as long as bluetoothd does (fact 8). The peripheral watches
/// `NameOwnerChanged` for `org.bluez` and `InterfacesAdded`/`InterfacesRemoved` of its adapter,
/// and registers again as soon as bluetoothd (or the adapter) is back, retrying meanwhile at
/// growing intervals (``retryInterval`` to ``longestRetryInterval``); an advertisement bluetoothd releases by itself
/// is registered again the same way. It also follows `Device1.Connected` of the
/// adapter's devices, so the server knows which centrals are connected.
///
/// With a ``PairingAgent``, the agent is registered before the application, each time (so
/// centrals can pair from their first connection on; a refusal is tried again by itself), and
/// unregistered with it.
///
/// Only calls from bluetoothd's current unique name reach the application's callbacks (and the
/// agent's); any other caller on the bus gets NotPermitted (Rejected).
///
/// Not `Sendable`.
public final class Peripheral {
    public enum State: Equatable, Sendable, CustomStringConvertible {
        /// Not started, or stopped.
        case stopped
        /// Waiting for bluetoothd or the adapter (the reason), or retrying after a failure.
        case waiting(String)
        /// The registration calls are in flight.
        case registering
        /// The application and the advertisement are registered.
        case registered

        public var description: String {
            switch self {
            case .stopped: return "stopped"
            case .waiting(let why): return "waiting: \(why)"
            case .registering: return "registering"
            case .registered: return "registered"
            }
        }
    }

    public let bus: DBusConnection
    public let adapterName: String
    public let application: GattApplication
    public let advertisement: LEAdvertisement?
    public let agent: PairingAgent?
    public var adapterPath: String { "/org/bluez/" + adapterName }

    public private(set) var state: State = .stopped
    /// Object paths of the adapter's devices whose `Connected` is true.
    public private(set) var connectedDevices: Set<String> = []
    /// Devices bluetoothd says are paired or bonded (their subscriptions outlive a disconnect).
    public private(set) var bondedDevices: Set<String> = []
    /// Devices known over BR/EDR (``DeviceInfo/knownOverBREDR``: a keyboard, a headset),
    /// which are no LE centrals of ours even when connected.
    public private(set) var classicDevices: Set<String> = []

    /// The connected devices that may be LE centrals (all connected but the BR/EDR ones).
    public var connectedCentrals: Set<String> { connectedDevices.subtracting(classicDevices) }
    /// bluetoothd's unique bus name while it runs.
    public private(set) var bluezOwner: String?
    /// How many times the registration has succeeded (1 after start, +1 per re-registration).
    public private(set) var registrationCount = 0
    /// How many times bluetoothd released the advertisement by itself, and how many times it
    /// was registered again after that (the rest of the registration staying).
    public private(set) var advertisementsReleased = 0
    public private(set) var advertisementsRenewed = 0

    public var onStateChange: ((State) -> Void)?
    /// A registration call failed (the peripheral retries by itself).
    public var onRegistrationError: ((DBusError) -> Void)?
    /// The agent's registration failed: the service goes on, but centrals cannot pair.
    public var onAgentError: ((DBusError) -> Void)?
    /// A device of the adapter connected (true) or disconnected (false).
    public var onConnectionChange: ((_ device: String, _ connected: Bool) -> Void)?

    /// Seconds before the first registration attempt after a wait began; each attempt that
    /// finds bluetoothd or the adapter still missing doubles it, up to ``longestRetryInterval``
    /// (their return is signalled and starts an attempt at once: the retries are a backstop).
    public static let retryInterval = 0.25
    public static let longestRetryInterval = 4.0
    /// Seconds before a refused `RegisterAgent` is sent again, doubling up to
    /// ``longestAgentRetryInterval`` (the service runs meanwhile; only pairing waits).
    public static let agentRetryInterval = 1.0
    public static let longestAgentRetryInterval = 60.0
    /// Seconds before a refused registration is tried again, doubling while bluetoothd keeps
    /// refusing, up to ``longestFailureRetryInterval`` (each refusal is reported).
    public static let failureRetryInterval = 1.0
    public static let longestFailureRetryInterval = 30.0
    /// Seconds to wait for bluetoothd's answer to a Register call (it reads our objects first).
    public var registrationTimeout = 15.0

    private var running = false
    private var generation = 0
    private var attemptInFlight = false
    private var retryTimer: TimerToken?
    private var nextRetry = Peripheral.retryInterval
    private var poweringRequested = false
    /// The agent is registered with the bluetoothd that runs now (it is not tied to the adapter).
    private var agentRegistered = false
    private var agentRetryDelay = Peripheral.agentRetryInterval
    private var agentRetryTimer: TimerToken?
    private var failureRetryDelay = Peripheral.failureRetryInterval
    /// What bluetoothd holds of the application and of the advertisement: nothing, the
    /// registration it accepted, or not known (from the moment a Register call is sent until it
    /// succeeds: one that got no answer may still be under way in bluetoothd, and AlreadyExists
    /// may name such a call, as BlueZ 5.66 queues an application before it has read its objects
    /// and drops it if that fails). What is not known is unregistered before it is registered
    /// again, and when blserve stops.
    private enum Held { case nothing, registered, unknown }
    private var applicationHeld = Held.nothing
    private var advertisementHeld = Held.nothing
    private var subscriptions: [SubscriptionToken] = []
    private var loop: EventLoop { bus.loop }

    public init(bus: DBusConnection, adapterName: String, application: GattApplication, advertisement: LEAdvertisement?,
                agent: PairingAgent? = nil) {
        self.bus = bus
        self.adapterName = adapterName
        self.application = application
        self.advertisement = advertisement
        self.agent = agent
        let fromBluetoothd = { [weak self] (call: IncomingCall) -> Bool in
            guard let self, let owner = self.bluezOwner else { return false }
            return call.sender == owner
        }
        application.acceptCall = fromBluetoothd
        agent?.acceptCall = fromBluetoothd
        advertisement?.acceptCall = fromBluetoothd
        // bluetoothd dropped the advertisement by itself (its adapter's advertising manager went,
        // or the kernel removed the instance): register again, or centrals no longer find us.
        advertisement?.onRelease = { [weak self] in self?.advertisementReleased() }
    }

    // MARK: - Starting and stopping

    /// Exports the objects, subscribes to bluetoothd's signals and starts registering (without
    /// waiting for it: follow ``onStateChange``).
    ///
    /// - Throws: a D-Bus error if the objects cannot be exported or the match rules added.
    public func start() throws(DBusError) {
        precondition(!running, "Peripheral started twice")
        try bus.export(application.tree)
        if let advertisement { try bus.export(advertisement.tree) }
        if let agent { try bus.export(agent.tree) }
        running = true
        subscriptions.append(try bus.subscribeNameOwnerChanged(BlueZ.service) { [weak self] _, old, new in
            self?.bluezOwnerChanged(old: old, new: new)
        })
        subscriptions.append(try bus.subscribeInterfacesAdded(sender: BlueZ.service) { [weak self] path, interfaces in
            self?.interfacesAdded(path, interfaces)
        })
        subscriptions.append(try bus.subscribeInterfacesRemoved(sender: BlueZ.service) { [weak self] path, interfaces in
            self?.interfacesRemoved(path, interfaces)
        })
        subscriptions.append(try bus.subscribePropertiesChanged(sender: BlueZ.service, pathNamespace: adapterPath) {
            [weak self] path, interface, changed, _ in
            self?.propertiesChanged(path, interface, changed)
        })
        if let owner = bus.nameOwner(BlueZ.service) { bluezOwner = owner }
        setState(.waiting("looking for \(adapterName)"))
        attempt()
    }

    /// Unregisters (waiting up to `timeout` seconds for each call; the loop keeps running) and
    /// stops serving the objects. Safe to call more than once.
    ///
    /// The corresponding BlueZ methods are `UnregisterAdvertisement`, `UnregisterApplication`
    /// and `UnregisterAgent`.
    public func stop(timeout: Double = 2) {
        guard running else { return }
        running = false
        generation += 1
        if let retryTimer { loop.cancel(retryTimer) }
        retryTimer = nil
        cancelAgentRetry()
        for token in subscriptions { bus.unsubscribe(token) }
        subscriptions.removeAll()
        // Whatever bluetoothd may hold: also after a registration that stopped half way (the
        // application registered, the advertisement refused), and a Register call still under
        // way. Sent to bluetoothd's unique name, which never starts one through the bus.
        if let owner = bluezOwner, bus.isConnected {
            if let advertisement, advertisementHeld != .nothing {
                _ = try? bus.callAndWait(destination: owner, path: adapterPath,
                                         interface: BlueZ.advertisingManagerInterface, member: "UnregisterAdvertisement",
                                         args: [.objectPath(advertisement.path)], timeout: timeout)
            }
            if applicationHeld != .nothing {
                _ = try? bus.callAndWait(destination: owner, path: adapterPath,
                                         interface: BlueZ.gattManagerInterface, member: "UnregisterApplication",
                                         args: [.objectPath(application.root)], timeout: timeout)
            }
        }
        applicationHeld = .nothing
        advertisementHeld = .nothing
        // Also while the adapter is away: the agent belongs to bluetoothd, not to the adapter.
        if let agent, agentRegistered, bluezOwner != nil, bus.isConnected {
            agent.unregister(from: bus, timeout: timeout)
        }
        agentRegistered = false
        bus.unexport(application.tree)
        if let advertisement { bus.unexport(advertisement.tree) }
        if let agent { bus.unexport(agent.tree) }
        setState(.stopped)
    }

    // MARK: - Registration

    private func setState(_ new: State) {
        if state == new { return }
        state = new
        onStateChange?(new)
    }

    /// Attempts again after `seconds`, or after the waiting interval, which grows each time.
    private func scheduleRetry(after explicit: Double? = nil) {
        guard running else { return }
        if explicit != nil, let retryTimer {
            // A refused registration is tried again after its own delay, not sooner (the
            // backstop of a wait) nor later (a wait grown meanwhile).
            loop.cancel(retryTimer)
            self.retryTimer = nil
        }
        guard retryTimer == nil else { return }
        let seconds = explicit ?? nextRetry
        if explicit == nil { nextRetry = min(nextRetry * 2, Self.longestRetryInterval) }
        retryTimer = loop.schedule(after: seconds) { [weak self] in
            guard let self else { return }
            self.retryTimer = nil
            self.attempt()
        }
    }

    /// Starts one registration attempt unless one is running or all is registered. It does not
    /// start bluetoothd through the bus (D-Bus activation): a bluetoothd stopped on purpose stays
    /// stopped, and its return is waited for.
    private func attempt() {
        guard running, !attemptInFlight, state != .registered else { return }
        attemptInFlight = true
        let gen = generation
        bus.call(destination: BlueZ.service, path: "/", interface: DBusInterfaceName.objectManager,
                 member: "GetManagedObjects", timeout: 5, autoStart: false) { [weak self] result in
            guard let self, gen == self.generation, self.running else { return }
            switch result {
            case .failure(let error):
                self.attemptInFlight = false
                if error.name == DBusError.Name.serviceUnknown || error.name == DBusError.Name.nameHasNoOwner {
                    self.setState(.waiting("bluetoothd is not running"))
                } else {
                    self.setState(.waiting("listing bluetoothd's objects: \(error.oneLine)"))
                }
                self.scheduleRetry()
            case .success(let args):
                let objects = BlueZObjects(args.first?.managedObjects ?? [:])
                self.takeSnapshot(objects)
                guard let adapter = objects.properties(self.adapterPath, BlueZ.adapterInterface) else {
                    self.attemptInFlight = false
                    self.setState(.waiting("no adapter \(self.adapterName)"))
                    self.scheduleRetry()
                    return
                }
                guard adapter["Powered"]?.bool == true else {
                    self.attemptInFlight = false
                    self.setState(.waiting("\(self.adapterName) is powered off"))
                    self.requestPower()
                    self.scheduleRetry()
                    return
                }
                self.register(gen)
            }
        }
    }

    private func requestPower() {
        if poweringRequested { return }
        poweringRequested = true
        bus.call(destination: BlueZ.service, path: adapterPath, interface: DBusInterfaceName.properties, member: "Set",
                 args: [.string(BlueZ.adapterInterface), .string("Powered"), .variant(.bool(true))], timeout: 5,
                 autoStart: false) { _ in }
    }

    private static func alreadyExists(_ error: DBusError) -> Bool {
        error.name == "org.bluez.Error.AlreadyExists"
    }

    private func register(_ gen: Int) {
        setState(.registering)
        guard agent != nil, !agentRegistered else { return registerApplication(gen) }
        // The agent first: a central may pair as soon as it finds the advertisement. Without it
        // the service still works for centrals that do not pair, so a failure is reported, the
        // registration goes on, and the agent alone is tried again later.
        cancelAgentRetry()
        agentRetryDelay = Self.agentRetryInterval
        registerAgent(gen) { [weak self] in self?.registerApplication(gen) }
    }

    private func cancelAgentRetry() {
        if let agentRetryTimer { loop.cancel(agentRetryTimer) }
        agentRetryTimer = nil
    }

    /// RegisterAgent, then `then` (whatever the answer, unless `gen` has passed). A failure is
    /// reported and sent again after ``agentRetryInterval`` seconds, then twice as long each
    /// time up to ``longestAgentRetryInterval``, until it succeeds or `gen` passes (a new
    /// registration, which registers the agent first, or stop()).
    private func registerAgent(_ gen: Int, then: @escaping () -> Void) {
        guard let agent else { return then() }
        bus.call(destination: BlueZ.service, path: BlueZ.managerPath, interface: BlueZ.agentManagerInterface,
                 member: "RegisterAgent", args: [.objectPath(agent.path), .string(PairingAgent.capability)],
                 timeout: 15, autoStart: false) { [weak self] result in
            guard let self, gen == self.generation, self.running else { return }
            if case .failure(let error) = result, !Self.alreadyExists(error) {
                self.agentRegistered = false
                let delay = self.agentRetryDelay
                self.agentRetryDelay = min(delay * 2, Self.longestAgentRetryInterval)
                self.onAgentError?(DBusError(name: error.name, message: "RegisterAgent: \(error.message)"
                                             + " (centrals cannot pair; trying again in \(formatSeconds(delay)) s)"))
                // One retry waits at a time, whatever number of attempts failed meanwhile.
                self.cancelAgentRetry()
                self.agentRetryTimer = self.loop.schedule(after: delay) { [weak self] in
                    guard let self else { return }
                    self.agentRetryTimer = nil
                    guard gen == self.generation, self.running, !self.agentRegistered else { return }
                    self.registerAgent(gen) {}
                }
            } else {
                self.agentRegistered = true
                self.agentRetryDelay = Self.agentRetryInterval
            }
            then()
        }
    }

    private func registerApplication(_ gen: Int) {
        guard applicationHeld != .registered else { return registerAdvertisementStep(gen) }
        unregisterIfUnknown(application: true, gen) { [weak self] in
            guard let self else { return }
            self.applicationHeld = .unknown
            self.bus.call(destination: BlueZ.service, path: self.adapterPath, interface: BlueZ.gattManagerInterface,
                          member: "RegisterApplication", args: [.objectPath(self.application.root), .stringDict([:])],
                          timeout: self.registrationTimeout, autoStart: false) { [weak self] result in
                guard let self, gen == self.generation, self.running else { return }
                if case .failure(let error) = result {
                    // applicationHeld stays unknown. BlueZ 5.74 and 5.75 refuse so every
                    // application that gives no handles (bluez/bluez#821, fixed in 5.76); other
                    // versions a UUID bluetoothd reserves.
                    let hint = error.message.contains("Failed to create entry in database")
                        ? " (a UUID bluetoothd itself serves, such as 1800 or 1801? BlueZ 5.74 and 5.75 refuse every application so: use 5.76 or later)" : ""
                    self.registrationFailed(DBusError(name: error.name, message: "RegisterApplication on \(self.adapterName): \(error.message)\(hint)"))
                    return
                }
                self.applicationHeld = .registered
                self.registerAdvertisementStep(gen)
            }
        }
    }

    private func registerAdvertisementStep(_ gen: Int) {
        guard let advertisement, advertisementHeld != .registered else { return registered() }
        registerAdvertisement(advertisement, gen) { [weak self] error in
            guard let self else { return }
            if let error {
                self.registrationFailed(error)
                return
            }
            self.registered()
        }
    }

    /// Unregisters the application (or the advertisement) first if bluetoothd may hold it or
    /// be registering it (``Held/unknown``), then `then` (unless `gen` has passed meanwhile).
    private func unregisterIfUnknown(application: Bool, _ gen: Int, then: @escaping () -> Void) {
        let held = application ? applicationHeld : advertisementHeld
        guard held == .unknown else { return then() }
        let (interface, member, path) = application
            ? (BlueZ.gattManagerInterface, "UnregisterApplication", self.application.root)
            : (BlueZ.advertisingManagerInterface, "UnregisterAdvertisement", advertisement?.path ?? "/")
        bus.call(destination: BlueZ.service, path: adapterPath, interface: interface, member: member,
                 args: [.objectPath(path)], timeout: 5, autoStart: false) { [weak self] _ in
            guard let self, gen == self.generation, self.running else { return }
            if application { self.applicationHeld = .nothing } else { self.advertisementHeld = .nothing }
            then()
        }
    }

    /// RegisterAdvertisement (after unregistering one that may be held); `completion` gets nil
    /// when it is registered. Not called once `gen` has passed.
    private func registerAdvertisement(_ advertisement: LEAdvertisement, _ gen: Int,
                                       completion: @escaping (DBusError?) -> Void) {
        unregisterIfUnknown(application: false, gen) { [weak self] in
            guard let self else { return }
            self.advertisementHeld = .unknown
            self.bus.call(destination: BlueZ.service, path: self.adapterPath, interface: BlueZ.advertisingManagerInterface,
                          member: "RegisterAdvertisement", args: [.objectPath(advertisement.path), .stringDict([:])],
                          timeout: self.registrationTimeout, autoStart: false) { [weak self] result in
                guard let self, gen == self.generation, self.running else { return }
                guard case .failure(let error) = result else {
                    self.advertisementHeld = .registered
                    return completion(nil)
                }
                // advertisementHeld stays unknown.
                completion(DBusError(name: error.name, message: "RegisterAdvertisement on \(self.adapterName): \(error.message)"))
            }
        }
    }

    private func registered() {
        attemptInFlight = false
        nextRetry = Self.retryInterval
        failureRetryDelay = Self.failureRetryInterval
        registrationCount += 1
        setState(.registered)
    }

    private func registrationFailed(_ error: DBusError) {
        attemptInFlight = false
        setState(.waiting(error.oneLine))
        onRegistrationError?(error)
        let delay = failureRetryDelay
        failureRetryDelay = min(delay * 2, Self.longestFailureRetryInterval)
        scheduleRetry(after: delay)
    }

    /// Only the advertisement went: the application, the links and the subscriptions stay, so
    /// the state stays `registered` (the server would otherwise drop every central's session);
    /// the advertisement alone is registered again, retried every second until it is.
    private func advertisementReleased() {
        guard running, state == .registered, advertisement != nil else { return }
        advertisementsReleased += 1
        registerAdvertisementAgain(generation)
    }

    private func registerAdvertisementAgain(_ gen: Int, after delay: Double = Peripheral.failureRetryInterval) {
        guard let advertisement else { return }
        if advertisementHeld == .registered { advertisementHeld = .nothing }
        registerAdvertisement(advertisement, gen) { [weak self] error in
            guard let self, self.state == .registered else { return }
            if let error {
                self.onRegistrationError?(error)
                _ = self.loop.schedule(after: delay) { [weak self] in
                    guard let self, gen == self.generation else { return }
                    self.registerAdvertisementAgain(gen, after: min(delay * 2, Self.longestFailureRetryInterval))
                }
                return
            }
            self.advertisementsRenewed += 1
        }
    }

    /// Everything bluetoothd held for us is gone (it exited, or the adapter went away).
    private func lost(_ why: String) {
        generation += 1
        attemptInFlight = false
        poweringRequested = false
        nextRetry = Self.retryInterval
        failureRetryDelay = Self.failureRetryInterval
        applicationHeld = .nothing
        advertisementHeld = .nothing
        cancelAgentRetry()
        application.resetSubscriptions()
        for device in connectedDevices.sorted() {
            connectedDevices.remove(device)
            onConnectionChange?(device, false)
        }
        setState(.waiting(why))
    }

    // MARK: - Signals

    private func bluezOwnerChanged(old: String?, new: String?) {
        guard running else { return }
        if old != nil {
            bluezOwner = nil
            agentRegistered = false
            lost("bluetoothd is not running")
        }
        if let new {
            bluezOwner = new
            attempt()
            scheduleRetry()
        }
    }

    private func interfacesAdded(_ path: String, _ interfaces: [String: [String: DBusValue]]) {
        guard running else { return }
        if path == adapterPath, interfaces[BlueZ.adapterInterface] != nil {
            attempt()
            return
        }
        if let device = interfaces[BlueZ.deviceInterface], path.hasPrefix(adapterPath + "/") {
            noteKind(path, device)
            setConnected(path, device["Connected"]?.bool ?? false)
        }
    }

    private func interfacesRemoved(_ path: String, _ interfaces: [String]) {
        guard running else { return }
        if path == adapterPath, interfaces.contains(BlueZ.adapterInterface) {
            lost("\(adapterName) went away")
            scheduleRetry()
            return
        }
        if interfaces.contains(BlueZ.deviceInterface) {
            bondedDevices.remove(path)
            classicDevices.remove(path)
            setConnected(path, false)
        }
    }

    private func propertiesChanged(_ path: String, _ interface: String, _ changed: [String: DBusValue]) {
        guard running else { return }
        if interface == BlueZ.deviceInterface {
            noteKind(path, changed, update: true)
            if let connected = changed["Connected"]?.bool { setConnected(path, connected, changeSignalled: true) }
        } else if interface == BlueZ.adapterInterface, path == adapterPath, changed["Powered"]?.bool == true {
            poweringRequested = false
            if state != .registered { attempt() }
        }
    }

    private func setConnected(_ device: String, _ connected: Bool, changeSignalled: Bool = false) {
        guard device.hasPrefix(adapterPath + "/dev_") else { return }
        if connected == connectedDevices.contains(device) {
            // Connected=false signalled for a device never seen connected: bluetoothd sends
            // property changes from an idle callback, so a connection that came and went in one
            // pass of its loop is one Connected=false. It may have written meanwhile: its state
            // must go all the same.
            if !connected && changeSignalled { onConnectionChange?(device, false) }
            return
        }
        if connected { connectedDevices.insert(device) } else { connectedDevices.remove(device) }
        onConnectionChange?(device, connected)
    }

    /// Records whether `device` is bonded and whether it is a BR/EDR one, from its properties
    /// (all of them, or with `update` only those that changed).
    private func noteKind(_ device: String, _ properties: [String: DBusValue], update: Bool = false) {
        if !update || properties["Paired"] != nil || properties["Bonded"] != nil {
            if properties["Paired"]?.bool == true || properties["Bonded"]?.bool == true {
                bondedDevices.insert(device)
            } else if !update || properties["Paired"]?.bool == false {
                bondedDevices.remove(device)
            }
        }
        if !update || properties["Class"] != nil || properties["AddressType"] != nil {
            if DeviceInfo(path: device, properties: properties).knownOverBREDR {
                classicDevices.insert(device)
            } else if !update {
                classicDevices.remove(device)
            }
        }
    }

    private func takeSnapshot(_ objects: BlueZObjects) {
        var now: Set<String> = []
        var present: Set<String> = []
        for path in objects.paths(with: BlueZ.deviceInterface, under: adapterPath) {
            guard let properties = objects.properties(path, BlueZ.deviceInterface) else { continue }
            present.insert(path)
            noteKind(path, properties)
            if properties["Connected"]?.bool == true { now.insert(path) }
        }
        // Devices bluetoothd no longer has (it restarted, or removed them unseen) are forgotten.
        bondedDevices.formIntersection(present)
        classicDevices.formIntersection(present)
        for device in connectedDevices.subtracting(now).sorted() { setConnected(device, false) }
        for device in now.subtracting(connectedDevices).sorted() { setConnected(device, true) }
    }
}
