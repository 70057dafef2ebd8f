/// One D-Bus value of any type BlueZ uses, with its type signature.
///
/// Reading a message (``DBusMessage/arguments``) produces these cases:
/// * `ay` always decodes as ``bytes(_:)`` (the fast path: `dbus_message_iter_get_fixed_array`);
/// * every array of dict entries (`a{..}`) decodes as ``dictionary(keySignature:valueSignature:_:)``
///   in wire order; other arrays as ``array(elementSignature:_:)``;
/// * `h` decodes as ``unixFD(_:)`` holding a fresh duplicate that the value owns (see ``OwnedFD``).
///
/// The convenience accessors (``string``, ``uint16``, ``dictionary``…) look through variants, so
/// `props["UUID"]?.string` works whether or not the value is still wrapped in `v`.
///
/// Not `Sendable`, because ``unixFD(_:)`` holds an ``OwnedFD``.
///
/// Only ``variant(_:)`` is boxed (the other cases that nest keep their values in arrays, which
/// are on the heap already): reading a message allocates once per string or array, not once per
/// value.
public enum DBusValue {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    /// `h`: a file descriptor. Appending duplicates it; the ``OwnedFD`` keeps (and later closes)
    /// its own copy.
    case unixFD(OwnedFD)
    /// `a<elementSignature>`. Every element must have exactly `elementSignature`.
    case array(elementSignature: String, [DBusValue])
    /// `ay`, marshalled as one block (`dbus_message_iter_append_fixed_array`).
    case bytes([UInt8])
    /// `a{<keySignature><valueSignature>}`, entries in order. The key must be a basic type.
    case dictionary(keySignature: String, valueSignature: String, [(key: DBusValue, value: DBusValue)])
    /// `(...)`: a struct with at least one member.
    case structure([DBusValue])
    /// `v`: a value together with its own signature.
    indirect case variant(DBusValue)
}

// MARK: - Signature

extension DBusValue {
    /// The D-Bus type signature of this value, e.g. `a{sv}`.
    public var signature: String {
        var s = ""
        appendSignature(to: &s)
        return s
    }

    func appendSignature(to s: inout String) {
        switch self {
        case .byte: s += "y"
        case .bool: s += "b"
        case .int16: s += "n"
        case .uint16: s += "q"
        case .int32: s += "i"
        case .uint32: s += "u"
        case .int64: s += "x"
        case .uint64: s += "t"
        case .double: s += "d"
        case .string: s += "s"
        case .objectPath: s += "o"
        case .signature: s += "g"
        case .unixFD: s += "h"
        case .array(let element, _): s += "a"; s += element
        case .bytes: s += "ay"
        case .dictionary(let k, let v, _): s += "a{"; s += k; s += v; s += "}"
        case .structure(let members):
            s += "("
            for m in members { m.appendSignature(to: &s) }
            s += ")"
        case .variant: s += "v"
        }
    }
}

// MARK: - Constructors

extension DBusValue {
    /// `a{sv}` from a dictionary, keys sorted so that the wire order is deterministic. Values that
    /// are not already variants are wrapped in one.
    public static func stringDict(_ dict: [String: DBusValue]) -> DBusValue {
        stringDict(ordered: dict.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
    }

    /// `a{sv}` with the entries in the given order. Values that are not already variants are
    /// wrapped in one.
    public static func stringDict(ordered entries: [(String, DBusValue)]) -> DBusValue {
        .dictionary(keySignature: "s", valueSignature: "v", entries.map { (key: .string($0.0), value: $0.1.asVariant) })
    }

    /// `as`.
    public static func stringArray(_ strings: [String]) -> DBusValue {
        .array(elementSignature: "s", strings.map { .string($0) })
    }

    /// `ao`.
    public static func objectPathArray(_ paths: [String]) -> DBusValue {
        .array(elementSignature: "o", paths.map { .objectPath($0) })
    }

    /// This value wrapped in a variant, unless it already is one.
    public var asVariant: DBusValue {
        if case .variant = self { return self }
        return .variant(self)
    }
}

// MARK: - Accessors

extension DBusValue {
    /// The value with every enclosing variant removed.
    public var unwrapped: DBusValue {
        var v = self
        while case .variant(let inner) = v { v = inner }
        return v
    }

    /// The content of a variant (one level), or nil if this is not a variant.
    public var variant: DBusValue? {
        if case .variant(let v) = self { return v }
        return nil
    }

