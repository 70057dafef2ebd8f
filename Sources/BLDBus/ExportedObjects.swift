import BLCommand

/// Names of the standard interfaces.
public enum DBusInterfaceName {
    public static let properties = "org.freedesktop.DBus.Properties"
    public static let objectManager = "org.freedesktop.DBus.ObjectManager"
    public static let introspectable = "org.freedesktop.DBus.Introspectable"
    public static let peer = "org.freedesktop.DBus.Peer"
}

/// A method call received by an exported object.
///
/// Answer it once, now or later, with ``reply(_:)-([DBusValue])`` or ``fail(_:)``. The call keeps
/// the message (and the connection) alive, so it can be stored and answered after other events.
/// A call flagged no-reply (``expectsReply`` false; BlueZ uses it for `write-without-response`
/// WriteValue, StartNotify, StopNotify, Confirm, Release) needs no answer; answering it does
/// nothing. If a call that expects a reply is dropped unanswered, its deinit sends
/// `org.freedesktop.DBus.Error.Failed` so that the caller does not wait for its timeout.
///
/// Not `Sendable`.
public final class IncomingCall {
    /// The call as received.
    public let message: DBusMessage
    /// The connection it came on (replies go there).
    public let connection: DBusConnection
    /// The decoded arguments (decoded once; `h` values are descriptors this call owns until you
    /// ``OwnedFD/take()`` them).
    public private(set) lazy var arguments: [DBusValue] = message.arguments
    /// True once answered (or, for a no-reply call, once ``reply(_:)-([DBusValue])`` or ``fail(_:)`` was called).
    public private(set) var isAnswered = false

    init(message: DBusMessage, connection: DBusConnection) {
        self.message = message
        self.connection = connection
    }

    deinit {
        if !isAnswered, expectsReply {
            let what = "\(message.interface ?? "").\(message.member ?? "")"
            sendError(DBusError.failed("The handler of \(what) returned without replying"))
        }
    }

    /// The object path the call is addressed to.
    public var path: String { message.path ?? "/" }
    /// The interface named by the caller (optional in D-Bus; BlueZ always sets it).
    public var interface: String? { message.interface }
    /// The method name.
    public var member: String { message.member ?? "" }
    /// The caller's unique name.
    public var sender: String? { message.sender }
    /// False for calls flagged no-reply.
    public var expectsReply: Bool { !message.noReply }

    /// Answers with return values. If they can't be marshalled (for instance an array element of
    /// the wrong type), the caller gets `org.freedesktop.DBus.Error.Failed` describing the problem
    /// instead, and this returns false. A second answer is ignored (returns false).
    ///
    /// The corresponding C function is `dbus_message_new_method_return`.
    @discardableResult
    public func reply(_ values: [DBusValue]) -> Bool {
        if isAnswered { return false }
        isAnswered = true
        guard expectsReply else { return true }
        do {
            let r = try DBusMessage.methodReturn(to: message)
            try r.append(values)
            try connection.send(r)
            return true
        } catch {
            sendError(DBusError.failed("Could not build the reply to \(member): \(error.oneLine)"))
            return false
        }
    }

    /// Answers with return values (none for an empty reply).
    @discardableResult
    public func reply(_ values: DBusValue...) -> Bool {
        reply(values)
    }

    /// Answers with an error, e.g. `DBusError(name: "org.bluez.Error.NotPermitted", message: "...")`.
    ///
    /// The corresponding C function is `dbus_message_new_error`.
    public func fail(_ error: DBusError) {
        if isAnswered { return }
        isAnswered = true
        if expectsReply { sendError(error) }
    }

    /// Answers with an error given by name and message.
    public func fail(name: String, message text: String = "") {
        fail(DBusError(name: name, message: text))
    }

    private func sendError(_ error: DBusError) {
        if let e = try? DBusMessage.error(replyingTo: message, error) { _ = try? connection.send(e) }
    }
}

/// One interface of an exported object: its properties (getter, optional setter) and methods.
///
/// Build it with chained calls:
/// ```swift
/// let chrc = ExportedInterface("org.bluez.GattCharacteristic1")
///     .property("UUID") { .string(uuid) }
///     .property("Flags") { .stringArray(["read", "write"]) }
///     .method("ReadValue", inSignature: "a{sv}", outSignature: "ay") { call in call.reply(.bytes(data)) }
/// ```
/// Not `Sendable`.
public final class ExportedInterface {
    public struct Property {
        public let name: String
        public let get: () -> DBusValue
        public let set: ((DBusValue) throws(DBusError) -> Void)?
    }

