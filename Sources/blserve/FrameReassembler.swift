import BLBlueZ
import BLCommand
import BLDBus
import BLFrame

/// One complete frame written by a central.
struct FrameRequest: Equatable {
    var code: FrameCode
    var body: [UInt8]
}

/// Why a write was refused, and the ATT error the central gets for it.
enum WriteRefusal: Error, Equatable, CustomStringConvertible {
    /// The header announced a body larger than --max-frame.
    case tooLarge(size: Int, limit: Int)
    /// Not a frame: a bad code byte, a non-digit in the size, an N frame with a body.
    case malformed(String)
    /// The central already has --max-queue requests and replies outstanding.
    case busy
    /// A prepared write that does not continue the value where it stands.
    case invalidOffset(offset: Int, expected: Int)
    /// --allow does not list the central.
    case notAllowed

    /// ATT application error codes (0x80–0x9F) that blserve sends; the man page lists them.
    static let tooLargeCode: UInt8 = 0x80
    static let malformedCode: UInt8 = 0x81
    static let busyCode: UInt8 = 0x82

    var dbusError: DBusError {
        switch self {
        case .tooLarge: return GattError.application(Self.tooLargeCode)
        case .malformed: return GattError.application(Self.malformedCode)
        case .busy: return GattError.application(Self.busyCode)
        case .invalidOffset: return GattError.invalidOffset()
        case .notAllowed: return GattError.notPermitted("Not allowed")
        }
    }

    var description: String {
        switch self {
        case .tooLarge(let size, let limit): return "frame of \(size) bytes is over --max-frame \(limit)"
        case .malformed(let why): return "malformed frame: \(why)"
        case .busy: return "too many requests and replies outstanding (--max-queue)"
        case .invalidOffset(let offset, let expected): return "write at offset \(offset), expected \(expected)"
        case .notAllowed: return "not in --allow"
        }
    }
}

/// Turns one central's writes into frames.
///
/// Each write without an offset starts a new attribute value and its bytes continue the central's
/// byte stream (the seed client writes a frame in pieces, each a write of its own). A write with
/// an offset (what bluetoothd delivers for a prepared write that did not start at 0) must continue
/// the current value exactly where it ends; anything else is refused with Invalid Offset and
/// changes nothing.
///
/// Bodies are collected up to `maxFrame` bytes: a header announcing more is refused at once
/// (nothing of it is kept). A refused write is not applied. A whole write request (`retryable`:
/// it expects a reply and has no offset) refused as busy (no slot for a frame it starts)
/// changes nothing: the central learns of it and can write the same again. Any other refusal
/// restarts reassembly: the partial frame is dropped and the next write must start a frame (a
/// write command's refusal is dropped unseen, and a refused piece of a prepared write is sent
/// again with the pieces before it; keeping the frame would then splice in the wrong bytes).
/// `N` frames (an empty "notify" frame) are accepted and ignored; they are not requests.
struct FrameReassembler {
    let maxFrame: Int
    private var decoder: FrameDecoder
    private var body: [UInt8] = []
    /// Bytes of the current attribute value received so far (for offsets).
    private var valueLength = 0

    init(maxFrame: Int) {
        self.maxFrame = maxFrame
        decoder = FrameDecoder(maxBodySize: maxFrame)
    }

    /// True when no part of a frame is waiting for more bytes.
    var isAtFrameBoundary: Bool { decoder.isAtFrameBoundary }

    /// Bytes held for the frame in progress.
    var bufferedBytes: Int { body.count }

    /// Drops the partial frame; the next byte must start a frame.
    mutating func reset() {
        decoder = FrameDecoder(maxBodySize: maxFrame)
        body = []
        valueLength = 0
    }

