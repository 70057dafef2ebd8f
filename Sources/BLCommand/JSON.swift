/// Minimal JSON output for the tools' `--json` modes: one object per line, built from ordered
/// fields. Strings are escaped per RFC 8259; bytes that are not valid UTF-8 become U+FFFD.
public struct JSONObject {
    private var text = "{"
    private var first = true

    public init() {}

    private mutating func key(_ name: String) {
        if !first { text += "," }
        first = false
        text += JSON.quoted(name) + ":"
    }

    public mutating func add(_ name: String, _ value: String) {
        key(name)
        text += JSON.quoted(value)
    }

    public mutating func add(_ name: String, _ value: Int) {
        key(name)
        text += String(value)
    }

    public mutating func add(_ name: String, _ value: Bool) {
        key(name)
        text += value ? "true" : "false"
    }

    public mutating func add(_ name: String, _ values: [String]) {
        key(name)
        text += "[" + values.map(JSON.quoted).joined(separator: ",") + "]"
    }

    /// Adds a value that is already JSON text.
    public mutating func add(_ name: String, raw json: String) {
        key(name)
        text += json
    }

    /// The object's text, without a newline.
    public var json: String { text + "}" }
}

public enum JSON {
    /// `value` as a JSON string literal, quotes included.
    public static func quoted(_ value: String) -> String {
        var escaper = JSONStringEscaper()
        var out: [UInt8] = [0x22]
        out.reserveCapacity(value.utf8.count + 2)
        var copy = value
        copy.withUTF8 { escaper.escape(UnsafeRawBufferPointer($0)) { out.append(contentsOf: $0) } }
        escaper.finish { out.append(contentsOf: $0) }
        out.append(0x22)
        return String(decoding: out, as: UTF8.self)
    }
}

/// Escapes arbitrary bytes into the inside of a JSON string, piece by piece: a UTF-8 sequence split
/// across two pieces is carried over, so the output does not depend on how the input was cut.
public struct JSONStringEscaper {
    /// Bytes of an incomplete UTF-8 sequence from the end of the previous piece.
    private var carry: [UInt8] = []

    public init() {}

    /// Escapes `bytes`, handing the output to `emit` in runs (pointers valid only during the call).
    public mutating func escape(_ bytes: UnsafeRawBufferPointer, _ emit: (UnsafeRawBufferPointer) -> Void) {
        var input = bytes
        if !carry.isEmpty {
            // Complete the carried sequence with as few bytes as it needs.
            let length = JSONStringEscaper.sequenceLength(carry[0])
            var taken = 0
            while carry.count < length && taken < input.count
                    && JSONStringEscaper.acceptsNext(carry[0], at: carry.count, input[taken]) {
                carry.append(input[taken])
                taken += 1
            }
            if carry.count < length && taken == input.count {
                return  // still incomplete; wait for more
            }
            input = UnsafeRawBufferPointer(rebasing: input[taken...])
            let done = carry
            carry = []
            done.withUnsafeBytes { emitValidated($0, final: true, emit) }
        }
        emitValidated(input, final: false, emit)
    }

    /// Ends the string: an incomplete trailing sequence becomes U+FFFD.
    public mutating func finish(_ emit: (UnsafeRawBufferPointer) -> Void) {
        if !carry.isEmpty {
            carry = []
            JSONStringEscaper.replacement.withUnsafeBytes(emit)
        }
    }

    static let replacement: [UInt8] = [0xEF, 0xBF, 0xBD]
    static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    static func isContinuation(_ byte: UInt8) -> Bool { byte & 0xC0 == 0x80 }

    /// Length of the sequence a lead byte announces; 0 for a byte that cannot lead one.
    static func sequenceLength(_ lead: UInt8) -> Int {
        switch lead {
        case 0x00...0x7F: 1
        case 0xC2...0xDF: 2
        case 0xE0...0xEF: 3
        case 0xF0...0xF4: 4
        default: 0
        }
    }