    public struct Method {
        public let name: String
        /// If set, calls with another signature are refused with InvalidArgs.
        public let inSignature: String?
        /// Only for introspection.
        public let outSignature: String?
        public let handler: (IncomingCall) -> Void
    }

    public let name: String
    public private(set) var properties: [Property] = []
    public private(set) var methods: [Method] = []

    /// - Precondition: `name` is a valid interface name.
    public init(_ name: String) {
        precondition(LibDBus.isValidInterface(name), "invalid D-Bus interface name '\(name)'")
        self.name = name
    }

    /// Adds (or replaces) a property. The getter is called for Get, GetAll, GetManagedObjects and
    /// ``ExportedObjectTree/emitPropertiesChanged(path:interface:names:)``; the value must keep
    /// the same type. Without a setter the property is read-only (Set fails with
    /// PropertyReadOnly). The setter receives the value without its variant; throwing answers the
    /// Set call with that error. Emit PropertiesChanged yourself if the value changes.
    @discardableResult
    public func property(
        _ name: String,
        set: ((DBusValue) throws(DBusError) -> Void)? = nil,
        get: @escaping () -> DBusValue
    ) -> ExportedInterface {
        properties.removeAll { $0.name == name }
        properties.append(Property(name: name, get: get, set: set))
        return self
    }

    /// Adds (or replaces) a method. The handler answers through the ``IncomingCall``, at once or
    /// later.
    ///
    /// - Precondition: `name` is a valid member name.
    @discardableResult
    public func method(
        _ name: String, inSignature: String? = nil, outSignature: String? = nil,
        _ handler: @escaping (IncomingCall) -> Void
    ) -> ExportedInterface {
        precondition(LibDBus.isValidMember(name), "invalid D-Bus member name '\(name)'")
        methods.removeAll { $0.name == name }
        methods.append(Method(name: name, inSignature: inSignature, outSignature: outSignature, handler: handler))
        return self
    }

    /// Removes a property (for optional properties that come and go).
    public func removeProperty(_ name: String) {
        properties.removeAll { $0.name == name }
    }

    /// The current value of a property, or nil if there is no such property.
    public func value(of property: String) -> DBusValue? {
        properties.first { $0.name == property }?.get()
    }

    /// Every property as `a{sv}`, in the order they were added.
    public func allProperties() -> DBusValue {
        .stringDict(ordered: properties.map { ($0.name, $0.get()) })
    }
}

/// An object at one path, with its interfaces.
public final class ExportedObject {
    public let path: String
    public private(set) var interfaces: [ExportedInterface]

    /// - Precondition: `path` is a valid object path.
    public init(path: String, interfaces: [ExportedInterface] = []) {
        precondition(LibDBus.isValidPath(path), "invalid D-Bus object path '\(path)'")
        self.path = path
        self.interfaces = interfaces
    }

    /// Adds an interface, replacing one with the same name. Does not emit InterfacesAdded; see
    /// ``ExportedObjectTree/emitInterfacesAdded(path:interfaces:)``.
    public func add(_ interface: ExportedInterface) {
        interfaces.removeAll { $0.name == interface.name }
        interfaces.append(interface)
    }

    /// Removes an interface by name.
    public func removeInterface(_ name: String) {
        interfaces.removeAll { $0.name == name }
    }

    public func interface(_ name: String) -> ExportedInterface? {
        interfaces.first { $0.name == name }
    }

    /// `a{sa{sv}}`: every interface with its properties.
    public func propertiesByInterface(only names: [String]? = nil) -> DBusValue {
        var entries: [(key: DBusValue, value: DBusValue)] = []
        for i in interfaces where names == nil || names!.contains(i.name) {
            entries.append((key: .string(i.name), value: i.allProperties()))
        }
        return .dictionary(keySignature: "s", valueSignature: "a{sv}", entries)
    }
}