    public var byte: UInt8? { if case .byte(let v) = unwrapped { return v }; return nil }
    public var bool: Bool? { if case .bool(let v) = unwrapped { return v }; return nil }
    public var int16: Int16? { if case .int16(let v) = unwrapped { return v }; return nil }
    public var uint16: UInt16? { if case .uint16(let v) = unwrapped { return v }; return nil }
    public var int32: Int32? { if case .int32(let v) = unwrapped { return v }; return nil }
    public var uint32: UInt32? { if case .uint32(let v) = unwrapped { return v }; return nil }
    public var int64: Int64? { if case .int64(let v) = unwrapped { return v }; return nil }
    public var uint64: UInt64? { if case .uint64(let v) = unwrapped { return v }; return nil }
    public var double: Double? { if case .double(let v) = unwrapped { return v }; return nil }
    /// The text of an `s` (not of an `o` or `g`; see ``objectPath`` and ``signatureValue``).
    public var string: String? { if case .string(let v) = unwrapped { return v }; return nil }
    public var objectPath: String? { if case .objectPath(let v) = unwrapped { return v }; return nil }
    /// The text of a `g` value.
    public var signatureValue: String? { if case .signature(let v) = unwrapped { return v }; return nil }
    /// The descriptor of an `h` (still owned by the value; ``OwnedFD/take()`` it to keep it).
    /// Nil also for an `h` that carried no descriptor (an index past the message's descriptors,
    /// or no descriptor left to duplicate it into).
    public var fd: OwnedFD? { if case .unixFD(let v) = unwrapped, v.isValid { return v }; return nil }

    /// `ay` content (from ``bytes(_:)``, or an ``array(elementSignature:_:)`` of bytes).
    public var bytes: [UInt8]? {
        switch unwrapped {
        case .bytes(let b): return b
        case .array("y", let items):
            var out: [UInt8] = []
            out.reserveCapacity(items.count)
            for i in items {
                guard case .byte(let b) = i else { return nil }
                out.append(b)
            }
            return out
        default: return nil
        }
    }

    /// The elements of an array (an `ay` gives ``byte(_:)`` elements; a dictionary gives nil).
    public var array: [DBusValue]? {
        switch unwrapped {
        case .array(_, let items): return items
        case .bytes(let b): return b.map { .byte($0) }
        default: return nil
        }
    }

    /// The strings of an `as` or `ao`.
    public var stringArray: [String]? {
        guard case .array(_, let items) = unwrapped else { return nil }
        var out: [String] = []
        out.reserveCapacity(items.count)
        for i in items {
            switch i {
            case .string(let s), .objectPath(let s): out.append(s)
            default: return nil
            }
        }
        return out
    }

    /// The entries of any dictionary, in order.
    public var entries: [(key: DBusValue, value: DBusValue)]? {
        if case .dictionary(_, _, let e) = unwrapped { return e }
        return nil
    }

    /// A dictionary with `s` or `o` keys (typically `a{sv}`) as a Swift dictionary. One level of
    /// variant is removed from each value. If a key repeats, the last entry wins.
    public var dictionary: [String: DBusValue]? {
        guard case .dictionary(_, _, let entries) = unwrapped else { return nil }
        var out: [String: DBusValue] = [:]
        out.reserveCapacity(entries.count)
        for (k, v) in entries {
            switch k {
            case .string(let s), .objectPath(let s): out[s] = v.variant ?? v
            default: return nil
            }
        }
        return out
    }

    /// The members of a struct.
    public var structure: [DBusValue]? {
        if case .structure(let m) = unwrapped { return m }
        return nil
    }

    /// Looks `key` up in a dictionary with `s` or `o` keys; one level of variant is removed.
    public subscript(key: String) -> DBusValue? {
        guard case .dictionary(_, _, let entries) = unwrapped else { return nil }
        for (k, v) in entries {
            let name: String
            switch k {
            case .string(let s), .objectPath(let s): name = s
            default: continue
            }
            if name == key { return v.variant ?? v }
        }
        return nil
    }

    /// `a{sa{sv}}` (interfaces and their properties, as in InterfacesAdded) as nested dictionaries.
    public var propertiesByInterface: [String: [String: DBusValue]]? {
        guard let outer = dictionary else { return nil }
        var result: [String: [String: DBusValue]] = [:]
        for (iface, props) in outer {
            guard let p = props.dictionary else { return nil }
            result[iface] = p
        }
        return result
    }

