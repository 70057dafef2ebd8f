#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A fixed-size output buffer for a blocking descriptor, allocated once.
///
/// Small writes are gathered and go out in one `write(2)`; a write at least as large as the buffer
/// bypasses it (after flushing what is pending), so large bodies are never copied. The caller
/// decides when to `flush()`; the tools flush after each input chunk so pipes stay interactive.
public final class OutputBuffer {
    public let fd: Int32
    private let storage: UnsafeMutableRawBufferPointer
    private var used = 0
    /// Total bytes handed to the kernel so far.
    public private(set) var bytesWritten = 0

    /// `capacity` is at least ``directThreshold``: a smaller write is copied into the buffer.
    public init(fd: Int32, capacity: Int = 128 * 1024) {
        self.fd = fd
        storage = .allocate(byteCount: max(capacity, OutputBuffer.directThreshold), alignment: FileIO.bufferAlignment)
    }

    deinit { storage.deallocate() }

    public var pendingCount: Int { used }

    /// Writes of at least this many bytes skip the copy into the buffer: what is pending and the
    /// new bytes leave together in one writev(2).
    public static let directThreshold = 16 * 1024

    /// Appends bytes; large writes go straight to the descriptor together with what is pending.
    public func write(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        if bytes.count < OutputBuffer.directThreshold && bytes.count <= capacityLeft {
            append(bytes)
            return
        }
        if bytes.count < OutputBuffer.directThreshold {
            try flush()
            append(bytes)
            return
        }
        let pending = UnsafeRawBufferPointer(rebasing: storage[0..<used])
        used = 0
        try FileIO.writeAll(fd, pending, bytes)
        bytesWritten += pending.count + bytes.count
    }

    public func write(_ bytes: [UInt8]) throws(Errno) {
        try bytes.withUnsafeBytes { raw in Result { () throws(Errno) in try write(raw) } }.get()
    }

    public func write(_ text: String) throws(Errno) {
        var text = text
        try text.withUTF8 { utf8 in Result { () throws(Errno) in try write(UnsafeRawBufferPointer(utf8)) } }.get()
    }

    public func write(byte: UInt8) throws(Errno) {
        if capacityLeft == 0 { try flush() }
        storage[used] = byte
        used += 1
    }

    /// Writes everything pending.
    public func flush() throws(Errno) {
        guard used > 0 else { return }
        let pending = UnsafeRawBufferPointer(rebasing: storage[0..<used])
        used = 0
        try FileIO.writeAll(fd, pending)
        bytesWritten += pending.count
    }

    var capacity: Int { storage.count }
    var capacityLeft: Int { storage.count - used }

    func append(_ bytes: UnsafeRawBufferPointer) {
        guard let source = bytes.baseAddress, bytes.count > 0 else { return }
        (storage.baseAddress! + used).copyMemory(from: source, byteCount: bytes.count)
        used += bytes.count
    }
}