/// A tree of exported objects under one root path, served on a connection with
/// ``DBusConnection/export(_:)`` (`dbus_connection_try_register_fallback` on the root).
///
/// The tree implements for its objects:
/// * `org.freedesktop.DBus.ObjectManager.GetManagedObjects` on the root (every object strictly
///   below it, sorted by path), and the InterfacesAdded/InterfacesRemoved signals;
/// * `org.freedesktop.DBus.Properties` Get/GetAll/Set, and the PropertiesChanged signal;
/// * `org.freedesktop.DBus.Introspectable.Introspect` (for objects and the nodes between them);
/// * method dispatch to ``ExportedInterface`` handlers; UnknownObject for a path without an
///   object, UnknownMethod for an unknown interface or method, InvalidArgs for a wrong signature.
///
/// One tree type serves a BlueZ GATT application (root = app path; services and characteristics
/// below it) as well as an LE advertisement (an object with LEAdvertisement1 and Release).
///
/// Not `Sendable`.
public final class ExportedObjectTree {
    /// The root path; objects live at it or below it.
    public let root: String
    /// The connection it is exported on, if any.
    public internal(set) weak var connection: DBusConnection?
    /// Whether the root answers ObjectManager.GetManagedObjects (default true).
    public var providesObjectManager = true
    /// Decides whether a method call to the tree is answered at all, before anything else
    /// (Properties, Introspect and GetManagedObjects included). A call it refuses (returning
    /// false) must be answered by it, with an error. Default: every call is admitted.
    public var admit: ((IncomingCall) -> Bool)?

    private var objects: [String: ExportedObject] = [:]

    /// - Precondition: `root` is a valid object path.
    public init(root: String) {
        precondition(LibDBus.isValidPath(root), "invalid D-Bus object path '\(root)'")
        self.root = root
    }

    private func isInTree(_ path: String) -> Bool {
        root == "/" || path == root || path.hasPrefix(root + "/")
    }

    private func isBelowRoot(_ path: String) -> Bool {
        path != root && isInTree(path)
    }

    /// Adds an object (replacing one at the same path). With `announce`, an exported tree
    /// emits InterfacesAdded for an object below the root.
    ///
    /// - Throws: InvalidArgs if the path is outside the tree; a send error from the signal.
    public func add(_ object: ExportedObject, announce: Bool = true) throws(DBusError) {
        guard isInTree(object.path) else {
            throw DBusError.invalidArgs("Object path \(object.path) is outside the tree at \(root)")
        }
        objects[object.path] = object
        if announce, connection != nil, isBelowRoot(object.path) {
            try emitInterfacesAdded(path: object.path)
        }
    }

    /// Removes the object at `path`. With `announce`, an exported tree emits InterfacesRemoved
    /// (a failure to send it, e.g. after a disconnection, is ignored).
    @discardableResult
    public func remove(path: String, announce: Bool = true) -> ExportedObject? {
        guard let object = objects.removeValue(forKey: path) else { return nil }
        if announce, connection != nil, isBelowRoot(path) {
            try? emitInterfacesRemoved(path: path, interfaces: object.interfaces.map(\.name))
        }
        return object
    }

    public func object(at path: String) -> ExportedObject? { objects[path] }

    /// Every object path, sorted.
    public var objectPaths: [String] { objects.keys.sorted() }

    /// The GetManagedObjects value, `a{oa{sa{sv}}}`: every object strictly below the root.
    public func managedObjects() -> DBusValue {
        var entries: [(key: DBusValue, value: DBusValue)] = []
        for path in objectPaths where isBelowRoot(path) {
            entries.append((key: .objectPath(path), value: objects[path]!.propertiesByInterface()))
        }
        return .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", entries)
    }

    // MARK: - Signals

    private func emit(path: String, interface: String, member: String, _ args: [DBusValue]) throws(DBusError) {
        guard let connection else { return }
        let m = try DBusMessage.signal(path: path, interface: interface, member: member)
        try m.append(args)
        try connection.send(m)
    }

    /// Emits Properties.PropertiesChanged(interface, changed, invalidated) from `path`. Keys of
    /// `changed` go out sorted. Does nothing if the tree is not exported.
    public func emitPropertiesChanged(
        path: String, interface: String, changed: [String: DBusValue], invalidated: [String] = []
    ) throws(DBusError) {
        try emit(path: path, interface: DBusInterfaceName.properties, member: "PropertiesChanged",
                 [.string(interface), .stringDict(changed), .stringArray(invalidated)])
    }

