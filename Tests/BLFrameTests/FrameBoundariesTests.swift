import XCTest
@testable import BLFrame

final class FrameBoundariesTests: XCTestCase {
    private let stream = Array("T0000005helloN0000000I0000003abcU0000000".utf8)
    private let boundaries: Set<Int> = [0, 13, 21, 32, 40]

    /// Fed byte by byte, the tracker is inside a frame exactly between the boundaries.
    func testInsideFrameExactlyBetweenBoundaries() {
        var tracker = FrameBoundaries()
        XCTAssertFalse(tracker.isInsideFrame)
        for (i, byte) in stream.enumerated() {
            tracker.consume([byte])
            XCTAssertEqual(tracker.isInsideFrame, !boundaries.contains(i + 1), "after \(i + 1) bytes")
            XCTAssertTrue(tracker.isFollowing)
        }
    }

    /// Any split into two chunks gives the same answer as the whole.
    func testChunkingDoesNotMatter() {
        for cut in 0...stream.count {
            for end in cut...stream.count {
                var tracker = FrameBoundaries()
                tracker.consume(Array(stream[0..<cut]))
                tracker.consume(Array(stream[cut..<end]))
                XCTAssertEqual(tracker.isInsideFrame, !boundaries.contains(end), "cut \(cut), end \(end)")
            }
        }
    }

    /// A large body is followed by count: inside until its last byte, then between frames.
    func testLargeBody() {
        var tracker = FrameBoundaries()
        tracker.consume(Array("I1000000".utf8))
        let piece = [UInt8](repeating: 0x54, count: 509)   // bytes that would look like codes
        var sent = 0
        while sent + piece.count < 1_000_000 {
            tracker.consume(piece)
            sent += piece.count
            XCTAssertTrue(tracker.isInsideFrame)
        }
        tracker.consume(Array(piece[0..<(1_000_000 - sent)]))
        XCTAssertFalse(tracker.isInsideFrame)
        XCTAssertTrue(tracker.isFollowing)
    }

    /// A stream that is not frames is never "inside a frame", whatever follows.
    func testOtherBytesStopTheTracker() {
        for text in ["hello", "T00x0000abc", "X0000005hello", "t0000001a"] {
            var tracker = FrameBoundaries()
            tracker.consume(Array(text.utf8))
            XCTAssertFalse(tracker.isFollowing, text)
            tracker.consume(Array("T0000009abc".utf8))
            XCTAssertFalse(tracker.isInsideFrame, text)
        }
    }
}
