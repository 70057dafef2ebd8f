/// Frame encoding: a header for a known size, a whole frame for a body in memory, and a checked
/// streaming encoder for a body whose size is known up front.
public enum FrameEncoder {
    /// Writes the 8 header bytes for `code` and `size` at `destination`.
    /// - Precondition: `0 ≤ size ≤ 9,999,999`, and `size == 0` for `N`.
    @inlinable
    public static func writeHeader(_ code: FrameCode, size: Int, to destination: UnsafeMutableRawPointer) {
        precondition(size >= 0 && size <= FrameFormat.maxBodySize, "frame size out of range")
        destination.storeBytes(of: code.rawValue, as: UInt8.self)
        var rest = size
        var i = FrameFormat.sizeDigits
        while i >= 1 {
            destination.storeBytes(of: UInt8(0x30 + rest % 10), toByteOffset: i, as: UInt8.self)
            rest /= 10
            i -= 1
        }
    }

    /// Checks that a body of `size` bytes can be framed with `code`.
    public static func check(_ code: FrameCode, size: Int, limit: Int = FrameFormat.maxBodySize) throws(FrameError) {
        if size > limit { throw FrameError(.tooLarge(size: size, limit: limit), at: 0) }
        if code == .notify && size != 0 { throw FrameError(.notifyWithBody(size: size), at: 0) }
    }

    /// The 8 header bytes for `code` and `size`.
    public static func header(_ code: FrameCode, size: Int) throws(FrameError) -> [UInt8] {
        try check(code, size: size)
        return [UInt8](unsafeUninitializedCapacity: FrameFormat.headerSize) { buffer, count in
            writeHeader(code, size: size, to: UnsafeMutableRawPointer(buffer.baseAddress!))
            count = FrameFormat.headerSize
        }
    }

    /// A whole frame: header plus `body`.
    public static func encode(_ code: FrameCode, body: UnsafeRawBufferPointer) throws(FrameError) -> [UInt8] {
        try check(code, size: body.count)
        let total = FrameFormat.headerSize + body.count
        return [UInt8](unsafeUninitializedCapacity: total) { buffer, count in
            let base = UnsafeMutableRawPointer(buffer.baseAddress!)
            writeHeader(code, size: body.count, to: base)
            if let source = body.baseAddress, body.count > 0 {
                (base + FrameFormat.headerSize).copyMemory(from: source, byteCount: body.count)
            }
            count = total
        }
    }

    /// A whole frame: header plus `body`.
    public static func encode(_ code: FrameCode, body: some Collection<UInt8>) throws(FrameError) -> [UInt8] {
        let bytes = Array(body)
        return try bytes.withUnsafeBytes { raw in Result { () throws(FrameError) in try encode(code, body: raw) } }.get()
    }
}

/// Encodes one frame whose body arrives in pieces and whose size is known before the first piece.
/// It refuses more bytes than announced, and `finish()` refuses fewer, so a frame that would
/// desynchronise the stream is never completed.
public struct StreamingFrameEncoder: Sendable {
    public let header: FrameHeader
    /// Body bytes still expected.
    public private(set) var remaining: Int

    /// - Throws: `.tooLarge` or `.notifyWithBody` when `size` cannot be framed with `code`.
    public init(_ code: FrameCode, size: Int, limit: Int = FrameFormat.maxBodySize) throws(FrameError) {
        try FrameEncoder.check(code, size: size, limit: limit)
        header = FrameHeader(code: code, size: size)
        remaining = size
    }

    /// The header bytes to send first.
    public var headerBytes: [UInt8] {
        // `init` validated the size, so this cannot fail.
        [UInt8](unsafeUninitializedCapacity: FrameFormat.headerSize) { buffer, count in
            FrameEncoder.writeHeader(header.code, size: header.size, to: UnsafeMutableRawPointer(buffer.baseAddress!))
            count = FrameFormat.headerSize
        }
    }

    /// Accounts for the next `count` body bytes, which the caller sends as they are.
    /// - Throws: `.tooLarge` when they would exceed the announced size (nothing is accounted).
    public mutating func accept(_ count: Int) throws(FrameError) {
        guard count <= remaining else {
            throw FrameError(.tooLarge(size: header.size - remaining + count, limit: header.size),
                             at: FrameFormat.headerSize + header.size - remaining)
        }
        remaining -= count
    }

    /// Call when the body source ends. Throws `.truncatedBody` if fewer bytes came than announced.
    public func finish() throws(FrameError) {
        if remaining != 0 {
            throw FrameError(.truncatedBody(code: header.code, have: header.size - remaining, size: header.size),
                             at: FrameFormat.headerSize + header.size - remaining)
        }
    }
}
