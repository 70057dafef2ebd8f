import XCTest
@testable import BLFrame

final class FrameEncoderTests: XCTestCase {
    func testHeaderIsCodeAndSevenZeroPaddedDigits() throws {
        XCTAssertEqual(try FrameEncoder.header(.text, size: 5), bytes("T0000005"))
        XCTAssertEqual(try FrameEncoder.header(.notify, size: 0), bytes("N0000000"))
        XCTAssertEqual(try FrameEncoder.header(.image, size: 9_999_999), bytes("I9999999"))
        XCTAssertEqual(try FrameEncoder.header(.url, size: 1_234_567), bytes("U1234567"))
    }

    func testEncodeWholeFrame() throws {
        XCTAssertEqual(try FrameEncoder.encode(.text, body: bytes("hello")), bytes("T0000005hello"))
        XCTAssertEqual(try FrameEncoder.encode(.text, body: [UInt8]()), bytes("T0000000"))
    }

    func testEncoderRefusesOversizedBodies() {
        XCTAssertThrowsError(try FrameEncoder.header(.text, size: 10_000_000)) { error in
            XCTAssertEqual((error as? FrameError)?.kind, .tooLarge(size: 10_000_000, limit: 9_999_999))
        }
        XCTAssertThrowsError(try FrameEncoder.encode(.notify, body: [1]))
    }

    func testStreamingEncoderChecksTheAnnouncedSize() throws {
        var encoder = try StreamingFrameEncoder(.image, size: 10)
        XCTAssertEqual(encoder.headerBytes, bytes("I0000010"))
        try encoder.accept(4)
        XCTAssertThrowsError(try encoder.finish())
        XCTAssertThrowsError(try encoder.accept(7))
        XCTAssertEqual(encoder.remaining, 6)
        try encoder.accept(6)
        try encoder.finish()
        XCTAssertThrowsError(try StreamingFrameEncoder(.text, size: 11, limit: 10))
    }

    func testCodeDetection() {
        XCTAssertEqual(FrameCode.detect(prefix: bytes("http://example.com/a.png")), .url)
        XCTAssertEqual(FrameCode.detect(prefix: bytes("https://x")), .url)
        XCTAssertEqual(FrameCode.detect(prefix: bytes("htt")), .text)
        XCTAssertEqual(FrameCode.detect(prefix: bytes("hello")), .text)
        XCTAssertEqual(FrameCode.detect(prefix: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0]), .image)
        XCTAssertEqual(FrameCode.detect(prefix: [UInt8]()), .text)
    }

    func testImageSignatures() {
        XCTAssertEqual(ImageFormat(signature: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]), .png)
        XCTAssertNil(ImageFormat(signature: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A]))
        XCTAssertEqual(ImageFormat(signature: [0xFF, 0xD8, 0xFF, 0xE0]), .jpeg)
        XCTAssertEqual(ImageFormat(signature: bytes("GIF89a...")), .gif)
        XCTAssertEqual(ImageFormat(signature: bytes("GIF87a")), .gif)
        XCTAssertNil(ImageFormat(signature: bytes("GIF88a")))
        XCTAssertEqual(ImageFormat(signature: bytes("RIFF\0\0\0\0WEBPVP8 ")), .webp)
        XCTAssertNil(ImageFormat(signature: bytes("RIFF\0\0\0\0WAVE")))
        // A 24-bit BMP's file header: BM, the size, reserved zeros, pixels at byte 54.
        let bmp: [UInt8] = [0x42, 0x4D, 0x36, 0x00, 0x0C, 0x00, 0, 0, 0, 0, 0x36, 0x00, 0x00, 0x00, 0x28, 0x00]
        XCTAssertEqual(ImageFormat(signature: bmp), .bmp)
        XCTAssertNil(ImageFormat(signature: bmp.prefix(11)), "where the pixels start is not known yet")
        XCTAssertNil(ImageFormat(signature: bytes("BMW drivers\n")), "text that starts with BM")
        XCTAssertNil(ImageFormat(signature: bytes("BM6\0\0\0\0\0\0\0\u{8}\0")), "pixels inside the file header")
        XCTAssertEqual(FrameCode.detect(prefix: bytes("BMW drivers\n")), .text)
        XCTAssertEqual(ImageFormat(signature: bytes("II*\0\u{8}\0\0\0")), .tiff)
        XCTAssertEqual(ImageFormat(signature: bytes("MM\0*\0\0\0\u{8}")), .tiff)
        XCTAssertNil(ImageFormat(signature: bytes("II+\0")), "BigTIFF is not decoded by the seed app's platform")
        XCTAssertEqual(ImageFormat(signature: bytes("\0\0\0\u{18}ftypheic\0\0\0\0")), .heif)
        XCTAssertEqual(ImageFormat(signature: bytes("\0\0\0\u{1C}ftypmif1\0\0\0\0")), .heif)
        XCTAssertEqual(ImageFormat(signature: bytes("\0\0\0\u{1C}ftypavif\0\0\0\0")), .avif)
        XCTAssertNil(ImageFormat(signature: bytes("\0\0\0\u{18}ftypmp42\0\0\0\0")), "an MP4 video is no image")
        XCTAssertNil(ImageFormat(signature: bytes("\0\0\0\u{18}ftyp")), "too short to tell")
        XCTAssertEqual(ImageFormat(signature: [0, 0, 1, 0, 1, 0, 16, 16]), .ico)
        XCTAssertNil(ImageFormat(signature: [0, 0, 1, 0, 0, 0]), "an icon file holds at least one image")
        XCTAssertNil(ImageFormat(signature: [0, 0, 1, 0]))
        XCTAssertEqual(ImageFormat.jpeg.fileExtension, "jpg")
        XCTAssertEqual(ImageFormat.heif.fileExtension, "heic")
        XCTAssertEqual(Set(ImageFormat.allCases.map(\.fileExtension)).count, ImageFormat.allCases.count)
    }

    func testFrameCodeFromLetter() {
        XCTAssertEqual(FrameCode(letter: "t"), .text)
        XCTAssertEqual(FrameCode(letter: "I"), .image)
        XCTAssertNil(FrameCode(letter: "x"))
        XCTAssertNil(FrameCode(letter: "é"))
    }
}
