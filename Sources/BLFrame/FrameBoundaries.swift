/// Follows a byte stream of frames without keeping any of it, to tell whether the stream so far
/// ends inside a frame.
///
/// blrecv uses it to recognise blserve's announcement of a reply tail waiting in the read queue
/// (an empty notification in the middle of a pushed frame). The stream must be frames from its
/// first byte: at the first byte that cannot start a frame, or a size digit that is not a digit,
/// the tracker stops following (``isFollowing`` false) for good, so a stream of other bytes never
/// looks like it is inside a frame. Bodies are skipped by count, not byte by byte.
public struct FrameBoundaries: Sendable {
    /// False once the stream turned out not to be frames.
    public private(set) var isFollowing = true
    /// Header bytes seen of the frame being read (0 between frames).
    private var headerBytes = 0
    private var size = 0
    /// Body bytes still to come.
    private var remaining = 0

    public init() {}

    /// True when the bytes so far end inside a frame: in its header, or before the end of its
    /// body.
    public var isInsideFrame: Bool { isFollowing && (headerBytes > 0 || remaining > 0) }

    /// Follows `bytes`, the next part of the stream.
    public mutating func consume(_ bytes: UnsafeRawBufferPointer) {
        var index = 0
        let count = bytes.count
        while isFollowing && index < count {
            if remaining > 0 {
                let take = min(remaining, count - index)
                remaining -= take
                index += take
                continue
            }
            let byte = bytes[index]
            index += 1
            if headerBytes == 0 {
                guard FrameCode(rawValue: byte) != nil else {
                    isFollowing = false
                    return
                }
                headerBytes = 1
                size = 0
                continue
            }
            guard byte >= 0x30 && byte <= 0x39 else {
                isFollowing = false
                return
            }
            size = size * 10 + Int(byte - 0x30)
            headerBytes += 1
            if headerBytes == FrameFormat.headerSize {
                headerBytes = 0
                remaining = size
            }
        }
    }

    /// Follows `bytes`, the next part of the stream.
    public mutating func consume(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { consume($0) }
    }
}
