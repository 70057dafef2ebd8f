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
