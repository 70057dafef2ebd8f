import XCTest
import BLTestSupport
@testable import BLCommand

final class JSONTests: XCTestCase {
    func escapeAll(_ bytes: [UInt8], pieces: [Int]) -> String {
        var escaper = JSONStringEscaper()
        var out: [UInt8] = []
        var position = 0
        var i = 0
        bytes.withUnsafeBytes { raw in
            while position < raw.count {
                let n = min(pieces[i % pieces.count], raw.count - position)
                i += 1
                escaper.escape(UnsafeRawBufferPointer(rebasing: raw[position..<(position + n)])) { out.append(contentsOf: $0) }
                position += n
            }
        }
        escaper.finish { out.append(contentsOf: $0) }
        return String(decoding: out, as: UTF8.self)
    }

    func testEscapes() {
        XCTAssertEqual(JSON.quoted("a\"b\\c\n\t\r\u{1}"), #""a\"b\\c\n\t\r\u0001""#)
        XCTAssertEqual(JSON.quoted("héllo ✓ 😀"), "\"héllo ✓ 😀\"")
    }

    func testInvalidUTF8BecomesReplacementCharacter() {
        XCTAssertEqual(escapeAll([0x61, 0xFF, 0x62], pieces: [100]), "a\u{FFFD}b")
        XCTAssertEqual(escapeAll([0xC3], pieces: [100]), "\u{FFFD}", "truncated sequence at the end")
        XCTAssertEqual(escapeAll([0xED, 0xA0, 0x80], pieces: [100]), "\u{FFFD}\u{FFFD}\u{FFFD}", "surrogates are invalid")
        XCTAssertEqual(escapeAll([0xC0, 0x80], pieces: [100]), "\u{FFFD}\u{FFFD}", "overlong form")
    }

    /// One U+FFFD per maximal invalid subpart, wherever it stands (mid-text or at the end, cut
    /// or not): what Swift's own decoder (and Python's, and WHATWG's) gives.
    func testReplacementsFollowTheMaximalSubpartPractice() {
        XCTAssertEqual(escapeAll([0xE4, 0x88, 0x75], pieces: [100]), "\u{FFFD}u")
        XCTAssertEqual(escapeAll([0x75, 0xE4, 0x88], pieces: [100]), "u\u{FFFD}")
        XCTAssertEqual(escapeAll([0xE0, 0x80], pieces: [1]), "\u{FFFD}\u{FFFD}")
        var rng = SeededGenerator(seed: 11)
        let pool: [UInt8] = [0x41, 0x7A, 0x80, 0x8F, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE4, 0xED, 0xEF,
                             0xF0, 0xF4, 0xF5, 0xFF]
        for _ in 0..<2000 {
            let sample = (0..<Int.random(in: 1...12, using: &rng)).map { _ in pool.randomElement(using: &rng)! }
            let expected = String(decoding: sample, as: UTF8.self)
            for pieces in [[sample.count], [1], [2, 1]] {
                XCTAssertEqual(escapeAll(sample, pieces: pieces), expected, "\(sample) in pieces of \(pieces)")
            }
        }
    }

    func testOutputDoesNotDependOnHowInputIsCut() {
        var rng = SeededGenerator(seed: 7)
        let text = Array("plain \"quoted\" é ✓ 😀 \u{7}\n".utf8)
        for _ in 0..<200 {
            var sample: [UInt8] = []
            for _ in 0..<Int.random(in: 1...40, using: &rng) {
                if Bool.random(using: &rng) {
                    sample += text
                } else {
                    sample += rng.bytes(Int.random(in: 1...4, using: &rng))
                }
            }
            let whole = escapeAll(sample, pieces: [sample.count])
            for pieces in [[1], [2], [3], [5, 1, 7]] {
                XCTAssertEqual(escapeAll(sample, pieces: pieces), whole)
            }
            // Valid UTF-8 passes through unchanged apart from escapes.
            XCTAssertEqual(escapeAll(text, pieces: [1]), #"plain \"quoted\" é ✓ 😀 \u0007\n"#)
        }
    }

    func testObjectsKeepFieldOrder() {
        var object = JSONObject()
        object.add("address", "AA:BB")
        object.add("rssi", -40)
        object.add("uuids", ["1", "2"])
        object.add("connected", false)
        XCTAssertEqual(object.json, #"{"address":"AA:BB","rssi":-40,"uuids":["1","2"],"connected":false}"#)
    }
}
