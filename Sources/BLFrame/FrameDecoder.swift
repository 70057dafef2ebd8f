/// The header of one frame: its code and body size.
public struct FrameHeader: Equatable, Sendable {
    public var code: FrameCode
    public var size: Int
    public init(code: FrameCode, size: Int) {
        self.code = code
        self.size = size
    }
}

/// An incremental frame decoder.
///
/// Feed it chunks of any size; it hands out events that do not depend on how the input was chunked
/// (only the number and length of `.body` pieces do). Bodies are never buffered: a `.body` event
/// points into the chunk being decoded, so a 9,999,999-byte frame passes through in pieces.
///
///     var decoder = FrameDecoder()
///     var input = UnsafeRawBufferPointer(chunk)
///     while let event = try decoder.next(&input) { … }   // nil: the chunk is used up
///     …
///     try decoder.finish()                               // at end of input
///
/// Errors are `FrameError` values carrying the stream offset of the offending byte. After an error
/// the decoder is spent; make a new one to start over.
public struct FrameDecoder: Sendable {
    public enum Event {
        /// A header was read. `.body` pieces (none when the size is 0) and `.frameEnd` follow.
        case frameStart(FrameHeader)
        /// The next piece of the current body. It points into the input chunk: use or copy it
        /// before the chunk's memory goes away.
        case body(UnsafeRawBufferPointer)
        /// The current frame is complete.
        case frameEnd(FrameHeader)
        /// Resync mode only: this many bytes that did not form a valid header were skipped just
        /// before the frame that starts next.
        case skipped(Int)
    }

    /// The largest body accepted; a larger announced size is an error.
    public let maxBodySize: Int
    /// When true, bytes that do not start a valid header are skipped (and reported by `.skipped`)
    /// instead of being an error.
    public let resync: Bool

    /// Bytes consumed so far, i.e. the stream offset of the next input byte.
    public private(set) var offset: Int = 0
    /// Stream offset where the current (or last) frame's header started.
    public private(set) var frameOffset: Int = 0
    /// Frames completed so far.
    public private(set) var framesDecoded: Int = 0

    private enum State: Sendable {
        case header          // collecting header bytes into `pending`
        case body(FrameHeader, remaining: Int)
        case end(FrameHeader)
    }

