import XCTest
import BLFrame
import BLTestSupport
@testable import blserve

final class ReassemblyTests: XCTestCase {
    private func frame(_ code: String, _ body: String) -> [UInt8] {
        Array(code.utf8) + Array(String(format7(body.utf8.count)).utf8) + Array(body.utf8)
    }

    private func format7(_ n: Int) -> String {
        let s = String(n)
        return String(repeating: "0", count: 7 - s.count) + s
    }

    private func requests(_ result: Result<[FrameRequest], WriteRefusal>, file: StaticString = #filePath, line: UInt = #line) -> [FrameRequest] {
        switch result {
        case .success(let r): return r
        case .failure(let e):
            XCTFail("refused: \(e)", file: file, line: line)
            return []
        }
    }

    func testFrameSplitAcrossWritesOfEveryPieceSize() {
        let whole = frame("T", "hello, world")
        for piece in 1...whole.count {
            var r = FrameReassembler(maxFrame: 100)
            var got: [FrameRequest] = []
            var i = 0
            while i < whole.count {
                got += requests(r.write(Array(whole[i..<min(i + piece, whole.count)]), offset: 0, slots: 4))
                i += piece
            }
            XCTAssertEqual(got, [FrameRequest(code: .text, body: Array("hello, world".utf8))], "pieces of \(piece)")
            XCTAssertTrue(r.isAtFrameBoundary)
        }
    }

    func testSeveralFramesInOneWriteAndNFramesIgnored() {
        var r = FrameReassembler(maxFrame: 100)
        let bytes = frame("T", "a") + Array("N0000000".utf8) + frame("U", "http://x") + frame("I", "")
        let got = requests(r.write(bytes, offset: 0, slots: 8))
        XCTAssertEqual(got.map(\.code), [.text, .url, .image])
        XCTAssertEqual(got[1].body, Array("http://x".utf8))
        XCTAssertEqual(got[2].body, [])
    }

    func testOffsetContinuesTheValueAndAWrongOffsetChangesNothing() {
        var r = FrameReassembler(maxFrame: 100)
        let whole = frame("T", "0123456789")  // 18 bytes
        XCTAssertEqual(requests(r.write(Array(whole[0..<5]), offset: 0, slots: 4)), [])
        // A prepared write that skips bytes is refused and leaves the state alone.
        XCTAssertEqual(r.write(Array(whole[6..<10]), offset: 6, slots: 4), .failure(.invalidOffset(offset: 6, expected: 5)))
        XCTAssertEqual(r.write(Array(whole[0..<3]), offset: 3, slots: 4), .failure(.invalidOffset(offset: 3, expected: 5)))
        XCTAssertEqual(requests(r.write(Array(whole[5..<12]), offset: 5, slots: 4)), [])
        XCTAssertEqual(requests(r.write(Array(whole[12...]), offset: 12, slots: 4)),
                       [FrameRequest(code: .text, body: Array("0123456789".utf8))])
        // A write without an offset starts a new value but continues the stream.
        XCTAssertEqual(requests(r.write(Array(frame("T", "x")[0..<4]), offset: 0, slots: 4)), [])
        XCTAssertEqual(requests(r.write(Array(frame("T", "x")[4...]), offset: 0, slots: 4)).map(\.body), [Array("x".utf8)])
    }

    func testOversizedHeaderIsRefusedAtOnceAndReassemblyRestarts() {
        var r = FrameReassembler(maxFrame: 1000)
        // Only the header: refused before any body byte arrives.
        XCTAssertEqual(r.write(Array("T0001001".utf8), offset: 0, slots: 4), .failure(.tooLarge(size: 1001, limit: 1000)))
        XCTAssertEqual(r.bufferedBytes, 0)
        XCTAssertTrue(r.isAtFrameBoundary)
        // The largest allowed size goes through.
        let body = String(repeating: "z", count: 1000)
        XCTAssertEqual(requests(r.write(frame("T", body), offset: 0, slots: 4)).first?.body.count, 1000)
        // The size field can say 9999999; the limit still applies.
        XCTAssertEqual(r.write(Array("I9999999".utf8), offset: 0, slots: 4), .failure(.tooLarge(size: 9_999_999, limit: 1000)))
    }

