import XCTest
@testable import BLFrame
import BLTestSupport

final class FrameDecoderTests: XCTestCase {
    func testDecodesEachCode() {
        let stream = bytes("N0000000T0000005helloU0000008http://xI0000003\u{1}\u{2}\u{3}T0000000")
        let outcome = decode(stream)
        XCTAssertNil(outcome.error)
        XCTAssertEqual(outcome.frames, [
            Frame(code: .notify, body: []),
            Frame(code: .text, body: bytes("hello")),
            Frame(code: .url, body: bytes("http://x")),
            Frame(code: .image, body: [1, 2, 3]),
            Frame(code: .text, body: []),
        ])
    }

    func testEmptyInputIsNoFrames() {
        XCTAssertEqual(decode([]), Outcome())
    }

    func testEveryChunkingGivesTheSameFrames() {
        let frames = [Frame(code: .text, body: bytes("hello world")), Frame(code: .notify, body: []),
                      Frame(code: .image, body: Array(repeating: 7, count: 1000))]
        let stream = encodeAll(frames)
        for size in 1...stream.count {
            XCTAssertEqual(decode(stream, chunks: [size]).frames, frames, "chunk size \(size)")
        }
    }

    func testRandomStreamsRoundTripUnderRandomChunkings() {
        var rng = SeededGenerator(seed: 0x5EED_0001)
        for round in 0..<300 {
            let frames = randomFrames(&rng, count: Int.random(in: 0...20, using: &rng), maxBody: 5000)
            let stream = encodeAll(frames)
            let chunking = randomChunking(&rng)
            let outcome = decode(stream, chunks: chunking)
            XCTAssertNil(outcome.error, "round \(round)")
            XCTAssertEqual(outcome.frames, frames, "round \(round) chunking \(chunking)")
        }
    }

    func testBodyIsHandedOutInPiecesNotBuffered() throws {
        // A body larger than any chunk must arrive as several pieces, each pointing into its chunk.
        let body = [UInt8](repeating: 0x41, count: 100_000)
        let stream = try FrameEncoder.encode(.text, body: body)
        var decoder = FrameDecoder()
        var pieces = 0
        var total = 0
        try stream.withUnsafeBytes { all in
            var position = 0
            while position < all.count {
                let end = min(position + 4096, all.count)
                let chunk = UnsafeRawBufferPointer(rebasing: all[position..<end])
                var input = chunk
                position = end
                while let event = try decoder.next(&input) {
                    if case .body(let piece) = event {
                        pieces += 1
                        total += piece.count
                        XCTAssertTrue(piece.baseAddress! >= chunk.baseAddress! &&
                                      piece.baseAddress! + piece.count <= chunk.baseAddress! + chunk.count,
                                      "piece must point into the chunk")
                    }
                }
            }
        }
        XCTAssertEqual(total, body.count)
        XCTAssertGreaterThanOrEqual(pieces, 100_000 / 4096)
        try decoder.finish()
    }

    func testLargestBodyDecodes() throws {
        let size = FrameFormat.maxBodySize
        let body = [UInt8](repeating: 0x5A, count: size)
        let stream = try FrameEncoder.encode(.image, body: body)
        XCTAssertEqual(Array(stream.prefix(8)), bytes("I9999999"))
        let outcome = decode(stream, chunks: [65536])
        XCTAssertNil(outcome.error)
        XCTAssertEqual(outcome.frames.count, 1)
        XCTAssertEqual(outcome.frames.first?.body.count, size)
    }

    // MARK: malformed input

    func testUnknownCodeReportsItsOffset() {
        let stream = bytes("T0000002hiX0000000")
        for chunk in [1, 3, 100] {
            let outcome = decode(stream, chunks: [chunk])
            XCTAssertEqual(outcome.frames, [Frame(code: .text, body: bytes("hi"))])
            XCTAssertEqual(outcome.error, FrameError(.unknownCode(0x58), at: 10))
        }
    }

    func testLowercaseCodeIsUnknown() {
        XCTAssertEqual(decode(bytes("t0000000")).error, FrameError(.unknownCode(0x74), at: 0))
    }

    func testNonDigitInSizeField() {
        for chunk in [1, 2, 100] {
            XCTAssertEqual(decode(bytes("T00x0000"), chunks: [chunk]).error, FrameError(.badSizeDigit(0x78), at: 3))
            XCTAssertEqual(decode(bytes("T000000 "), chunks: [chunk]).error, FrameError(.badSizeDigit(0x20), at: 7))
            XCTAssertEqual(decode(bytes("U-000001"), chunks: [chunk]).error, FrameError(.badSizeDigit(0x2D), at: 1))
        }
    }

    func testInputEndingInsideHeader() {
        XCTAssertEqual(decode(bytes("T00")).error, FrameError(.truncatedHeader(have: 3), at: 3))
        XCTAssertEqual(decode(bytes("N0000000T")).error, FrameError(.truncatedHeader(have: 1), at: 9))
    }

    func testInputEndingInsideBody() {
        let outcome = decode(bytes("T0000000T0000010abc"), chunks: [2])
        XCTAssertEqual(outcome.frames, [Frame(code: .text, body: [])])
        XCTAssertEqual(outcome.error, FrameError(.truncatedBody(code: .text, have: 3, size: 10), at: 19))
    }

