/// A D-Bus error: an error name such as `org.bluez.Error.Failed` and a human-readable message.
///
/// It is the one error type of BLDBus: error replies from peers, failures made up locally by
/// libdbus (NoReply on timeout, Disconnected) and argument problems found before sending
/// (InvalidArgs) all arrive as a `DBusError`.
public struct DBusError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The error name, e.g. `org.freedesktop.DBus.Error.NoReply`.
    public var name: String
    /// The message that came with the error (may be empty).
    public var message: String

    public init(name: String, message: String = "") {
        self.name = name
        self.message = message
    }

    /// The part of the name after the last dot: `Failed` for `org.bluez.Error.Failed`.
    public var shortName: String {
        if let dot = name.lastIndex(of: ".") { return String(name[name.index(after: dot)...]) }
        return name
    }

    /// "org.bluez.Error.Failed: Not connected" (just the name when there is no message).
    public var description: String {
        message.isEmpty ? name : "\(name): \(message)"
    }

    /// ``description`` on one line: newlines and tabs become spaces and runs of spaces shrink to
    /// one, so the text fits a one-line diagnostic.
    public var oneLine: String {
        var out = ""
        out.reserveCapacity(description.utf8.count)
        var lastWasSpace = false
        for ch in description {
            let isSpace = ch == " " || ch == "\n" || ch == "\r" || ch == "\t" || ch == "\r\n"
            if isSpace {
                if !lastWasSpace { out.append(" ") }
                lastWasSpace = true
            } else {
                out.append(ch)
                lastWasSpace = false
            }
        }
        while out.hasSuffix(" ") { out.removeLast() }
        return out
    }

    /// True if this error has the given name.
    public func `is`(_ errorName: String) -> Bool { name == errorName }

    /// Well-known error names.
    public enum Name {
        public static let failed = "org.freedesktop.DBus.Error.Failed"
        public static let noMemory = "org.freedesktop.DBus.Error.NoMemory"
        /// A call got no reply within its timeout, or the connection closed before it did.
        public static let noReply = "org.freedesktop.DBus.Error.NoReply"
        public static let disconnected = "org.freedesktop.DBus.Error.Disconnected"
        public static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"
        public static let notSupported = "org.freedesktop.DBus.Error.NotSupported"
        public static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
        public static let serviceUnknown = "org.freedesktop.DBus.Error.ServiceUnknown"
        public static let nameHasNoOwner = "org.freedesktop.DBus.Error.NameHasNoOwner"
        public static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
        public static let unknownObject = "org.freedesktop.DBus.Error.UnknownObject"
        public static let unknownInterface = "org.freedesktop.DBus.Error.UnknownInterface"
        public static let unknownProperty = "org.freedesktop.DBus.Error.UnknownProperty"
        public static let propertyReadOnly = "org.freedesktop.DBus.Error.PropertyReadOnly"
        public static let objectPathInUse = "org.freedesktop.DBus.Error.ObjectPathInUse"
        /// Not a D-Bus standard name: a synchronous call gave up because the event loop is stopping
        /// (``BLCommand/EventLoop/stop()``, e.g. on SIGINT).
        public static let interrupted = "org.blpipe.Error.Interrupted"
    }

    public static func failed(_ message: String) -> DBusError { DBusError(name: Name.failed, message: message) }
    public static func invalidArgs(_ message: String) -> DBusError { DBusError(name: Name.invalidArgs, message: message) }
    static let noMemory = DBusError(name: Name.noMemory, message: "Out of memory")
}

extension DBusError {
    /// One line of text for any error thrown by BLDBus or BLCommand, for diagnostics:
    /// ``oneLine`` for a `DBusError`, the description otherwise.
    public static func oneLineMessage(_ error: any Error) -> String {
        if let e = error as? DBusError { return e.oneLine }
        return String(describing: error)
    }
}
