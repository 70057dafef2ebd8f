import BLCommand

/// A D-Bus match rule (the subset BlueZ clients need), e.g.
/// `type='signal',sender='org.bluez',interface='org.freedesktop.DBus.ObjectManager',path='/'`.
public struct MatchRule: Hashable, Sendable, CustomStringConvertible {
    public var type: DBusMessage.Kind?
    /// A unique (`:1.5`) or well-known (`org.bluez`) name. For a well-known name the connection
    /// tracks its current owner, so that locally it only delivers that owner's signals.
    public var sender: String?
    public var path: String?
    /// The path itself or anything below it (`path_namespace`).
    public var pathNamespace: String?
    public var interface: String?
    public var member: String?
    /// The first argument, compared as a string.
    public var arg0: String?

    public init(
        type: DBusMessage.Kind? = .signal, sender: String? = nil, path: String? = nil,
        pathNamespace: String? = nil, interface: String? = nil, member: String? = nil, arg0: String? = nil
    ) {
        self.type = type
        self.sender = sender
        self.path = path
        self.pathNamespace = pathNamespace
        self.interface = interface
        self.member = member
        self.arg0 = arg0
    }

    /// The rule as the bus expects it.
    public var ruleString: String {
        var parts: [String] = []
        func add(_ key: String, _ value: String?) {
            guard let value else { return }
            // Inside quotes, an apostrophe is written as '\'' (D-Bus specification, match rules).
            var escaped = ""
            for ch in value {
                if ch == "'" { escaped += "'\\''" } else { escaped.append(ch) }
            }
            parts.append("\(key)='\(escaped)'")
        }
        if let type { add("type", type.description) }
        add("sender", sender)
        add("path", path)
        add("path_namespace", pathNamespace)
        add("interface", interface)
        add("member", member)
        add("arg0", arg0)
        return parts.joined(separator: ",")
    }

    public var description: String { ruleString }

    /// Local matching, given the sender's resolved unique name for a well-known `sender`.
    func matches(_ m: DBusMessage, ownerOfSender: String?) -> Bool {
        if let type, m.kind != type { return false }
        if let sender {
            let expected = DBusConnection.tracksOwner(of: sender) ? ownerOfSender : sender
            guard let expected, m.sender == expected else { return false }
        }
        if path != nil || pathNamespace != nil {
            guard let p = m.path else { return false }
            if let path, p != path { return false }
            if let ns = pathNamespace, !(ns == "/" || p == ns || p.hasPrefix(ns + "/")) { return false }
        }
        if let interface, m.interface != interface { return false }
        if let member, m.member != member { return false }
        if let arg0, m.firstStringArgument != arg0 { return false }
        return true
    }
}

/// Identifies a subscription; pass it to ``DBusConnection/unsubscribe(_:)``.
public struct SubscriptionToken: Hashable, Sendable {
    let id: UInt64
}

struct Subscription {
    let id: UInt64
    let rule: MatchRule
    let handler: (DBusMessage) -> Void
    /// Called if the connection to the bus is lost (what the subscription watched is gone too).
    var onBusLost: (() -> Void)? = nil
}

struct NameOwnerEntry {
    var owner: String?
    var refs: Int
}

extension DBusConnection {
    static let localPath = "/org/freedesktop/DBus/Local"
    static let localInterface = "org.freedesktop.DBus.Local"

    /// Well-known names other than the bus itself are resolved to their owner for local matching.
    static func tracksOwner(of sender: String) -> Bool {
        !sender.hasPrefix(":") && sender != busName
    }

    private static func nameOwnerRule(_ name: String) -> MatchRule {
        MatchRule(sender: busName, path: busPath, interface: busName, member: "NameOwnerChanged", arg0: name)
    }