    /// Whether `byte` may stand at position `k` (1 or more) of a sequence led by `lead`: the
    /// second byte's range rules out overlong forms, surrogates and code points past U+10FFFF.
    static func acceptsNext(_ lead: UInt8, at k: Int, _ byte: UInt8) -> Bool {
        if k >= 2 { return isContinuation(byte) }
        switch lead {
        case 0xE0: return (0xA0...0xBF).contains(byte)
        case 0xED: return (0x80...0x9F).contains(byte)
        case 0xF0: return (0x90...0xBF).contains(byte)
        case 0xF4: return (0x80...0x8F).contains(byte)
        default: return isContinuation(byte)
        }
    }

    /// How many bytes from `i` begin a valid sequence (its whole length when it is complete
    /// and valid); 0 for a byte that cannot lead one.
    static func validPrefix(_ p: UnsafeRawBufferPointer, at i: Int) -> Int {
        let lead = p[i]
        let length = sequenceLength(lead)
        guard length > 1 else { return length }
        var k = 1
        while k < length && i + k < p.count && acceptsNext(lead, at: k, p[i + k]) { k += 1 }
        return k
    }

    /// Validates one complete sequence starting at `i`; returns its length or 0 when invalid.
    static func validSequence(_ p: UnsafeRawBufferPointer, at i: Int) -> Int {
        let length = sequenceLength(p[i])
        return length > 0 && validPrefix(p, at: i) == length ? length : 0
    }

    private mutating func emitValidated(_ p: UnsafeRawBufferPointer, final: Bool, _ emit: (UnsafeRawBufferPointer) -> Void) {
        var runStart = 0
        var i = 0
        func flushRun(upTo end: Int) {
            if end > runStart { emit(UnsafeRawBufferPointer(rebasing: p[runStart..<end])) }
        }
        while i < p.count {
            let byte = p[i]
            if byte >= 0x20 && byte != 0x22 && byte != 0x5C && byte < 0x80 {
                i += 1
                continue
            }
            if byte >= 0x80 {
                let length = JSONStringEscaper.sequenceLength(byte)
                let prefix = JSONStringEscaper.validPrefix(p, at: i)
                if length > 1 && prefix == length {
                    i += length
                    continue
                }
                if length > 1 && i + prefix == p.count && !final {
                    // A sequence cut by the piece's end, valid so far: the next piece completes it.
                    flushRun(upTo: i)
                    carry = Array(UnsafeRawBufferPointer(rebasing: p[i...]))
                    return
                }
                // One U+FFFD for each maximal part of a sequence that cannot be completed (the
                // usual practice: a lead byte and the continuations valid after it, or one byte).
                flushRun(upTo: i)
                JSONStringEscaper.replacement.withUnsafeBytes(emit)
                i += max(1, prefix)
                runStart = i
                continue
            }
            flushRun(upTo: i)
            var escaped: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0x5C, 0, 0, 0, 0, 0)
            var count = 2
            switch byte {
            case 0x22: escaped.1 = 0x22
            case 0x5C: escaped.1 = 0x5C
            case 0x0A: escaped.1 = 0x6E  // \n
            case 0x0D: escaped.1 = 0x72  // \r
            case 0x09: escaped.1 = 0x74  // \t
            default:
                escaped.1 = 0x75  // \u00XX
                escaped.2 = 0x30
                escaped.3 = 0x30
                escaped.4 = JSONStringEscaper.hex[Int(byte >> 4)]
                escaped.5 = JSONStringEscaper.hex[Int(byte & 0xF)]
                count = 6
            }
            withUnsafeBytes(of: &escaped) { emit(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
            i += 1
            runStart = i
        }
        flushRun(upTo: i)
    }
}

/// A byte as two lower-case hexadecimal digits ("0e"), for messages.
public func hexDigits(_ byte: UInt8) -> String {
    String(decoding: [JSONStringEscaper.hex[Int(byte >> 4)], JSONStringEscaper.hex[Int(byte & 0xF)]], as: UTF8.self)
}