    private var state: State = .header
    /// Header bytes collected so far (the first `pendingCount` bytes matter).
    private var pending: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0, 0)
    private var pendingCount = 0
    /// Resync: bytes skipped since the last frame and not yet reported.
    private var skippedPending = 0
    private var frameStartQueued: FrameHeader?
    private var failed = false

    public init(maxBodySize: Int = FrameFormat.maxBodySize, resync: Bool = false) {
        precondition(maxBodySize >= 0 && maxBodySize <= FrameFormat.maxBodySize, "maxBodySize out of range")
        self.maxBodySize = maxBodySize
        self.resync = resync
    }

    /// True between frames: nothing of a next frame has been read yet.
    public var isAtFrameBoundary: Bool {
        if case .header = state { return pendingCount == 0 && frameStartQueued == nil }
        return false
    }

    /// Decodes the next event from `input`, advancing it past the bytes consumed.
    /// Returns nil when `input` is used up and more data is needed.
    public mutating func next(_ input: inout UnsafeRawBufferPointer) throws(FrameError) -> Event? {
        precondition(!failed, "FrameDecoder used after an error")
        if let header = frameStartQueued {
            frameStartQueued = nil
            return startFrame(header)
        }
        while true {
            switch state {
            case .end(let header):
                state = .header
                framesDecoded += 1
                return .frameEnd(header)
            case .body(let header, let remaining):
                if remaining == 0 {
                    state = .end(header)
                    continue
                }
                if input.isEmpty { return nil }
                let n = min(remaining, input.count)
                let piece = UnsafeRawBufferPointer(rebasing: input[0..<n])
                input = UnsafeRawBufferPointer(rebasing: input[n...])
                offset += n
                state = .body(header, remaining: remaining - n)
                return .body(piece)
            case .header:
                if input.isEmpty { return nil }
                if pendingCount == 0 && input.count >= FrameFormat.headerSize,
                   let header = try parseWholeHeader(input) {
                    // Fast path: the whole header is in this chunk.
                    input = UnsafeRawBufferPointer(rebasing: input[FrameFormat.headerSize...])
                    frameOffset = offset
                    offset += FrameFormat.headerSize
                    if let event = announce(header) { return event }
                    continue
                }
                // Slow path: one byte at a time into `pending`.
                let byte = input[0]
                input = UnsafeRawBufferPointer(rebasing: input[1...])
                offset += 1
                if let header = try acceptHeaderByte(byte) {
                    frameOffset = offset - FrameFormat.headerSize
                    if let event = announce(header) { return event }
                }
            }
        }
    }

    /// Call at end of input. Throws if the input ended inside a frame. Returns the number of
    /// trailing bytes skipped in resync mode.
    @discardableResult
    public mutating func finish() throws(FrameError) -> Int {
        if let header = frameStartQueued {
            // Only reachable if the caller stopped calling next() mid-stream.
            throw fail(.truncatedBody(code: header.code, have: 0, size: header.size), at: offset)
        }
        switch state {
        case .header:
            if pendingCount > 0 {
                throw fail(.truncatedHeader(have: pendingCount, skipped: skippedPending), at: offset)
            }
        case .body(let header, let remaining):
            throw fail(.truncatedBody(code: header.code, have: header.size - remaining, size: header.size), at: offset)
        case .end:
            // The body is complete; the caller simply has not collected `.frameEnd`.
            break
        }
        let skipped = skippedPending
        skippedPending = 0
        return skipped
    }

    // MARK: - Internals

    private mutating func fail(_ kind: FrameError.Kind, at offset: Int) -> FrameError {
        failed = true
        return FrameError(kind, at: offset)
    }

    /// Switches to the body of `header` and returns the event(s) to report.
    private mutating func announce(_ header: FrameHeader) -> Event? {
        if skippedPending > 0 {
            let skipped = skippedPending
            skippedPending = 0
            frameStartQueued = header
            return .skipped(skipped)
        }
        return startFrame(header)
    }

    private mutating func startFrame(_ header: FrameHeader) -> Event {
        state = .body(header, remaining: header.size)
        return .frameStart(header)
    }

    @inline(__always)
    static func digit(_ byte: UInt8) -> Int? {
        let d = byte &- 0x30
        return d < 10 ? Int(d) : nil
    }

    /// Parses 8 header bytes at the start of `input` (pendingCount == 0). Returns nil when resync
    /// mode must take the byte-by-byte path to skip garbage.
    private mutating func parseWholeHeader(_ input: UnsafeRawBufferPointer) throws(FrameError) -> FrameHeader? {
        guard let code = FrameCode(rawValue: input[0]) else {
            if resync { return nil }
            throw fail(.unknownCode(input[0]), at: offset)
        }
        var size = 0
        for i in 1...FrameFormat.sizeDigits {
            guard let d = FrameDecoder.digit(input[i]) else {
                if resync { return nil }
                throw fail(.badSizeDigit(input[i]), at: offset + i)
            }
            size = size * 10 + d
        }
        return try validate(code: code, size: size, headerOffset: offset)
    }

    /// Checks a complete header's size. In resync mode an N frame with a body counts as garbage.
    private mutating func validate(code: FrameCode, size: Int, headerOffset: Int) throws(FrameError) -> FrameHeader? {
        if code == .notify && size != 0 {
            if resync { return nil }
            throw fail(.notifyWithBody(size: size), at: headerOffset + 1)
        }
        if size > maxBodySize {
            throw fail(.tooLarge(size: size, limit: maxBodySize), at: headerOffset + 1)
        }
        return FrameHeader(code: code, size: size)
    }

    private func pendingByte(_ i: Int) -> UInt8 {
        withUnsafeBytes(of: pending) { $0[i] }
    }

    private mutating func setPendingByte(_ i: Int, _ byte: UInt8) {
        withUnsafeMutableBytes(of: &pending) { $0[i] = byte }
    }

    /// Adds one header byte. Returns the header once all 8 bytes are in and valid.
    private mutating func acceptHeaderByte(_ byte: UInt8) throws(FrameError) -> FrameHeader? {
        let byteOffset = offset - 1
        if pendingCount == 0 {
            guard FrameCode(rawValue: byte) != nil else {
                if resync {
                    skippedPending += 1
                    return nil
                }
                throw fail(.unknownCode(byte), at: byteOffset)
            }
            setPendingByte(0, byte)
            pendingCount = 1
            return nil
        }
        guard FrameDecoder.digit(byte) != nil else {
            if !resync { throw fail(.badSizeDigit(byte), at: byteOffset) }
            // Bytes 1..<pendingCount were digits, so none of them can start a header. This byte
            // can, if it is a code letter.
            if FrameCode(rawValue: byte) != nil {
                skippedPending += pendingCount
                setPendingByte(0, byte)
                pendingCount = 1
            } else {
                skippedPending += pendingCount + 1
                pendingCount = 0
            }
            return nil
        }
        setPendingByte(pendingCount, byte)
        pendingCount += 1
        guard pendingCount == FrameFormat.headerSize else { return nil }
        pendingCount = 0
        var size = 0
        for i in 1...FrameFormat.sizeDigits { size = size * 10 + Int(pendingByte(i) &- 0x30) }
        let code = FrameCode(rawValue: pendingByte(0))!
        if let header = try validate(code: code, size: size, headerOffset: offset - FrameFormat.headerSize) {
            return header
        }
        // Resync: an N header with a size. Its code byte is garbage; the digits cannot start a
        // header either.
        skippedPending += FrameFormat.headerSize
        return nil
    }
}