    func testRefusedWriteDropsThePartialFrameAndAppliesNothing() {
        var r = FrameReassembler(maxFrame: 100)
        XCTAssertEqual(requests(r.write(Array("T00000".utf8), offset: 0, slots: 4)), [])
        XCTAssertFalse(r.isAtFrameBoundary)
        // A complete frame, then garbage, in one write: the write is refused as a whole.
        let result = r.write(Array("03abcT0000001xQ".utf8), offset: 0, slots: 4)
        guard case .failure(.malformed) = result else { return XCTFail("expected malformed, got \(result)") }
        XCTAssertTrue(r.isAtFrameBoundary)
        XCTAssertEqual(requests(r.write(frame("T", "ok"), offset: 0, slots: 4)).map(\.body), [Array("ok".utf8)])
    }

    func testMalformedInputs() {
        for bad in ["X0000001a", "T00x0001a", "N0000003abc", "t0000001a"] {
            var r = FrameReassembler(maxFrame: 100)
            let result = r.write(Array(bad.utf8), offset: 0, slots: 4)
            guard case .failure(.malformed(let why)) = result else {
                XCTFail("\(bad): expected malformed, got \(result)")
                continue
            }
            XCTAssertFalse(why.isEmpty)
            XCTAssertEqual(result.failureCode, WriteRefusal.malformedCode, bad)
        }
    }

    func testNoSlotsRefusesTheNextFrameButNotTheRestOfACurrentOne() {
        var r = FrameReassembler(maxFrame: 100)
        XCTAssertEqual(r.write(frame("T", "a"), offset: 0, slots: 0), .failure(.busy))
        // One slot: the first frame passes, the second in the same write is refused (and with it the write).
        XCTAssertEqual(r.write(frame("T", "a") + frame("T", "b"), offset: 0, slots: 1), .failure(.busy))
        // N frames need no slot.
        XCTAssertEqual(requests(r.write(Array("N0000000".utf8), offset: 0, slots: 0)), [])
        XCTAssertEqual(requests(r.write(frame("T", "a") + frame("T", "b"), offset: 0, slots: 2)).count, 2)
    }

    /// A busy refusal of a write request that finishes a frame begun earlier (accepted,
    /// acknowledged) and starts another changes nothing: the same write, again once there is
    /// room, gives both.
    func testBusyRefusalKeepsTheFrameInProgressForTheSameWriteAgain() {
        var r = FrameReassembler(maxFrame: 100)
        XCTAssertEqual(requests(r.write(Array("T0000003bc".utf8), offset: 0, slots: 1)), [])
        let next = Array("dT0000001e".utf8)
        XCTAssertEqual(r.write(next, offset: 0, slots: 1), .failure(.busy))
        XCTAssertEqual(r.bufferedBytes, 2)
        XCTAssertFalse(r.isAtFrameBoundary)
        XCTAssertEqual(requests(r.write(next, offset: 0, slots: 2)),
                       [FrameRequest(code: .text, body: Array("bcd".utf8)), FrameRequest(code: .text, body: Array("e".utf8))])
        XCTAssertTrue(r.isAtFrameBoundary)

        // A write command (its refusal is never seen, the central goes on) and a piece of a
        // prepared write (sent again with the pieces before it) restart reassembly instead:
        // the next bytes must not be spliced onto the begun frame.
        for (retryable, offset) in [(false, 0), (true, 10)] {
            var r = FrameReassembler(maxFrame: 100)
            XCTAssertEqual(requests(r.write(Array("T0000003bc".utf8), offset: 0, slots: 1)), [])
            XCTAssertEqual(r.write(next, offset: offset, slots: 1, retryable: retryable), .failure(.busy))
            XCTAssertTrue(r.isAtFrameBoundary, "retryable \(retryable), offset \(offset)")
            XCTAssertEqual(r.bufferedBytes, 0)
            XCTAssertEqual(requests(r.write(frame("T", "hi"), offset: 0, slots: 1)), [FrameRequest(code: .text, body: Array("hi".utf8))])
        }
        // A malformed write still restarts reassembly: the next write must start a frame.
        r = FrameReassembler(maxFrame: 100)
        XCTAssertEqual(requests(r.write(Array("T0000003bc".utf8), offset: 0, slots: 1)), [])
        XCTAssertEqual(r.write(Array("dX".utf8), offset: 0, slots: 1), .failure(.malformed("unknown code byte 0x58")))
        XCTAssertEqual(requests(r.write(frame("T", "f"), offset: 0, slots: 1)), [FrameRequest(code: .text, body: Array("f".utf8))])
    }

