internal import CDBus

// Low-level helpers over libdbus: error conversion, name validation, and building and reading
// message bodies with iterators. Together with DBusMessage.swift, DBusConnection.swift and
// DBusConnectionLoop.swift, this is where the raw dbus_* calls live.

extension DBusError {
    /// Takes the name and message out of a set libdbus `DBusError`, then frees it.
    init(consuming error: inout CDBus.DBusError) {
        name = error.name.map { String(cString: $0) } ?? Name.failed
        message = error.message.map { String(cString: $0) } ?? ""
        dbus_error_free(&error)
    }
}

enum LibDBus {
    /// Initialises once per process. Since libdbus 1.8 locking is always on; calling
    /// `dbus_threads_init_default()` is still recommended for older versions (bluez-notes §6.6).
    static let initialized: Bool = {
        _ = dbus_threads_init_default()
        return true
    }()

    /// Runs `body` with an initialised libdbus error and throws it if `body` set it (or returned
    /// nil without setting one: then `fallback` is thrown).
    static func check<T>(
        _ fallback: @autoclosure () -> DBusError = .noMemory,
        _ body: (UnsafeMutablePointer<CDBus.DBusError>) -> T?
    ) throws(DBusError) -> T {
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        let result = body(&error)
        if dbus_error_is_set(&error) != 0 {
            throw DBusError(consuming: &error)
        }
        guard let result else { throw fallback() }
        return result
    }

    // libdbus treats invalid names passed to its constructors as programming errors and aborts the
    // process ("check failed"), so every name is validated with these functions first.

    /// The corresponding C function is `dbus_validate_path`.
    static func isValidPath(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_validate_path(s, nil) != 0 }
    /// The corresponding C function is `dbus_validate_interface`.
    static func isValidInterface(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_validate_interface(s, nil) != 0 }
    /// The corresponding C function is `dbus_validate_member`.
    static func isValidMember(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_validate_member(s, nil) != 0 }
    /// The corresponding C function is `dbus_validate_error_name`.
    static func isValidErrorName(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_validate_error_name(s, nil) != 0 }
    /// The corresponding C function is `dbus_validate_bus_name`.
    static func isValidBusName(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_validate_bus_name(s, nil) != 0 }
    /// The corresponding C function is `dbus_signature_validate_single`.
    static func isValidSingleSignature(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_signature_validate_single(s, nil) != 0 }
    /// The corresponding C function is `dbus_signature_validate`.
    static func isValidSignature(_ s: String) -> Bool { !s.utf8.contains(0) && dbus_signature_validate(s, nil) != 0 }

    /// The longest array a message may hold, in bytes (DBUS_MAXIMUM_ARRAY_LENGTH, 64 MiB):
    /// libdbus aborts on a longer fixed array instead of failing.
    static let maxArrayBytes = 64 << 20

    static func require(_ ok: Bool, _ what: @autoclosure () -> String) throws(DBusError) {
        if !ok { throw DBusError.invalidArgs(what()) }
    }
}

// MARK: - Building message bodies

enum DBusCoding {
    /// Appends `values` to the body of `message`. Every value is validated first (element types
    /// match the array signature, object paths and signatures are valid, strings hold no NUL,
    /// descriptors are open), because libdbus aborts the process on invalid input instead of
    /// returning an error. After an error the message is unchanged; after `NoMemory` discard it.
    static func append(_ values: [DBusValue], to message: OpaquePointer) throws(DBusError) {
        for v in values { try validate(v) }
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(message, &iter)
        for v in values {
            if !appendValue(v, &iter) { throw DBusError.noMemory }
        }
    }

