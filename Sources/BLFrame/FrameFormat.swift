/// The frame format of the RaspBLE protocol, in one place.
///
/// A frame is one ASCII code byte, seven ASCII decimal digits giving the body length (zero padded),
/// then the body:
///
///     T0000005hello
///
/// `N` frames ("a reply is ready") carry no body. The largest body the size field can express is
/// 9,999,999 bytes.
public enum FrameFormat {
    /// Bytes in a header: the code byte plus seven size digits.
    public static let headerSize = 8
    /// Digits in the size field.
    public static let sizeDigits = 7
    /// The largest body the seven-digit size field can express.
    public static let maxBodySize = 9_999_999
}

/// The code byte that opens a frame.
public enum FrameCode: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// `N`: a notification with an empty body ("a reply is ready").
    case notify = 0x4E
    /// `T`: UTF-8 text.
    case text = 0x54
    /// `U`: a URL, as text.
    case url = 0x55
    /// `I`: image bytes (PNG, JPEG, GIF, WebP, BMP, TIFF, HEIF/AVIF, ICO…).
    case image = 0x49

    /// The code for an ASCII letter, `N`, `T`, `U` or `I` (either case).
    public init?(letter: Character) {
        guard let ascii = letter.asciiValue else { return nil }
        // Upper-case a lower-case ASCII letter.
        self.init(rawValue: (ascii >= 0x61 && ascii <= 0x7A) ? ascii - 0x20 : ascii)
    }

    /// The code byte as a one-letter string.
    public var description: String { String(UnicodeScalar(rawValue)) }

    /// True for the codes whose body is text (`T` and `U`).
    public var isText: Bool { self == .text || self == .url }

    /// The code `auto` chooses for a body starting with `prefix`: `U` for text starting with
    /// "http", `I` for a known image signature, otherwise `T`.
    public static func detect<Prefix: Collection<UInt8>>(prefix: Prefix) -> FrameCode {
        if ImageFormat(signature: prefix) != nil { return .image }
        if prefix.starts(with: [0x68, 0x74, 0x74, 0x70]) { return .url }  // "http"
        return .text
    }
}

/// Image formats recognised from their first bytes.
public enum ImageFormat: String, Sendable, CaseIterable {
    case png, jpeg, gif, webp, bmp, tiff, heif, avif, ico

    /// How many leading bytes `init(signature:)` needs at most.
    public static let signatureLength = 12

    /// Recognises a format from the first bytes of a file, or returns nil.
    public init?<Prefix: Collection<UInt8>>(signature prefix: Prefix) {
        let head = Array(prefix.prefix(ImageFormat.signatureLength))
        func matches(_ expected: [UInt8], at start: Int = 0) -> Bool {
            head.count >= start + expected.count && head[start..<start + expected.count].elementsEqual(expected)
        }
        if matches([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) {
            self = .png
        } else if matches([0xFF, 0xD8, 0xFF]) {
            self = .jpeg
        } else if matches([0x47, 0x49, 0x46, 0x38, 0x37, 0x61]) || matches([0x47, 0x49, 0x46, 0x38, 0x39, 0x61]) {
            self = .gif  // GIF87a, GIF89a
        } else if matches([0x52, 0x49, 0x46, 0x46]) && matches([0x57, 0x45, 0x42, 0x50], at: 8) {
            self = .webp  // RIFF....WEBP
        } else if matches([0x42, 0x4D]) && matches([0, 0, 0, 0], at: 6) && head.count >= 12
                    && Int(head[10]) | Int(head[11]) << 8 >= 26 {
            // BM, the file size, four reserved zero bytes, then where the pixels start: after
            // the 14-byte file header and a bitmap header of at least 12 bytes. ("BM" alone is
            // also how plenty of text starts.)
            self = .bmp
        } else if matches([0x49, 0x49, 0x2A, 0x00]) || matches([0x4D, 0x4D, 0x00, 0x2A]) {
            self = .tiff  // II*\0 (little-endian), MM\0* (big-endian)
        } else if matches([0x00, 0x00, 0x01, 0x00]) && head.count >= 6 && head[4] != 0 && head[5] == 0 {
            self = .ico  // reserved 0, type 1 (icon), then an image count of 1-255
        } else if matches(Array("ftyp".utf8), at: 4), head.count >= 12 {
            // An ISO base media file (HEIF, AVIF, but also MP4): the major brand says which.
            switch String(decoding: head[8..<12], as: UTF8.self) {
            case "heic", "heix", "heim", "heis", "hevc", "hevx", "mif1", "msf1": self = .heif
            case "avif", "avis": self = .avif
            default: return nil
            }
        } else {
            return nil
        }
    }

    /// The usual file name extension.
    public var fileExtension: String {
        switch self {
        case .png: "png"
        case .jpeg: "jpg"
        case .gif: "gif"
        case .webp: "webp"
        case .bmp: "bmp"
        case .tiff: "tif"
        case .heif: "heic"
        case .avif: "avif"
        case .ico: "ico"
        }
    }
}