    /// Emits PropertiesChanged with the current values of the named properties (read from their
    /// getters). Unknown names are ignored.
    public func emitPropertiesChanged(path: String, interface: String, names: [String]) throws(DBusError) {
        guard let iface = objects[path]?.interface(interface) else {
            throw DBusError(name: DBusError.Name.unknownInterface, message: "No interface \(interface) at \(path)")
        }
        var changed: [(String, DBusValue)] = []
        for n in names { if let v = iface.value(of: n) { changed.append((n, v)) } }
        try emit(path: path, interface: DBusInterfaceName.properties, member: "PropertiesChanged",
                 [.string(interface), .stringDict(ordered: changed), .stringArray([])])
    }

    /// Emits ObjectManager.InterfacesAdded(path, interfaces with their properties) from the root.
    public func emitInterfacesAdded(path: String, interfaces: [String]? = nil) throws(DBusError) {
        guard let object = objects[path] else {
            throw DBusError(name: DBusError.Name.unknownObject, message: "No object at \(path)")
        }
        try emit(path: root, interface: DBusInterfaceName.objectManager, member: "InterfacesAdded",
                 [.objectPath(path), object.propertiesByInterface(only: interfaces)])
    }

    /// Emits ObjectManager.InterfacesRemoved(path, interfaces) from the root.
    public func emitInterfacesRemoved(path: String, interfaces: [String]) throws(DBusError) {
        try emit(path: root, interface: DBusInterfaceName.objectManager, member: "InterfacesRemoved",
                 [.objectPath(path), .stringArray(interfaces)])
    }

    // MARK: - Dispatch

    private static func unknownObject(_ path: String) -> DBusError {
        DBusError(name: DBusError.Name.unknownObject, message: "No such object path '\(path)'")
    }

    func handle(_ call: IncomingCall) {
        if let admit, !admit(call) { return }
        let path = call.path
        let member = call.member
        switch call.interface {
        case DBusInterfaceName.properties?:
            handleProperties(call, path: path, member: member)
            return
        case DBusInterfaceName.objectManager? where member == "GetManagedObjects" && path == root && providesObjectManager:
            call.reply(managedObjects())
            return
        case DBusInterfaceName.introspectable? where member == "Introspect":
            if let xml = introspect(path) { call.reply(.string(xml)) } else { call.fail(Self.unknownObject(path)) }
            return
        default:
            break
        }
        guard let object = objects[path] else {
            call.fail(Self.unknownObject(path))
            return
        }
        var method: ExportedInterface.Method?
        if let name = call.interface {
            guard let iface = object.interface(name) else {
                call.fail(name: DBusError.Name.unknownMethod, message: "No such interface '\(name)' at object path '\(path)'")
                return
            }
            method = iface.methods.first { $0.name == member }
        } else {
            for iface in object.interfaces {
                if let m = iface.methods.first(where: { $0.name == member }) {
                    method = m
                    break
                }
            }
        }
        guard let method else {
            call.fail(name: DBusError.Name.unknownMethod,
                      message: "No such method '\(member)' in interface '\(call.interface ?? "")' at object path '\(path)'")
            return
        }
        if let expected = method.inSignature, call.message.signature != expected {
            call.fail(DBusError.invalidArgs("Expected signature '\(expected)', got '\(call.message.signature)'"))
            return
        }
        method.handler(call)
    }