    func testSizeOverLimitIsRefusedAtTheHeader() {
        // The error comes as soon as the header is read, before any body byte.
        let outcome = decode(bytes("I0001001"), maxBodySize: 1000)
        XCTAssertEqual(outcome.error, FrameError(.tooLarge(size: 1001, limit: 1000), at: 1))
        XCTAssertNil(decode(bytes("I0001000") + [UInt8](repeating: 0, count: 1000), maxBodySize: 1000).error)
    }

    func testNotifyWithBodyIsMalformed() {
        XCTAssertEqual(decode(bytes("N0000001x")).error, FrameError(.notifyWithBody(size: 1), at: 1))
    }

    func testErrorMessagesNameProblemAndOffset() {
        XCTAssertEqual(FrameError(.unknownCode(0x58), at: 10).description, "unknown frame code 'X' (0x58) at byte 10")
        XCTAssertEqual(FrameError(.badSizeDigit(0x0A), at: 3).description, "non-digit 0x0a in the size field at byte 3")
        XCTAssertEqual(FrameError(.truncatedBody(code: .image, have: 3, size: 10), at: 19).description,
                       "input ends inside an I frame (3 of 10 body bytes) at byte 19")
    }

    // MARK: resync

    func testResyncSkipsGarbageBeforeFrames() {
        let stream = bytes("xyzT0000002hi\r\nN0000000")
        for chunk in [1, 4, 100] {
            let outcome = decode(stream, chunks: [chunk], resync: true)
            XCTAssertNil(outcome.error)
            XCTAssertEqual(outcome.frames, [Frame(code: .text, body: bytes("hi")), Frame(code: .notify, body: [])])
            XCTAssertEqual(outcome.skipped, [3, 2], "chunk \(chunk)")
        }
    }

    func testResyncRestartsInsideABrokenHeader() {
        // "T00" is broken by "U", which itself starts a valid header.
        let stream = bytes("T00U0000001x")
        for chunk in [1, 2, 5, 100] {
            let outcome = decode(stream, chunks: [chunk], resync: true)
            XCTAssertNil(outcome.error)
            XCTAssertEqual(outcome.frames, [Frame(code: .url, body: bytes("x"))])
            XCTAssertEqual(outcome.skipped, [3])
        }
    }

    func testResyncReportsTrailingGarbage() {
        let outcome = decode(bytes("T0000000??"), resync: true)
        XCTAssertNil(outcome.error)
        XCTAssertEqual(outcome.frames, [Frame(code: .text, body: [])])
        XCTAssertEqual(outcome.skipped, [2])
    }

    func testResyncStillReportsTruncation() {
        // The bytes skipped just before a header cut short are said with the error.
        let cut = decode(bytes("zzT000"), resync: true).error
        XCTAssertEqual(cut, FrameError(.truncatedHeader(have: 4, skipped: 2), at: 6))
        XCTAssertEqual(cut?.description, "input ends inside a frame header (4 of 8 bytes) at byte 6, after 2 skipped bytes")
    }

    func testResyncSkipsNotifyWithBody() {
        let outcome = decode(bytes("N0000005T0000001a"), resync: true)
        XCTAssertEqual(outcome.frames, [Frame(code: .text, body: bytes("a"))])
        XCTAssertEqual(outcome.skipped, [8])
    }

    func testResyncRecoversFromRandomNoiseUnderAnyChunking() {
        var rng = SeededGenerator(seed: 0x5EED_0002)
        for round in 0..<200 {
            let frames = randomFrames(&rng, count: 8, maxBody: 300)
            // Noise made only of bytes that can never start a header (lower-case letters, symbols).
            var stream: [UInt8] = []
            var noise = 0
            for frame in frames {
                let n = Int.random(in: 0...5, using: &rng)
                for _ in 0..<n { stream.append(UInt8.random(in: 0x61...0x7A, using: &rng)) }
                noise += n
                stream += encodeAll([frame])
            }
            let whole = decode(stream, resync: true)
            let chunked = decode(stream, chunks: randomChunking(&rng), resync: true)
            XCTAssertNil(whole.error, "round \(round)")
            XCTAssertEqual(whole.frames, frames, "round \(round)")
            XCTAssertEqual(whole.skipped.reduce(0, +), noise)
            XCTAssertEqual(chunked, whole, "round \(round)")
        }
    }

    /// isAtFrameBoundary is false exactly between frame boundaries, however the input is split
    /// (blrecv reads a reply tail when an empty notification comes while it is false).
    func testBoundaryAfterEveryPrefixAndSplit() throws {
        let stream = bytes("T0000005helloN0000000I0000003abcU0000000")
        let boundaries: Set<Int> = [0, 13, 21, 32, 40]
        for cut in 0...stream.count {
            for end in cut...stream.count {
                var decoder = FrameDecoder()
                for part in [stream[0..<cut], stream[cut..<end]] {
                    try Array(part).withUnsafeBytes { raw in
                        var input = raw
                        while try decoder.next(&input) != nil {}
                    }
                }
                XCTAssertEqual(decoder.isAtFrameBoundary, boundaries.contains(end), "cut \(cut), end \(end)")
            }
        }
    }

    func testOffsetAndBoundaryTracking() throws {
        var decoder = FrameDecoder()
        XCTAssertTrue(decoder.isAtFrameBoundary)
        let stream = bytes("T0000002hiT0")
        try stream.withUnsafeBytes { raw in
            var input = raw
            while try decoder.next(&input) != nil {}
        }
        XCTAssertEqual(decoder.offset, 12)
        XCTAssertEqual(decoder.framesDecoded, 1)
        XCTAssertFalse(decoder.isAtFrameBoundary)
    }
}