    /// `hasOwnSignature`: the value starts a signature of its own (an argument, or what a variant
    /// holds), which must be one valid complete type; inside an array, a dictionary or a struct the
    /// enclosing value's signature covers it.
    static func validate(_ value: DBusValue, depth: Int = 0, hasOwnSignature: Bool = true) throws(DBusError) {
        if depth > 64 { throw DBusError.invalidArgs("value nested too deeply") }
        switch value {
        case .byte, .bool, .int16, .uint16, .int32, .uint32, .int64, .uint64, .double:
            return
        case .bytes(let b):
            try LibDBus.require(b.count <= LibDBus.maxArrayBytes, "byte array of \(b.count) bytes (at most \(LibDBus.maxArrayBytes))")
        case .string(let s):
            try LibDBus.require(!s.utf8.contains(0), "string contains a NUL character")
        case .objectPath(let p):
            try LibDBus.require(LibDBus.isValidPath(p), "invalid object path '\(p)'")
        case .signature(let g):
            try LibDBus.require(LibDBus.isValidSignature(g), "invalid signature '\(g)'")
        case .unixFD(let fd):
            try LibDBus.require(fd.isValid, "file descriptor already closed or taken")
        case .array(let element, let items):
            try LibDBus.require(LibDBus.isValidSingleSignature(element) && !element.hasPrefix("{"),
                                "invalid array element signature '\(element)'")
            for item in items {
                let s = item.signature
                try LibDBus.require(s == element, "array element of type '\(s)' in an array of '\(element)'")
                try validate(item, depth: depth + 1, hasOwnSignature: false)
            }
        case .dictionary(let k, let v, let entries):
            try LibDBus.require(DBusSignature.isBasic(k), "dictionary key type '\(k)' is not basic")
            try LibDBus.require(LibDBus.isValidSingleSignature(v), "invalid dictionary value signature '\(v)'")
            for (key, val) in entries {
                try LibDBus.require(key.signature == k, "dictionary key of type '\(key.signature)', expected '\(k)'")
                try LibDBus.require(val.signature == v, "dictionary value of type '\(val.signature)', expected '\(v)'")
                try validate(key, depth: depth + 1, hasOwnSignature: false)
                try validate(val, depth: depth + 1, hasOwnSignature: false)
            }
        case .structure(let members):
            try LibDBus.require(!members.isEmpty, "empty struct")
            for m in members { try validate(m, depth: depth + 1, hasOwnSignature: false) }
        case .variant(let inner):
            // The variant's own signature is "v": what it holds has a signature of its own.
            try validate(inner, depth: depth + 1)
        }
        if hasOwnSignature {
            let s = value.signature
            try LibDBus.require(LibDBus.isValidSingleSignature(s), "invalid value signature '\(s)'")
        }
    }

    private static func appendBasic<T: BitwiseCopyable>(_ iter: inout DBusMessageIter, _ type: Int32, _ value: T) -> Bool {
        var v = value
        return dbus_message_iter_append_basic(&iter, type, &v) != 0
    }

    private static func appendString(_ iter: inout DBusMessageIter, _ type: Int32, _ s: String) -> Bool {
        s.withCString { c in
            var p: UnsafePointer<CChar>? = c
            return dbus_message_iter_append_basic(&iter, type, &p) != 0
        }
    }

    /// Opens a container, fills it, closes it; abandons it if filling fails.
    private static func container(
        _ iter: inout DBusMessageIter, _ type: Int32, _ signature: String?,
        _ fill: (inout DBusMessageIter) -> Bool
    ) -> Bool {
        var sub = DBusMessageIter()
        let opened: UInt32
        if let signature {
            opened = dbus_message_iter_open_container(&iter, type, signature, &sub)
        } else {
            opened = dbus_message_iter_open_container(&iter, type, nil, &sub)
        }
        if opened == 0 { return false }
        if !fill(&sub) {
            dbus_message_iter_abandon_container_if_open(&iter, &sub)
            return false
        }
        return dbus_message_iter_close_container(&iter, &sub) != 0
    }

    private static func appendValue(_ value: DBusValue, _ iter: inout DBusMessageIter) -> Bool {
        switch value {
        case .byte(let v): return appendBasic(&iter, CDBus_TYPE_BYTE, v)
        case .bool(let v): return appendBasic(&iter, CDBus_TYPE_BOOLEAN, dbus_bool_t(v ? 1 : 0))
        case .int16(let v): return appendBasic(&iter, CDBus_TYPE_INT16, v)
        case .uint16(let v): return appendBasic(&iter, CDBus_TYPE_UINT16, v)
        case .int32(let v): return appendBasic(&iter, CDBus_TYPE_INT32, v)
        case .uint32(let v): return appendBasic(&iter, CDBus_TYPE_UINT32, v)
        case .int64(let v): return appendBasic(&iter, CDBus_TYPE_INT64, v)
        case .uint64(let v): return appendBasic(&iter, CDBus_TYPE_UINT64, v)
        case .double(let v): return appendBasic(&iter, CDBus_TYPE_DOUBLE, v)
        case .string(let s): return appendString(&iter, CDBus_TYPE_STRING, s)
        case .objectPath(let s): return appendString(&iter, CDBus_TYPE_OBJECT_PATH, s)
        case .signature(let s): return appendString(&iter, CDBus_TYPE_SIGNATURE, s)
        case .unixFD(let fd):
            // libdbus duplicates the descriptor into the message; `fd` keeps its own copy.
            return appendBasic(&iter, CDBus_TYPE_UNIX_FD, fd.rawValue)
        case .bytes(let bytes):
            return container(&iter, CDBus_TYPE_ARRAY, "y") { sub in
                if bytes.isEmpty { return true }
                return bytes.withUnsafeBufferPointer { buffer in
                    // The third argument is the address of a pointer to the bytes (libdbus doc).
                    var p: UnsafePointer<UInt8>? = buffer.baseAddress
                    return dbus_message_iter_append_fixed_array(&sub, CDBus_TYPE_BYTE, &p, Int32(buffer.count)) != 0
                }
            }
        case .array(let element, let items):
            return container(&iter, CDBus_TYPE_ARRAY, element) { sub in
                for item in items where !appendValue(item, &sub) { return false }
                return true
            }
        case .dictionary(let k, let v, let entries):
            return container(&iter, CDBus_TYPE_ARRAY, "{" + k + v + "}") { sub in
                for (key, val) in entries {
                    let ok = container(&sub, CDBus_TYPE_DICT_ENTRY, nil) { entry in
                        appendValue(key, &entry) && appendValue(val, &entry)
                    }
                    if !ok { return false }
                }
                return true
            }
        case .structure(let members):
            return container(&iter, CDBus_TYPE_STRUCT, nil) { sub in
                for m in members where !appendValue(m, &sub) { return false }
                return true
            }
        case .variant(let inner):
            return container(&iter, CDBus_TYPE_VARIANT, inner.signature) { sub in
                appendValue(inner, &sub)
            }
        }
    }