    /// `a{oa{sa{sv}}}` (the reply of ObjectManager.GetManagedObjects) as nested dictionaries:
    /// path → interface → property → value.
    public var managedObjects: [String: [String: [String: DBusValue]]]? {
        guard let outer = dictionary else { return nil }
        var result: [String: [String: [String: DBusValue]]] = [:]
        for (path, ifaces) in outer {
            guard let i = ifaces.propertiesByInterface else { return nil }
            result[path] = i
        }
        return result
    }
}

// MARK: - Equality and description

extension DBusValue: Equatable {
    /// Structural equality. File descriptors compare by identity of their ``OwnedFD``; ``bytes(_:)``
    /// and an ``array(elementSignature:_:)`` of bytes are different values.
    public static func == (lhs: DBusValue, rhs: DBusValue) -> Bool {
        switch (lhs, rhs) {
        case (.byte(let a), .byte(let b)): return a == b
        case (.bool(let a), .bool(let b)): return a == b
        case (.int16(let a), .int16(let b)): return a == b
        case (.uint16(let a), .uint16(let b)): return a == b
        case (.int32(let a), .int32(let b)): return a == b
        case (.uint32(let a), .uint32(let b)): return a == b
        case (.int64(let a), .int64(let b)): return a == b
        case (.uint64(let a), .uint64(let b)): return a == b
        case (.double(let a), .double(let b)): return a == b
        case (.string(let a), .string(let b)): return a == b
        case (.objectPath(let a), .objectPath(let b)): return a == b
        case (.signature(let a), .signature(let b)): return a == b
        case (.unixFD(let a), .unixFD(let b)): return a === b
        case (.array(let sa, let a), .array(let sb, let b)): return sa == sb && a == b
        case (.bytes(let a), .bytes(let b)): return a == b
        case (.dictionary(let ka, let va, let a), .dictionary(let kb, let vb, let b)):
            guard ka == kb, va == vb, a.count == b.count else { return false }
            for i in a.indices where a[i].key != b[i].key || a[i].value != b[i].value { return false }
            return true
        case (.structure(let a), .structure(let b)): return a == b
        case (.variant(let a), .variant(let b)): return a == b
        default: return false
        }
    }
}

extension DBusValue: CustomStringConvertible {
    /// A compact, readable rendering for logs and test failures, e.g. `{"UUID": <"180d">}`.
    public var description: String {
        switch self {
        case .byte(let v): return "0x" + String(v, radix: 16)
        case .bool(let v): return String(v)
        case .int16(let v): return String(v)
        case .uint16(let v): return String(v)
        case .int32(let v): return String(v)
        case .uint32(let v): return String(v)
        case .int64(let v): return String(v)
        case .uint64(let v): return String(v)
        case .double(let v): return String(v)
        case .string(let v): return "\"" + v + "\""
        case .objectPath(let v): return v
        case .signature(let v): return "g\"" + v + "\""
        case .unixFD(let fd): return "fd(\(fd.rawValue))"
        case .array(_, let items): return "[" + items.map(\.description).joined(separator: ", ") + "]"
        case .bytes(let b):
            if b.count > 32 { return "ay[\(b.count) bytes]" }
            return "ay[" + b.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() + "]"
        case .dictionary(_, _, let entries):
            return "{" + entries.map { "\($0.key.description): \($0.value.description)" }.joined(separator: ", ") + "}"
        case .structure(let m): return "(" + m.map(\.description).joined(separator: ", ") + ")"
        case .variant(let v): return "<" + v.description + ">"
        }
    }
}

// MARK: - Signatures

/// Helpers for D-Bus type signatures (pure Swift; no libdbus).
public enum DBusSignature {
    /// Splits a signature into its single complete types: `"sa{sv}(ii)"` → `["s", "a{sv}", "(ii)"]`.
    /// Returns nil for a malformed signature.
    public static func split(_ signature: String) -> [String]? {
        let bytes = Array(signature.utf8)
        var out: [String] = []
        var i = 0
        while i < bytes.count {
            guard let end = endOfCompleteType(bytes, i) else { return nil }
            out.append(String(decoding: bytes[i..<end], as: UTF8.self))
            i = end
        }
        return out
    }

    /// True for a single basic type code (`y b n q i u x t d s o g h`), the only types allowed as
    /// dictionary keys.
    public static func isBasic(_ signature: String) -> Bool {
        signature.utf8.count == 1 && basicCodes.contains(signature.utf8.first!)
    }

    static let basicCodes: [UInt8] = Array("ybnqiuxtdsogh".utf8)

    private static func endOfCompleteType(_ b: [UInt8], _ start: Int, inArray: Bool = false) -> Int? {
        guard start < b.count else { return nil }
        let c = b[start]
        if basicCodes.contains(c) || c == UInt8(ascii: "v") { return start + 1 }
        switch c {
        case UInt8(ascii: "a"):
            return endOfCompleteType(b, start + 1, inArray: true)
        case UInt8(ascii: "("):
            var i = start + 1
            var members = 0
            while i < b.count, b[i] != UInt8(ascii: ")") {
                guard let e = endOfCompleteType(b, i) else { return nil }
                i = e
                members += 1
            }
            return i < b.count && members > 0 ? i + 1 : nil
        case UInt8(ascii: "{"):
            guard inArray, start + 1 < b.count, basicCodes.contains(b[start + 1]),
                  let valueEnd = endOfCompleteType(b, start + 2),
                  valueEnd < b.count, b[valueEnd] == UInt8(ascii: "}") else { return nil }
            return valueEnd + 1
        default:
            return nil
        }
    }
}
