/// Cuts a byte stream into writes the way the seed iOS client does when the stream is frames: no
/// frame header is ever split between two writes. The seed's bleno server reads a header only
/// from within one write (a write whose bytes end inside a header loses them, and everything
/// after, until a write starts with a header again); bodies may span writes.
///
/// The stream is taken for frames as long as every header found is valid (a code byte N, T, U or
/// I and seven decimal digits); from the first one that is not, it is cut anywhere.
///
///     var cutter = FrameCutter()
///     let n = cutter.nextWrite(pending, limit: 510)   // 0: a header is not complete yet
///     …write pending[0..<n]…
///     cutter.consume(pending[0..<n])
public struct FrameCutter: Sendable {
    /// Still following frames: no invalid header met.
    public private(set) var isFrames = true
    /// Body bytes of the current frame not yet consumed (0: a header comes next).
    private var bodyLeft = 0

    public init() {}

    /// How many leading bytes of `pending` (the stream from the end of the last write on) to
    /// write next: at most `limit`, and never ending inside a header. 0 when `pending` begins
    /// with the start of a header that has not all come yet: wait for more input (at the end of
    /// the input, write what there is).
    public func nextWrite(_ pending: UnsafeRawBufferPointer, limit: Int) -> Int {
        let n = min(limit, pending.count)
        guard isFrames, limit >= FrameFormat.headerSize else { return n }
        var position = 0
        var left = bodyLeft
        while true {
            if left >= n - position { return n }  // the rest of this write is body
            position += left
            left = 0
            if position == n { return n }  // the write ends where a frame does
            // A header starts at `position`.
            if position + FrameFormat.headerSize > n {
                // It would be cut by the end of this write. What of it is there must look like a
                // header (else this is not frames, and typed text such as "Uptime" goes at once).
                let there = UnsafeRawBufferPointer(rebasing: pending[position..<min(pending.count, position + FrameFormat.headerSize)])
                guard Self.couldBeHeader(there) else { return n }
                // End the write before it, or, when it is the write's first byte (so not all of
                // it has come yet), wait.
                return position
            }
            guard let size = Self.bodySize(header: UnsafeRawBufferPointer(rebasing: pending[position..<position + FrameFormat.headerSize])) else {
                return n  // not frames: `consume` will see it too
            }
            position += FrameFormat.headerSize
            left = size
        }
    }

    /// Records that `written` (the bytes `nextWrite` allowed, or at the end of the input the
    /// rest) went out.
    public mutating func consume(_ written: UnsafeRawBufferPointer) {
        var position = 0
        while isFrames && position < written.count {
            if bodyLeft > 0 {
                let k = min(bodyLeft, written.count - position)
                bodyLeft -= k
                position += k
                continue
            }
            guard position + FrameFormat.headerSize <= written.count,
                  let size = Self.bodySize(header: UnsafeRawBufferPointer(rebasing: written[position..<position + FrameFormat.headerSize])) else {
                isFrames = false
                return
            }
            position += FrameFormat.headerSize
            bodyLeft = size
        }
    }

    /// Whether `bytes` (at most a header's length) are a header or the start of one.
    static func couldBeHeader(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let first = bytes.first, FrameCode(rawValue: first) != nil else { return false }
        return bytes.dropFirst().allSatisfy { FrameDecoder.digit($0) != nil }
    }

    /// The body size a valid header announces, or nil.
    static func bodySize(header: UnsafeRawBufferPointer) -> Int? {
        guard header.count == FrameFormat.headerSize, FrameCode(rawValue: header[0]) != nil else { return nil }
        var size = 0
        for byte in header[1...] {
            guard let d = FrameDecoder.digit(byte) else { return nil }
            size = size * 10 + d
        }
        return size
    }
}