    // MARK: - Reading message bodies

    /// Decodes the whole body of `message`. Each `h` read gives a new duplicate (owned by the
    /// returned ``OwnedFD``). Strings and `ay` contents are copied out of the message.
    static func read(_ message: OpaquePointer) -> [DBusValue] {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0 else { return [] }
        var out: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&iter) != CDBus_TYPE_INVALID {
            out.append(readValue(&iter))
            dbus_message_iter_next(&iter)
        }
        return out
    }

    /// See ``DBusMessage/scanArguments(bytes:entry:)``.
    static func scan(_ message: OpaquePointer, bytes: (Int, [UInt8]) -> Void, entry: (Int, String, DBusValue) -> Void) {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0 else { return }
        var index = 0
        var type = dbus_message_iter_get_arg_type(&iter)
        while type != CDBus_TYPE_INVALID {
            if type == CDBus_TYPE_ARRAY {
                var sub = DBusMessageIter()
                dbus_message_iter_recurse(&iter, &sub)
                switch dbus_message_iter_get_element_type(&iter) {
                case CDBus_TYPE_BYTE:
                    bytes(index, readBytes(&sub))
                case CDBus_TYPE_DICT_ENTRY:
                    while dbus_message_iter_get_arg_type(&sub) == CDBus_TYPE_DICT_ENTRY {
                        var e = DBusMessageIter()
                        dbus_message_iter_recurse(&sub, &e)
                        guard dbus_message_iter_get_arg_type(&e) == CDBus_TYPE_STRING else { break }
                        let key = readString(&e)
                        dbus_message_iter_next(&e)
                        // Into the variant(s) at once: no box for a value that is unwrapped anyway.
                        var v = e
                        while dbus_message_iter_get_arg_type(&v) == CDBus_TYPE_VARIANT {
                            var inner = DBusMessageIter()
                            dbus_message_iter_recurse(&v, &inner)
                            v = inner
                        }
                        // Only basic values are read: a container is skipped unread, so that an
                        // option nobody asked for (tens of MB are allowed in one message) costs
                        // nothing. A descriptor would only be duplicated to be closed again.
                        let type = dbus_message_iter_get_arg_type(&v)
                        if dbus_type_is_basic(type) != 0 && type != CDBus_TYPE_UNIX_FD {
                            entry(index, key, readValue(&v))
                        }
                        dbus_message_iter_next(&sub)
                    }
                default:
                    break
                }
            }
            index += 1
            dbus_message_iter_next(&iter)
            type = dbus_message_iter_get_arg_type(&iter)
        }
    }

    /// The contents of an `ay` under `sub` (the array's recursed iterator), copied.
    private static func readBytes(_ sub: inout DBusMessageIter) -> [UInt8] {
        var p: UnsafeRawPointer? = nil
        var n: Int32 = 0
        dbus_message_iter_get_fixed_array(&sub, &p, &n)
        guard let p, n > 0 else { return [] }
        // The pointer borrows from the message: copy.
        return Array(UnsafeRawBufferPointer(start: p, count: Int(n)))
    }

    /// The first argument if it is a string (cheap: decodes nothing else).
    static func firstString(_ message: OpaquePointer) -> String? {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0,
              dbus_message_iter_get_arg_type(&iter) == CDBus_TYPE_STRING else { return nil }
        return readString(&iter)
    }

    private static func readBasic<T: BitwiseCopyable>(_ iter: inout DBusMessageIter, _ initial: T) -> T {
        var v = initial
        dbus_message_iter_get_basic(&iter, &v)
        return v
    }

    private static func readString(_ iter: inout DBusMessageIter) -> String {
        var p: UnsafePointer<CChar>? = nil
        dbus_message_iter_get_basic(&iter, &p)
        return p.map { String(cString: $0) } ?? ""
    }

    /// Runs `body` with the signature of the value under the iterator (ASCII; libdbus allocates
    /// it, and frees it after).
    private static func withCurrentSignature<R>(_ iter: inout DBusMessageIter, _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        guard let s = dbus_message_iter_get_signature(&iter) else { return body(UnsafeBufferPointer(start: nil, count: 0)) }
        defer { dbus_free(s) }
        var count = 0
        while s[count] != 0 { count += 1 }
        return s.withMemoryRebound(to: UInt8.self, capacity: count) { body(UnsafeBufferPointer(start: $0, count: count)) }
    }

    private static func readValue(_ iter: inout DBusMessageIter) -> DBusValue {
        let type = dbus_message_iter_get_arg_type(&iter)
        switch type {
        case CDBus_TYPE_BYTE: return .byte(readBasic(&iter, UInt8(0)))
        case CDBus_TYPE_BOOLEAN: return .bool(readBasic(&iter, dbus_bool_t(0)) != 0)
        case CDBus_TYPE_INT16: return .int16(readBasic(&iter, Int16(0)))
        case CDBus_TYPE_UINT16: return .uint16(readBasic(&iter, UInt16(0)))
        case CDBus_TYPE_INT32: return .int32(readBasic(&iter, Int32(0)))
        case CDBus_TYPE_UINT32: return .uint32(readBasic(&iter, UInt32(0)))
        case CDBus_TYPE_INT64: return .int64(readBasic(&iter, Int64(0)))
        case CDBus_TYPE_UINT64: return .uint64(readBasic(&iter, UInt64(0)))
        case CDBus_TYPE_DOUBLE: return .double(readBasic(&iter, Double(0)))
        case CDBus_TYPE_STRING: return .string(readString(&iter))
        case CDBus_TYPE_OBJECT_PATH: return .objectPath(readString(&iter))
        case CDBus_TYPE_SIGNATURE: return .signature(readString(&iter))
        case CDBus_TYPE_UNIX_FD:
            // libdbus returns a new duplicate (close-on-exec) on every read, or -1 if dup failed.
            return .unixFD(OwnedFD(taking: readBasic(&iter, Int32(-1))))
        case CDBus_TYPE_VARIANT:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return .variant(readValue(&sub))
        case CDBus_TYPE_STRUCT:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            var members: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != CDBus_TYPE_INVALID {
                members.append(readValue(&sub))
                dbus_message_iter_next(&sub)
            }
            return .structure(members)
        case CDBus_TYPE_ARRAY:
            return readArray(&iter)
        default:
            // Unreachable for messages libdbus has validated (it knows no other types).
            return .structure([])
        }
    }

    private static func readArray(_ iter: inout DBusMessageIter) -> DBusValue {
        let elementType = dbus_message_iter_get_element_type(&iter)
        var sub = DBusMessageIter()
        dbus_message_iter_recurse(&iter, &sub)
        if elementType == CDBus_TYPE_BYTE { return .bytes(readBytes(&sub)) }
        // The array's own signature is "a<element>"; for dict entries "a{<key><value>}", the key
        // one basic type code.
        let (element, key, value) = withCurrentSignature(&iter) { sig in
            func part(_ from: Int, _ to: Int) -> String {
                from < to ? String(decoding: UnsafeBufferPointer(rebasing: sig[from..<to]), as: UTF8.self) : ""
            }
            return elementType == CDBus_TYPE_DICT_ENTRY
                ? ("", part(2, min(3, sig.count)), part(3, sig.count - 1))
                : (part(1, sig.count), "", "")
        }
        if elementType == CDBus_TYPE_DICT_ENTRY {
            var entries: [(key: DBusValue, value: DBusValue)] = []
            while dbus_message_iter_get_arg_type(&sub) != CDBus_TYPE_INVALID {
                var entry = DBusMessageIter()
                dbus_message_iter_recurse(&sub, &entry)
                let k = readValue(&entry)
                dbus_message_iter_next(&entry)
                let v = readValue(&entry)
                entries.append((key: k, value: v))
                dbus_message_iter_next(&sub)
            }
            return .dictionary(keySignature: key, valueSignature: value, entries)
        }
        var items: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&sub) != CDBus_TYPE_INVALID {
            items.append(readValue(&sub))
            dbus_message_iter_next(&sub)
        }
        return .array(elementSignature: element, items)
    }
}