    /// Adds `rule` at the bus (waiting for the confirmation, so no signal sent afterwards is
    /// missed) and calls `handler` on the loop for every incoming message that matches it.
    ///
    /// Matching is also done locally, so two subscriptions on one connection each see only their
    /// own signals. For a well-known `sender` the connection tracks the name's owner
    /// (GetNameOwner, then NameOwnerChanged) to compare it with the unique sender name messages
    /// carry. Signals are delivered in arrival order; a handler may subscribe, unsubscribe and
    /// wait (``callAndWait(_:timeout:)``).
    ///
    /// The corresponding bus method is `org.freedesktop.DBus.AddMatch`; the corresponding C
    /// function for the routing is `dbus_connection_add_filter`.
    public func subscribe(_ rule: MatchRule, _ handler: @escaping (DBusMessage) -> Void) throws(DBusError) -> SubscriptionToken {
        try subscribe(rule, onBusLost: nil, handler)
    }

    /// ``subscribe(_:_:)``, and `onBusLost` is called if the connection to the bus is lost.
    func subscribe(_ rule: MatchRule, onBusLost: (() -> Void)?, _ handler: @escaping (DBusMessage) -> Void) throws(DBusError) -> SubscriptionToken {
        if let sender = rule.sender, Self.tracksOwner(of: sender) {
            try retainOwnerTracking(sender)
        }
        do {
            try addMatch(rule.ruleString)
        } catch {
            if let sender = rule.sender, Self.tracksOwner(of: sender) { releaseOwnerTracking(sender) }
            throw error
        }
        let id = makeID()
        subscriptions.append(Subscription(id: id, rule: rule, handler: handler, onBusLost: onBusLost))
        return SubscriptionToken(id: id)
    }

    /// ``subscribe(_:_:)`` with the rule given by its fields (a signal rule).
    public func subscribe(
        sender: String? = nil, path: String? = nil, pathNamespace: String? = nil,
        interface: String? = nil, member: String? = nil, arg0: String? = nil,
        _ handler: @escaping (DBusMessage) -> Void
    ) throws(DBusError) -> SubscriptionToken {
        try subscribe(MatchRule(sender: sender, path: path, pathNamespace: pathNamespace,
                                interface: interface, member: member, arg0: arg0), handler)
    }

    /// Stops a subscription: its handler is not called again (even for signals already queued),
    /// and its rule is removed at the bus (without waiting). Unknown tokens are ignored.
    public func unsubscribe(_ token: SubscriptionToken) {
        guard let i = subscriptions.firstIndex(where: { $0.id == token.id }) else { return }
        let rule = subscriptions.remove(at: i).rule
        removeMatch(rule.ruleString)
        if let sender = rule.sender, Self.tracksOwner(of: sender) { releaseOwnerTracking(sender) }
    }

    private func retainOwnerTracking(_ name: String) throws(DBusError) {
        if var entry = nameOwners[name] {
            entry.refs += 1
            nameOwners[name] = entry
            return
        }
        // Insert first: a NameOwnerChanged that arrives while we wait updates the entry, and the
        // GetNameOwner reply is applied in arrival order too.
        nameOwners[name] = NameOwnerEntry(owner: nil, refs: 1)
        do {
            try addMatch(Self.nameOwnerRule(name).ruleString)
        } catch {
            nameOwners[name] = nil
            throw error
        }
        var done = false
        call(destination: Self.busName, path: Self.busPath, interface: Self.busName, member: "GetNameOwner",
             args: [.string(name)]) { [weak self] result in
            done = true
            if case .success(let args) = result, let owner = args.first?.string {
                self?.nameOwners[name]?.owner = owner
            }
        }
        _ = loop.run(until: { done }, timeout: 30)
    }

    private func releaseOwnerTracking(_ name: String) {
        guard var entry = nameOwners[name] else { return }
        entry.refs -= 1
        if entry.refs > 0 {
            nameOwners[name] = entry
            return
        }
        nameOwners[name] = nil
        removeMatch(Self.nameOwnerRule(name).ruleString)
    }

