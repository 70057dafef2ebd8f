/// What went wrong in a frame stream, and the byte offset (from the start of the stream) where it did.
public struct FrameError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Equatable, Sendable {
        /// The byte where a frame should start is not `N`, `T`, `U` or `I`.
        case unknownCode(UInt8)
        /// A byte of the seven-digit size field is not an ASCII digit.
        case badSizeDigit(UInt8)
        /// The input ended inside a header (`have` of 8 bytes read), after `skipped` bytes that
        /// resync mode skipped just before it.
        case truncatedHeader(have: Int, skipped: Int = 0)
        /// The input ended inside a body (`have` of `size` body bytes read).
        case truncatedBody(code: FrameCode, have: Int, size: Int)
        /// The announced (or, when encoding, the actual) body size exceeds the limit.
        case tooLarge(size: Int, limit: Int)
        /// An `N` frame announced a body; `N` frames are always empty.
        case notifyWithBody(size: Int)
    }

    public var kind: Kind
    /// Offset of the offending byte; for truncation, the offset where the input ended.
    public var offset: Int

    public init(_ kind: Kind, at offset: Int) {
        self.kind = kind
        self.offset = offset
    }

    public var description: String {
        switch kind {
        case .unknownCode(let byte):
            return "unknown frame code \(FrameError.show(byte)) at byte \(offset)"
        case .badSizeDigit(let byte):
            return "non-digit \(FrameError.show(byte)) in the size field at byte \(offset)"
        case .truncatedHeader(let have, let skipped):
            let after = skipped == 0 ? "" : ", after \(skipped) skipped byte\(skipped == 1 ? "" : "s")"
            return "input ends inside a frame header (\(have) of 8 bytes) at byte \(offset)\(after)"
        case .truncatedBody(let code, let have, let size):
            let article = code == .image || code == .notify ? "an" : "a"
            return "input ends inside \(article) \(code) frame (\(have) of \(size) body bytes) at byte \(offset)"
        case .tooLarge(let size, let limit):
            return "frame body of \(size) bytes is over the limit of \(limit) at byte \(offset)"
        case .notifyWithBody(let size):
            return "N frame announces a body of \(size) byte\(size == 1 ? "" : "s") at byte \(offset)"
        }
    }

    /// A byte for a message: `'A' (0x41)` when printable, else `0x07`.
    static func show(_ byte: UInt8) -> String {
        let hex = hexByte(byte)
        if byte >= 0x21 && byte < 0x7F {
            return "'\(Character(UnicodeScalar(byte)))' (\(hex))"
        }
        return hex
    }

    static func hexByte(_ byte: UInt8) -> String {
        let digits: [Character] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f"]
        return "0x" + String(digits[Int(byte >> 4)]) + String(digits[Int(byte & 0xF)])
    }
}
