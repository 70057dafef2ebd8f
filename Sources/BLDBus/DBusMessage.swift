internal import CDBus

/// A D-Bus message: a method call, a method return, an error or a signal.
///
/// Owns one reference to a libdbus `DBusMessage` and drops it in `deinit`
/// (`dbus_message_unref`). Not `Sendable`; use it on the loop thread.
public final class DBusMessage {
    /// The kind of message.
    public enum Kind: Int32, Sendable, CustomStringConvertible {
        case invalid = 0
        case methodCall = 1
        case methodReturn = 2
        case error = 3
        case signal = 4

        public var description: String {
            switch self {
            case .invalid: return "invalid"
            case .methodCall: return "method_call"
            case .methodReturn: return "method_return"
            case .error: return "error"
            case .signal: return "signal"
            }
        }
    }

    let raw: OpaquePointer

    /// Wraps a message whose reference the caller gives to us.
    init(taking raw: OpaquePointer) {
        self.raw = raw
    }

    /// Wraps a borrowed message, taking a new reference (`dbus_message_ref`).
    init(retaining raw: OpaquePointer) {
        self.raw = dbus_message_ref(raw)
    }

    deinit {
        dbus_message_unref(raw)
    }

    // MARK: Constructors

    /// A method call. Names are validated first (libdbus would abort on an invalid one).
    ///
    /// The corresponding C function is `dbus_message_new_method_call`.
    public static func methodCall(
        destination: String?, path: String, interface: String?, member: String
    ) throws(DBusError) -> DBusMessage {
        if let destination { try LibDBus.require(LibDBus.isValidBusName(destination), "invalid bus name '\(destination)'") }
        try LibDBus.require(LibDBus.isValidPath(path), "invalid object path '\(path)'")
        if let interface { try LibDBus.require(LibDBus.isValidInterface(interface), "invalid interface name '\(interface)'") }
        try LibDBus.require(LibDBus.isValidMember(member), "invalid member name '\(member)'")
        guard let m = dbus_message_new_method_call(destination, path, interface, member) else { throw DBusError.noMemory }
        return DBusMessage(taking: m)
    }

    /// A signal.
    ///
    /// The corresponding C function is `dbus_message_new_signal`.
    public static func signal(path: String, interface: String, member: String) throws(DBusError) -> DBusMessage {
        try LibDBus.require(LibDBus.isValidPath(path), "invalid object path '\(path)'")
        try LibDBus.require(LibDBus.isValidInterface(interface), "invalid interface name '\(interface)'")
        try LibDBus.require(LibDBus.isValidMember(member), "invalid member name '\(member)'")
        guard let m = dbus_message_new_signal(path, interface, member) else { throw DBusError.noMemory }
        return DBusMessage(taking: m)
    }

    /// The (empty) successful reply to `call`; append the return values to it.
    ///
    /// The corresponding C function is `dbus_message_new_method_return`.
    public static func methodReturn(to call: DBusMessage) throws(DBusError) -> DBusMessage {
        guard let m = dbus_message_new_method_return(call.raw) else { throw DBusError.noMemory }
        return DBusMessage(taking: m)
    }

    /// An error reply to `call`. An invalid error name is replaced by
    /// `org.freedesktop.DBus.Error.Failed` (keeping the text), and NUL characters are dropped from
    /// the message, so that building an error reply never fails on content.
    ///
    /// The corresponding C function is `dbus_message_new_error`.
    public static func error(replyingTo call: DBusMessage, _ error: DBusError) throws(DBusError) -> DBusMessage {
        var name = error.name
        var text = error.message
        if !LibDBus.isValidErrorName(name) {
            text = name + (text.isEmpty ? "" : ": " + text)
            name = DBusError.Name.failed
        }
        if text.utf8.contains(0) { text = String(text.filter { $0 != "\0" }) }
        guard let m = dbus_message_new_error(call.raw, name, text) else { throw DBusError.noMemory }
        return DBusMessage(taking: m)
    }

    // MARK: Header fields