    /// Valid frames (N among them) in random writes, each a new value or the continuation of
    /// the current one at its offset, with writes at a wrong offset mixed in: the requests are
    /// the stream's frames, in order, whatever the cut.
    func testAnyCutOfAStreamGivesItsFramesInOrder() {
        var rng = SeededGenerator(seed: 0x5EED_0001)
        let codes: [FrameCode] = [.text, .url, .image, .notify]
        for round in 0..<300 {
            var stream: [UInt8] = []
            var want: [FrameRequest] = []
            for _ in 0..<Int.random(in: 1...8, using: &rng) {
                let code = codes.randomElement(using: &rng)!
                let body = code == .notify ? [] : rng.bytes(Int.random(in: 0...200, using: &rng))
                stream += Array(code.description.utf8) + Array(format7(body.count).utf8) + body
                if code != .notify { want.append(FrameRequest(code: code, body: body)) }
            }
            var r = FrameReassembler(maxFrame: 200)
            var got: [FrameRequest] = []
            var valueLength = 0
            var at = 0
            while at < stream.count {
                if Int.random(in: 0..<10, using: &rng) == 0 {
                    let wrong = valueLength + Int.random(in: 1...50, using: &rng)
                    XCTAssertEqual(r.write(rng.bytes(10), offset: wrong, slots: 100),
                                   .failure(.invalidOffset(offset: wrong, expected: valueLength)), "round \(round)")
                }
                let n = Int.random(in: 1...min(60, stream.count - at), using: &rng)
                let offset = valueLength > 0 && Bool.random(using: &rng) ? valueLength : 0
                let result = r.write(Array(stream[at..<(at + n)]), offset: offset, slots: 100, retryable: Bool.random(using: &rng))
                got += requests(result)
                valueLength = offset + n
                at += n
            }
            XCTAssertEqual(got, want, "round \(round)")
            XCTAssertTrue(r.isAtFrameBoundary, "round \(round)")
            XCTAssertEqual(r.bufferedBytes, 0, "round \(round)")
        }
    }

    /// Whatever a central writes (garbage, frame pieces, any offset, with or without room for
    /// requests): no crash, never more than one frame's body held, no request over the limit;
    /// a refused write either changes nothing (a wrong offset, or a busy write request that can
    /// be sent again) or restarts reassembly.
    func testArbitraryWritesStayWithinTheirBounds() {
        var rng = SeededGenerator(seed: 0x5EED_0002)
        let maxFrame = 300
        /// What the state behaves like, probed with a few writes on a copy.
        func probe(_ r: FrameReassembler) -> [Result<[FrameRequest], WriteRefusal>] {
            var copy = r
            return [Array("0123".utf8), frame("T", "probe"), Array("T00".utf8), Array("00001x".utf8)]
                .map { copy.write($0, offset: 0, slots: 4) }
        }
        for round in 0..<200 {
            var r = FrameReassembler(maxFrame: maxFrame)
            var valueLength = 0
            var feed: [UInt8] = []
            for step in 0..<60 {
                // The next piece of what the central sends: mostly frames, cut anywhere.
                while feed.count < 200 {
                    switch Int.random(in: 0..<8, using: &rng) {
                    case 0:
                        feed += rng.bytes(Int.random(in: 1...40, using: &rng))
                    case 1:
                        // A header announcing around the limit, then part of a body.
                        let size = Int.random(in: (maxFrame - 3)...(maxFrame + 3), using: &rng)
                        feed += Array("TUIN".randomElement(using: &rng)!.utf8) + Array(format7(size).utf8)
                            + rng.bytes(Int.random(in: 0...40, using: &rng))
                    default:
                        feed += frame(["T", "U", "I", "N"].randomElement(using: &rng)!,
                                      String(repeating: "b", count: Int.random(in: 0...120, using: &rng)))
                    }
                }
                let value = Array(feed.prefix(Int.random(in: 0...80, using: &rng)))
                feed.removeFirst(value.count)
                let offset: Int
                switch Int.random(in: 0..<5, using: &rng) {
                case 0: offset = Int.random(in: 1...400, using: &rng)
                case 1, 2: offset = valueLength
                default: offset = 0
                }
                let slots = Int.random(in: 0...3, using: &rng)
                let retryable = Bool.random(using: &rng)
                let before = r
                let where_ = "round \(round) step \(step)"
                switch r.write(value, offset: offset, slots: slots, retryable: retryable) {
                case .success(let got):
                    // A frame begun in an earlier write had its slot when it began.
                    XCTAssertLessThanOrEqual(got.count, slots + (before.isAtFrameBoundary ? 0 : 1), where_)
                    XCTAssertTrue(got.allSatisfy { $0.body.count <= maxFrame && $0.code != .notify }, where_)
                    valueLength = (offset == 0 ? 0 : valueLength) + value.count
                case .failure(.invalidOffset(let bad, let expected)):
                    XCTAssertNotEqual(offset, 0, where_)
                    XCTAssertEqual(bad, offset, where_)
                    XCTAssertEqual(expected, valueLength, "the offset it expects is where the value ends: \(where_)")
                    XCTAssertEqual(probe(r), probe(before), "a wrong offset changed the state: \(where_)")
                    feed = value + feed  // sent again
                case .failure(.busy) where retryable && offset == 0:
                    XCTAssertEqual(probe(r), probe(before), "a busy write request changed the state: \(where_)")
                    feed = value + feed  // sent again once the central has read
                case .failure(let refusal):
                    XCTAssertNotEqual(refusal, .notAllowed, where_)
                    XCTAssertTrue(r.isAtFrameBoundary, "\(refusal) did not restart reassembly: \(where_)")
                    XCTAssertEqual(r.bufferedBytes, 0, where_)
                    valueLength = 0
                    feed = []  // the central starts again with a new frame
                }
                XCTAssertLessThanOrEqual(r.bufferedBytes, maxFrame, where_)
            }
        }
    }