    private func handleProperties(_ call: IncomingCall, path: String, member: String) {
        guard let object = objects[path] else {
            call.fail(Self.unknownObject(path))
            return
        }
        func lookup(_ name: String?) -> ExportedInterface? {
            guard let name, let iface = object.interface(name) else {
                call.fail(name: DBusError.Name.unknownInterface, message: "No such interface '\(name ?? "")' at object path '\(path)'")
                return nil
            }
            return iface
        }
        // A body is decoded only once its signature is the expected one (a caller must not make
        // us build values out of a large body of something else).
        switch (member, call.message.signature) {
        case ("Get", "ss"):
            let args = call.arguments
            guard let iface = lookup(args[0].string) else { return }
            let name = args[1].string ?? ""
            guard let v = iface.value(of: name) else {
                call.fail(name: DBusError.Name.unknownProperty, message: "No such property '\(name)' in '\(iface.name)'")
                return
            }
            call.reply(.variant(v))
        case ("GetAll", "s"):
            guard let iface = lookup(call.arguments[0].string) else { return }
            call.reply(iface.allProperties())
        case ("Set", "ssv"):
            let args = call.arguments
            guard let iface = lookup(args[0].string) else { return }
            let name = args[1].string ?? ""
            guard let p = iface.properties.first(where: { $0.name == name }) else {
                call.fail(name: DBusError.Name.unknownProperty, message: "No such property '\(name)' in '\(iface.name)'")
                return
            }
            guard let setter = p.set else {
                call.fail(name: DBusError.Name.propertyReadOnly, message: "Property '\(name)' is read-only")
                return
            }
            do {
                try setter(args[2].variant ?? args[2])
                call.reply([])
            } catch {
                call.fail(error)
            }
        case ("Get", _), ("GetAll", _), ("Set", _):
            call.fail(DBusError.invalidArgs("Wrong arguments '\(call.message.signature)' for Properties.\(member)"))
        default:
            call.fail(name: DBusError.Name.unknownMethod, message: "No such method '\(member)' in interface '\(DBusInterfaceName.properties)'")
        }
    }

    // MARK: - Introspection

    /// Immediate children of `path` that lead to objects.
    private func childNodes(of path: String) -> [String] {
        let prefix = path == "/" ? "/" : path + "/"
        var names: [String] = []
        for p in objects.keys where p.hasPrefix(prefix) && p != path {
            let rest = p.dropFirst(prefix.count)
            let name = String(rest.prefix { $0 != "/" })
            if !name.isEmpty, !names.contains(name) { names.append(name) }
        }
        return names.sorted()
    }

    /// Introspection XML for `path`, or nil if there is neither an object there nor one below.
    func introspect(_ path: String) -> String? {
        let object = objects[path]
        let children = childNodes(of: path)
        if object == nil, children.isEmpty, path != root { return nil }
        var x = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node>
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect"><arg name="xml" type="s" direction="out"/></method>
          </interface>

        """
        if object != nil {
            x += """
              <interface name="org.freedesktop.DBus.Properties">
                <method name="Get"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="out"/></method>
                <method name="GetAll"><arg name="interface" type="s" direction="in"/><arg name="properties" type="a{sv}" direction="out"/></method>
                <method name="Set"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="in"/></method>
                <signal name="PropertiesChanged"><arg name="interface" type="s"/><arg name="changed" type="a{sv}"/><arg name="invalidated" type="as"/></signal>
              </interface>

            """
        }
        if path == root, providesObjectManager {
            x += """
              <interface name="org.freedesktop.DBus.ObjectManager">
                <method name="GetManagedObjects"><arg name="objects" type="a{oa{sa{sv}}}" direction="out"/></method>
                <signal name="InterfacesAdded"><arg name="object" type="o"/><arg name="interfaces" type="a{sa{sv}}"/></signal>
                <signal name="InterfacesRemoved"><arg name="object" type="o"/><arg name="interfaces" type="as"/></signal>
              </interface>

            """
        }
        for iface in object?.interfaces ?? [] {
            x += "  <interface name=\"\(iface.name)\">\n"
            for m in iface.methods {
                x += "    <method name=\"\(m.name)\">"
                for t in DBusSignature.split(m.inSignature ?? "") ?? [] { x += "<arg type=\"\(Self.escape(t))\" direction=\"in\"/>" }
                for t in DBusSignature.split(m.outSignature ?? "") ?? [] { x += "<arg type=\"\(Self.escape(t))\" direction=\"out\"/>" }
                x += "</method>\n"
            }
            for p in iface.properties {
                let access = p.set == nil ? "read" : "readwrite"
                x += "    <property name=\"\(p.name)\" type=\"\(Self.escape(p.get().signature))\" access=\"\(access)\"/>\n"
            }
            x += "  </interface>\n"
        }
        for c in children { x += "  <node name=\"\(Self.escape(c))\"/>\n" }
        x += "</node>\n"
        return x
    }

    private static func escape(_ s: String) -> String {
        var out = ""
        for ch in s {
            switch ch {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            default: out.append(ch)
            }
        }
        return out
    }
}