    /// The corresponding C function is `dbus_message_get_type`.
    public var kind: Kind { Kind(rawValue: dbus_message_get_type(raw)) ?? .invalid }
    /// The corresponding C function is `dbus_message_get_path`.
    public var path: String? { dbus_message_get_path(raw).map { String(cString: $0) } }
    /// The corresponding C function is `dbus_message_get_interface`.
    public var interface: String? { dbus_message_get_interface(raw).map { String(cString: $0) } }
    /// The method or signal name. The corresponding C function is `dbus_message_get_member`.
    public var member: String? { dbus_message_get_member(raw).map { String(cString: $0) } }
    /// The sender's unique name (`:1.42`), set by the bus. The corresponding C function is `dbus_message_get_sender`.
    public var sender: String? { dbus_message_get_sender(raw).map { String(cString: $0) } }
    /// The corresponding C function is `dbus_message_get_destination`.
    public var destination: String? { dbus_message_get_destination(raw).map { String(cString: $0) } }
    /// The error name of an error reply. The corresponding C function is `dbus_message_get_error_name`.
    public var errorName: String? { dbus_message_get_error_name(raw).map { String(cString: $0) } }
    /// The body's signature, e.g. `sa{sv}`. The corresponding C function is `dbus_message_get_signature`.
    public var signature: String { dbus_message_get_signature(raw).map { String(cString: $0) } ?? "" }
    /// The serial (0 until sent). The corresponding C function is `dbus_message_get_serial`.
    public var serial: UInt32 { dbus_message_get_serial(raw) }
    /// The serial of the call this message answers. The corresponding C function is `dbus_message_get_reply_serial`.
    public var replySerial: UInt32 { dbus_message_get_reply_serial(raw) }

    /// The caller does not want a reply (`NO_REPLY_EXPECTED`): BlueZ sets it on WriteValue for
    /// `write-without-response`, StartNotify, StopNotify, Confirm and Release.
    ///
    /// The corresponding C functions are `dbus_message_get_no_reply` and `dbus_message_set_no_reply`.
    public var noReply: Bool {
        get { dbus_message_get_no_reply(raw) != 0 }
        set { dbus_message_set_no_reply(raw, newValue ? 1 : 0) }
    }

    /// Whether the bus may start the destination service (on by default for method calls).
    ///
    /// The corresponding C functions are `dbus_message_get_auto_start` and `dbus_message_set_auto_start`.
    public var autoStart: Bool {
        get { dbus_message_get_auto_start(raw) != 0 }
        set { dbus_message_set_auto_start(raw, newValue ? 1 : 0) }
    }

    /// True if this is a signal with the given interface and member.
    public func isSignal(interface: String, member: String) -> Bool {
        dbus_message_is_signal(raw, interface, member) != 0
    }

    /// For an error reply: its name and message. Nil for any other kind.
    ///
    /// The corresponding C function is `dbus_set_error_from_message`.
    public var error: DBusError? {
        guard kind == .error else { return nil }
        var e = CDBus.DBusError()
        dbus_error_init(&e)
        guard dbus_set_error_from_message(&e, raw) != 0 else { return nil }
        return DBusError(consuming: &e)
    }

    // MARK: Body

    /// Decodes the body. Computed on each access: every access reads `h` values afresh, each
    /// as a new duplicate owned by the returned ``OwnedFD``.
    ///
    /// The corresponding C functions are the `dbus_message_iter_*` readers.
    public var arguments: [DBusValue] { DBusCoding.read(raw) }

    /// The first argument if it is a string, without decoding the rest.
    public var firstStringArgument: String? { DBusCoding.firstString(raw) }

    /// Reads the top-level `ay` and `a{sv}` arguments without building ``arguments``' trees (the
    /// arguments of every GATT call, a hot path): `bytes` gets each byte array with its argument
    /// index, `entry` each entry of a string-keyed dictionary whose value is of a basic type other
    /// than `h` (variants unwrapped), with its index, its key and its value. Other arguments and
    /// other entries are skipped without being decoded, however large they are.
    public func scanArguments(bytes: (Int, [UInt8]) -> Void, entry: (Int, String, DBusValue) -> Void) {
        DBusCoding.scan(raw, bytes: bytes, entry: entry)
    }

    /// Appends values to the body. Each value is validated first; nothing is appended if one is
    /// invalid (InvalidArgs). `h` values are duplicated into the message: the caller keeps and must
    /// eventually close its own descriptors (see ``OwnedFD``).
    ///
    /// The corresponding C functions are the `dbus_message_iter_append_*` and `open/close_container` writers.
    public func append(_ values: [DBusValue]) throws(DBusError) {
        try DBusCoding.append(values, to: raw)
    }

    /// Appends values to the body; see ``append(_:)-(DBusValue)``.
    public func append(_ values: DBusValue...) throws(DBusError) {
        try DBusCoding.append(values, to: raw)
    }
}

extension DBusMessage: CustomStringConvertible {
    /// One line describing the header, e.g. `method_call :1.5 -> org.bluez /org/bluez/hci0 org.bluez.Adapter1.StartDiscovery()`.
    public var description: String {
        var s = "\(kind) \(sender ?? "-") -> \(destination ?? "-") \(path ?? "-") "
        if let i = interface { s += i + "." }
        s += member ?? errorName ?? "#\(replySerial)"
        s += "(" + signature + ")"
        return s
    }
}