    func testRefusalsMapToTheDocumentedATTErrors() {
        XCTAssertEqual(WriteRefusal.tooLarge(size: 2, limit: 1).dbusError.name, "org.bluez.Error.Failed")
        XCTAssertEqual(WriteRefusal.tooLarge(size: 2, limit: 1).dbusError.message, "0x80")
        XCTAssertEqual(WriteRefusal.malformed("x").dbusError.message, "0x81")
        XCTAssertEqual(WriteRefusal.busy.dbusError.message, "0x82")
        XCTAssertEqual(WriteRefusal.invalidOffset(offset: 1, expected: 0).dbusError.name, "org.bluez.Error.InvalidOffset")
        XCTAssertEqual(WriteRefusal.notAllowed.dbusError.name, "org.bluez.Error.NotPermitted")
    }
}

final class ReplyQueueTests: XCTestCase {
    private func read(_ q: inout ReplyQueue, offset: Int = 0, mtu: Int, file: StaticString = #filePath, line: UInt = #line) -> [UInt8] {
        switch q.read(offset: offset, mtu: mtu) {
        case .success(let b): return b
        case .failure(let e):
            XCTFail("read failed: \(e)", file: file, line: line)
            return []
        }
    }

    func testPiecesAreMTUMinus3AndNeverOver512() {
        XCTAssertEqual(ReplyQueue.pieceSize(mtu: 23), 20)
        XCTAssertEqual(ReplyQueue.pieceSize(mtu: 185), 182)
        XCTAssertEqual(ReplyQueue.pieceSize(mtu: 515), 512)
        XCTAssertEqual(ReplyQueue.pieceSize(mtu: 517), 512)
        XCTAssertEqual(ReplyQueue.pieceSize(mtu: 5), 20)  // nonsense MTUs are treated as the minimum
    }

    func testReadsWalkTheOldestReplyThenTheNextThenEmpty() {
        var q = ReplyQueue(capacity: 4)
        let first = Array(0..<50).map { UInt8($0) }
        let second: [UInt8] = [200, 201, 202]
        XCTAssertTrue(q.append(first))
        XCTAssertTrue(q.append(second))
        var got: [[UInt8]] = []
        while true {
            let piece = read(&q, mtu: 23)
            if piece.isEmpty { break }
            got.append(piece)
        }
        // A piece never spans two replies.
        XCTAssertEqual(got.map(\.count), [20, 20, 10, 3])
        XCTAssertEqual(Array(got.joined()), first + second)
        XCTAssertTrue(q.isEmpty)
        XCTAssertEqual(read(&q, mtu: 23), [])
    }