    /// Feeds one write. `slots` is how many more requests the central may have outstanding;
    /// `retryable`: the writer gets the refusal and may send the same write again.
    /// Returns the frames the write completed, or the refusal (then nothing of the write counts).
    mutating func write(_ value: [UInt8], offset: Int, slots: Int, retryable: Bool = true) -> Result<[FrameRequest], WriteRefusal> {
        if offset != 0 && offset != valueLength {
            return .failure(.invalidOffset(offset: offset, expected: valueLength))
        }
        // What a busy refusal puts back: the state before this write (the body as it was is
        // the start of the one the write may finish).
        let before = (decoder: decoder, bodyCount: body.count, valueLength: valueLength)
        var finishedBody: [UInt8]?
        if offset == 0 { valueLength = 0 }
        var requests: [FrameRequest] = []
        var refusal: WriteRefusal?
        var slotsLeft = slots
        value.withUnsafeBytes { raw in
            var input = raw
            decoding: while true {
                let event: FrameDecoder.Event?
                do throws(FrameError) {
                    event = try decoder.next(&input)
                } catch {
                    refusal = Self.refusal(for: error)
                    break decoding
                }
                guard let event else { break decoding }
                switch event {
                case .frameStart(let header):
                    if header.code != .notify && slotsLeft <= 0 {
                        refusal = .busy
                        break decoding
                    }
                    body = []
                    body.reserveCapacity(min(header.size, 64 * 1024))
                case .body(let piece):
                    body.append(contentsOf: piece)
                case .frameEnd(let header):
                    if header.code != .notify {
                        requests.append(FrameRequest(code: header.code, body: body))
                        slotsLeft -= 1
                    }
                    if finishedBody == nil { finishedBody = body }
                    body = []
                case .skipped:
                    break  // only in resync mode, which is not used
                }
            }
        }
        if refusal == .busy && retryable && offset == 0 {
            // Not applied at all, so the central can write the same again once it has read:
            // a frame begun in earlier writes (accepted, acknowledged) must not be lost.
            decoder = before.decoder
            body = Array((finishedBody ?? body).prefix(before.bodyCount))
            valueLength = before.valueLength
            return .failure(.busy)
        }
        if let refusal {
            reset()
            return .failure(refusal)
        }
        valueLength += value.count
        return .success(requests)
    }

    static func refusal(for error: FrameError) -> WriteRefusal {
        switch error.kind {
        case .tooLarge(let size, let limit): return .tooLarge(size: size, limit: limit)
        case .unknownCode(let byte): return .malformed("unknown code byte 0x\(hexDigits(byte))")
        case .badSizeDigit(let byte): return .malformed("non-digit 0x\(hexDigits(byte)) in the size")
        case .notifyWithBody(let size): return .malformed("N frame with a body of \(size) bytes")
        case .truncatedHeader, .truncatedBody: return .malformed(error.description)
        }
    }
}

/// One central's replies, read in pieces (bluez-notes §3.4, seed-protocol §000 server 4).
///
/// A read without an offset takes the next piece of the oldest reply: at most MTU-3 bytes (what
/// the seed server sends), and never more than 512 (bluetoothd cuts read results there, §9.1), so
/// a piece never fills the MTU-1 bytes of a Read Response and the central does not continue with
/// a Read Blob. A read with an offset continues that same piece (a central's long read). With
/// nothing queued a read returns an empty value, which ends the central's chain of reads.
struct ReplyQueue {
    /// The most replies held.
    let capacity: Int
    private var replies: [[UInt8]] = []
    /// Bytes of the oldest reply already handed out.
    private var position = 0
    /// The piece the last read without an offset returned.
    private(set) var lastPiece: [UInt8] = []

    init(capacity: Int) {
        self.capacity = capacity
    }

    /// Replies held, the partly read one included.
    var count: Int { replies.count }
    var isEmpty: Bool { replies.isEmpty }
    /// Bytes not yet handed out.
    var pendingBytes: Int { replies.reduce(0) { $0 + $1.count } - position }

    /// Queues a reply; false (and nothing queued) when full, unless `evenIfFull` (for bytes that
    /// were already taken from somewhere and have nowhere else to go). An empty reply is not
    /// queued.
    @discardableResult
    mutating func append(_ reply: [UInt8], evenIfFull: Bool = false) -> Bool {
        if reply.isEmpty { return true }
        guard evenIfFull || replies.count < capacity else { return false }
        replies.append(reply)
        return true
    }

    mutating func removeAll() {
        replies.removeAll()
        position = 0
        lastPiece = []
    }

    /// Takes every byte not yet handed out, in order, leaving the queue empty (a read at an
    /// offset still continues the last piece).
    mutating func takeUnread() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(pendingBytes)
        for (i, reply) in replies.enumerated() { out += i == 0 ? reply[position...] : reply[...] }
        replies.removeAll()
        position = 0
        return out
    }

    /// The size of a piece for a link with this ATT MTU.
    static func pieceSize(mtu: Int) -> Int { min(max(mtu, 23) - 3, 512) }

    /// Answers one read.
    mutating func read(offset: Int, mtu: Int) -> Result<[UInt8], WriteRefusal> {
        if offset > 0 {
            guard offset <= lastPiece.count else {
                return .failure(.invalidOffset(offset: offset, expected: lastPiece.count))
            }
            return .success(Array(lastPiece[offset...]))
        }
        guard let head = replies.first else {
            lastPiece = []
            return .success([])
        }
        let n = min(Self.pieceSize(mtu: mtu), head.count - position)
        lastPiece = Array(head[position..<position + n])
        position += n
        if position == head.count {
            replies.removeFirst()
            position = 0
        }
        return .success(lastPiece)
    }
}
