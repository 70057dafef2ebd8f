import XCTest
import BLFrame
import BLTestSupport

/// The seed 000 server's reading of writes (its bleno `onWriteRequest`), as a model: a header is
/// read only from within one write (fewer than 8 bytes left, or a bad code, and the rest of the
/// write is dropped); a body may span writes.
private struct SeedServerModel {
    var frames: [Frame] = []
    var dropped = 0
    private var current: (code: FrameCode, size: Int, body: [UInt8])?

    mutating func write(_ data: [UInt8]) {
        var index = 0
        while index < data.count {
            guard var frame = current else {
                guard data.count - index >= 8, let code = FrameCode(rawValue: data[index]),
                      let size = Int(String(decoding: data[(index + 1)..<(index + 8)], as: UTF8.self)) else {
                    dropped += data.count - index
                    return
                }
                current = (code, size, [])
                index += 8
                continue
            }
            let n = min(frame.size - frame.body.count, data.count - index)
            frame.body += data[index..<(index + n)]
            index += n
            current = frame
            if frame.body.count >= frame.size {
                frames.append(Frame(code: frame.code, body: frame.body))
                current = nil
            }
        }
    }
}

final class FrameCutterTests: XCTestCase {
    /// Plays blsend: input arrives in `arrivals`; whenever some is there, writes what the cutter
    /// allows (waiting while it says 0), and at the end of the input the rest.
    private func cut(_ input: [UInt8], arrivals: [Int], limit: Int) -> [[UInt8]] {
        var cutter = FrameCutter()
        var writes: [[UInt8]] = []
        var arrived = 0
        var sent = 0
        var arrival = 0
        while sent < input.count {
            let ended = arrived == input.count
            let n = input[sent..<arrived].withUnsafeBytes { cutter.nextWrite($0, limit: limit) }
            let take = n > 0 ? n : (ended ? min(limit, arrived - sent) : 0)
            if take == 0 {
                arrived = min(input.count, arrived + max(1, arrivals[arrival % arrivals.count]))
                arrival += 1
                continue
            }
            let piece = Array(input[sent..<(sent + take)])
            piece.withUnsafeBytes { cutter.consume($0) }
            writes.append(piece)
            sent += take
        }
        return writes
    }

    private func frame(_ code: FrameCode, _ body: [UInt8]) -> [UInt8] {
        Array((code.description + String(repeating: "0", count: 7 - String(body.count).count) + String(body.count)).utf8) + body
    }

    func testNoHeaderIsSplitAcrossWritesWhateverTheInputsChunking() {
        var rng = SeededGenerator(seed: 0x5EED_0000)
        for round in 0..<300 {
            var frames: [Frame] = []
            var input: [UInt8] = []
            for _ in 0..<Int.random(in: 1...12, using: &rng) {
                let code = [FrameCode.text, .url, .image, .notify].randomElement(using: &rng)!
                let size = code == .notify ? 0 : Int.random(in: 1...700, using: &rng)
                let body = rng.bytes(size)
                frames.append(Frame(code: code, body: body))
                input += frame(code, body)
            }
            // A notify frame last would stay pending in the seed server until a next write
            // (a quirk of its loop): end with a frame that has a body.
            let last = rng.bytes(3)
            frames.append(Frame(code: .text, body: last))
            input += frame(.text, last)
            let limit = Int.random(in: 20...510, using: &rng)
            let arrivals = (0..<5).map { _ in Int.random(in: 1...1500, using: &rng) }
            let writes = cut(input, arrivals: arrivals, limit: limit)
            XCTAssertEqual(Array(writes.joined()), input, "round \(round): the writes are not the input")
            XCTAssertTrue(writes.allSatisfy { !$0.isEmpty && $0.count <= limit }, "round \(round): a write over \(limit)")
            var server = SeedServerModel()
            for w in writes { server.write(w) }
            XCTAssertEqual(server.dropped, 0, "round \(round): the seed server dropped bytes (limit \(limit), arrivals \(arrivals))")
            XCTAssertEqual(server.frames, frames, "round \(round)")
        }
    }

    func testTheModelWouldLoseAFrameWhoseHeaderIsCut() {
        // The reason for the cutter: pieces of `limit` bytes regardless of frames lose data.
        let input = frame(.text, Array("0123456789ab".utf8)) + frame(.text, Array("second".utf8))
        var server = SeedServerModel()
        server.write(Array(input[0..<24]))
        server.write(Array(input[24...]))
        XCTAssertEqual(server.frames.count, 1)
        XCTAssertGreaterThan(server.dropped, 0)
        // Cut by the cutter, the same input arrives whole.
        var cutServer = SeedServerModel()
        for w in cut(input, arrivals: [input.count], limit: 24) { cutServer.write(w) }
        XCTAssertEqual(cutServer.frames.map(\.body), [Array("0123456789ab".utf8), Array("second".utf8)])
    }

    func testAPartialHeaderWaitsForTheRest() {
        var cutter = FrameCutter()
        let partial: [UInt8] = Array("T00000".utf8)
        XCTAssertEqual(partial.withUnsafeBytes { cutter.nextWrite($0, limit: 20) }, 0)
        let whole: [UInt8] = Array("T0000002hi".utf8)
        XCTAssertEqual(whole.withUnsafeBytes { cutter.nextWrite($0, limit: 20) }, 10)
        // A header after a body waits too, but the body before it goes now.
        let bodyThenPartial: [UInt8] = Array("T0000002hiT00".utf8)
        XCTAssertEqual(bodyThenPartial.withUnsafeBytes { cutter.nextWrite($0, limit: 20) }, 10)
        whole.withUnsafeBytes { cutter.consume($0) }
        XCTAssertTrue(cutter.isFrames)
    }

    func testInputThatIsNotFramesIsCutAnywhere() {
        let text = Array(String(repeating: "not frames at all ", count: 10).utf8)
        let writes = cut(text, arrivals: [1000], limit: 20)
        XCTAssertEqual(Array(writes.joined()), text)
        XCTAssertEqual(writes.map(\.count), Array(repeating: 20, count: 9))
        // Arriving a few bytes at a time, what is there goes at once.
        XCTAssertEqual(cut(text, arrivals: [7], limit: 20).first?.count, 7)
        // Frames first, then something that is not: from there on it is cut anywhere.
        var cutter = FrameCutter()
        let mixed = frame(.text, Array("ok".utf8)) + Array("garbage that follows".utf8)
        mixed.withUnsafeBytes { cutter.consume($0) }
        XCTAssertFalse(cutter.isFrames)
        let tail: [UInt8] = Array("T000".utf8)
        XCTAssertEqual(tail.withUnsafeBytes { cutter.nextWrite($0, limit: 20) }, 4)
    }
}

extension FrameCutterTests {
    func testTypedTextThatMerelyStartsWithACodeLetterGoesAtOnce() {
        let cutter = FrameCutter()
        for text in ["Uptime\n", "T\n", "Nope", "I0x"] {
            let bytes = Array(text.utf8)
            XCTAssertEqual(bytes.withUnsafeBytes { cutter.nextWrite($0, limit: 20) }, bytes.count, text)
        }
        // A header's beginning waits for the rest.
        for text in ["T", "U00", "N000000"] {
            XCTAssertEqual(Array(text.utf8).withUnsafeBytes { cutter.nextWrite($0, limit: 20) }, 0, text)
        }
    }
}