    func testOffsetReadsContinueTheSamePiece() {
        var q = ReplyQueue(capacity: 4)
        q.append(Array(0..<100).map { UInt8($0) })
        let piece = read(&q, mtu: 50)
        XCTAssertEqual(piece, Array(0..<47).map { UInt8($0) })
        XCTAssertEqual(read(&q, offset: 20, mtu: 50), Array(20..<47).map { UInt8($0) })
        XCTAssertEqual(read(&q, offset: 47, mtu: 50), [])
        XCTAssertEqual(q.read(offset: 48, mtu: 50), .failure(.invalidOffset(offset: 48, expected: 47)))
        // The next read without an offset goes on after the piece.
        XCTAssertEqual(read(&q, mtu: 50).first, 47)
    }

    func testCapacityAndEmptyReplies() {
        var q = ReplyQueue(capacity: 2)
        XCTAssertTrue(q.append([1]))
        XCTAssertTrue(q.append([]))  // nothing to queue
        XCTAssertTrue(q.append([2]))
        XCTAssertFalse(q.append([3]))
        XCTAssertEqual(q.count, 2)
        XCTAssertEqual(q.pendingBytes, 2)
        q.removeAll()
        XCTAssertTrue(q.isEmpty)
        XCTAssertEqual(read(&q, mtu: 23), [])
    }

    /// Replies queued at random moments, read by a central with any MTU and any offsets: every
    /// reply comes out whole and in order, in pieces that fit the MTU and never span two replies;
    /// a read at an offset within the last piece repeats its rest, and beyond it is refused.
    func testAnyReadsGiveEveryReplyInOrderInPiecesThatFit() {
        var rng = SeededGenerator(seed: 0x5EED_0003)
        for round in 0..<300 {
            var q = ReplyQueue(capacity: Int.random(in: 1...4, using: &rng))
            var queued: [[UInt8]] = []
            var got: [[UInt8]] = []
            var current: [UInt8] = []  // the reply being read, pieces so far
            var lastPiece: [UInt8] = []
            var reads = 0
            while reads < 5000 && (queued.count < 6 || got.count < queued.count) {
                reads += 1
                let where_ = "round \(round) read \(reads)"
                if queued.count < 6 && Int.random(in: 0..<3, using: &rng) == 0 {
                    let reply = rng.bytes(Int.random(in: 1...1200, using: &rng))
                    let held = q.count
                    if q.append(reply) {
                        queued.append(reply)
                        XCTAssertLessThanOrEqual(q.count, q.capacity, where_)
                    } else {
                        XCTAssertEqual(held, q.capacity, "refused with room: \(where_)")
                    }
                    continue
                }
                let mtu = [23, 24, 100, 185, 247, 515, 517, 1000].randomElement(using: &rng)!
                if !lastPiece.isEmpty && Bool.random(using: &rng) {
                    let offset = Int.random(in: 1...(lastPiece.count + 3), using: &rng)
                    let result = q.read(offset: offset, mtu: mtu)
                    if offset <= lastPiece.count {
                        XCTAssertEqual(result, .success(Array(lastPiece[offset...])), where_)
                    } else {
                        XCTAssertEqual(result, .failure(.invalidOffset(offset: offset, expected: lastPiece.count)), where_)
                    }
                    continue
                }
                let piece = read(&q, mtu: mtu)
                lastPiece = piece
                guard !piece.isEmpty else {
                    XCTAssertEqual(got.count, queued.count, "an empty read with a reply queued: \(where_)")
                    XCTAssertTrue(current.isEmpty, where_)
                    continue
                }
                let want = queued[got.count]
                // As much as the MTU allows (ATT_MTU - 3, and 512 at most), within one reply.
                XCTAssertEqual(piece.count, min(mtu - 3, 512, want.count - current.count), where_)
                current += piece
                XCTAssertTrue(want.starts(with: current), "bytes out of order: \(where_)")
                if current.count >= want.count {
                    XCTAssertEqual(current, want, "a piece spanned two replies: \(where_)")
                    got.append(current)
                    current = []
                }
            }
            XCTAssertEqual(got, queued, "round \(round)")
            XCTAssertTrue(q.isEmpty, "round \(round)")
        }
    }
}

extension Result where Success == [FrameRequest], Failure == WriteRefusal {
    var failureCode: UInt8? {
        guard case .failure(let e) = self, e.dbusError.message.hasPrefix("0x") else { return nil }
        return UInt8(e.dbusError.message.dropFirst(2), radix: 16)
    }
}