    func routeSignal(_ message: DBusMessage) {
        if message.path == Self.localPath, message.isSignal(interface: Self.localInterface, member: "Disconnected") {
            handleDisconnected()
            return
        }
        if !nameOwners.isEmpty, message.sender == Self.busName,
           message.isSignal(interface: Self.busName, member: "NameOwnerChanged") {
            let args = message.arguments
            if args.count == 3, let name = args[0].string, let newOwner = args[2].string, nameOwners[name] != nil {
                nameOwners[name]?.owner = newOwner.isEmpty ? nil : newOwner
            }
        }
        if subscriptions.isEmpty { return }
        var matched: [UInt64] = []
        for s in subscriptions {
            let owner = s.rule.sender.flatMap { nameOwners[$0]?.owner }
            if s.rule.matches(message, ownerOfSender: owner) { matched.append(s.id) }
        }
        for id in matched {
            // Handlers may unsubscribe others: only call those still registered.
            if let s = subscriptions.first(where: { $0.id == id }) { s.handler(message) }
        }
    }

    // MARK: - Helpers for the signals BlueZ clients need

    /// ObjectManager.InterfacesAdded(o object, a{sa{sv}} interfaces) on `path` (BlueZ: `/`).
    public func subscribeInterfacesAdded(
        sender: String?, path: String = "/",
        _ handler: @escaping (_ object: String, _ interfaces: [String: [String: DBusValue]]) -> Void
    ) throws(DBusError) -> SubscriptionToken {
        try subscribe(sender: sender, path: path, interface: DBusInterfaceName.objectManager, member: "InterfacesAdded") { m in
            let args = m.arguments
            guard args.count == 2, let object = args[0].objectPath, let ifaces = args[1].propertiesByInterface else { return }
            handler(object, ifaces)
        }
    }

    /// ObjectManager.InterfacesRemoved(o object, as interfaces) on `path` (BlueZ: `/`).
    public func subscribeInterfacesRemoved(
        sender: String?, path: String = "/",
        _ handler: @escaping (_ object: String, _ interfaces: [String]) -> Void
    ) throws(DBusError) -> SubscriptionToken {
        try subscribe(sender: sender, path: path, interface: DBusInterfaceName.objectManager, member: "InterfacesRemoved") { m in
            let args = m.arguments
            guard args.count == 2, let object = args[0].objectPath, let ifaces = args[1].stringArray else { return }
            handler(object, ifaces)
        }
    }

    /// Properties.PropertiesChanged(s interface, a{sv} changed, as invalidated) for one `path`
    /// or a whole `pathNamespace`, optionally for one `interface` only (matched as arg0).
    public func subscribePropertiesChanged(
        sender: String?, path: String? = nil, pathNamespace: String? = nil, interface: String? = nil,
        _ handler: @escaping (_ path: String, _ interface: String, _ changed: [String: DBusValue], _ invalidated: [String]) -> Void
    ) throws(DBusError) -> SubscriptionToken {
        try subscribe(sender: sender, path: path, pathNamespace: pathNamespace,
                      interface: DBusInterfaceName.properties, member: "PropertiesChanged", arg0: interface) { m in
            let args = m.arguments
            guard args.count == 3, let objectPath = m.path, let iface = args[0].string,
                  let changed = args[1].dictionary, let invalidated = args[2].stringArray else { return }
            handler(objectPath, iface, changed, invalidated)
        }
    }

    /// org.freedesktop.DBus.NameOwnerChanged for one well-known name: `newOwner` nil means the name
    /// vanished (e.g. bluetoothd exited), `oldOwner` nil that it appeared. If the connection to
    /// the bus is lost, the name is reported as vanished too (`oldOwner` nil, ``isConnected``
    /// false): whoever owned it cannot be reached any more, and no signal would say so.
    public func subscribeNameOwnerChanged(
        _ name: String,
        _ handler: @escaping (_ name: String, _ oldOwner: String?, _ newOwner: String?) -> Void
    ) throws(DBusError) -> SubscriptionToken {
        try subscribe(Self.nameOwnerRule(name), onBusLost: { handler(name, nil, nil) }) { m in
            let args = m.arguments
            guard args.count == 3, let n = args[0].string, let old = args[1].string, let new = args[2].string else { return }
            handler(n, old.isEmpty ? nil : old, new.isEmpty ? nil : new)
        }
    }
}
