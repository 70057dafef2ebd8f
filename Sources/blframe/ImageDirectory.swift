#if canImport(Glibc)
import Glibc
#endif
import BLCommand
import BLFrame

/// `--images DIR`: each I frame becomes DIR/<number>.<ext>, numbered after the highest number
/// already there, written under a temporary name and moved into place when complete.
final class ImageDirectory {
    let path: String
    private var next: Int

    init(path: String) throws {
        var path = path
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        self.path = path
        try PartialFile.makeDirectories(self.path)
        // Numbering goes on after the highest number there: a directory that cannot be listed
        // is one blframe cannot number images in (73, as for an image it cannot create).
        let names: [String]
        do {
            names = try DirectoryListing.names(in: self.path)
        } catch {
            throw ToolError(.cantCreate, error.message)
        }
        next = (names.compactMap(ImageDirectory.number).max() ?? 0) + 1
    }

    /// "000042.png" → 42. Names of more than 18 digits are not ours and are ignored (counting on
    /// from one would overflow).
    static func number(of name: String) -> Int? {
        guard let dot = name.firstIndex(of: "."), dot != name.startIndex else { return nil }
        let digits = name[..<dot]
        guard digits.utf8.count <= 18, digits.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int(digits)
    }

    /// Every extension blframe names images with.
    static let extensions = ImageFormat.allCases.map(\.fileExtension) + ["bin"]

    /// Whether `directory` has an entry for `number` under any of ``extensions`` (a dangling
    /// link too).
    static func numberTaken(_ number: Int, in directory: String) -> Bool {
        let base = directory == "/" ? "" : directory
        return extensions.contains { ext in
            var st = stat()
            return lstat("\(base)/\(name(number, ext))", &st) == 0
        }
    }

    static func name(_ number: Int, _ ext: String) -> String {
        let digits = String(number)
        return String(repeating: "0", count: max(0, 6 - digits.count)) + digits + "." + ext
    }

    func begin() throws -> Writer {
        Writer(owner: self, file: try PartialFile(directory: path, prefix: "blframe"))
    }

    final class Writer {
        let owner: ImageDirectory
        let file: PartialFile

        init(owner: ImageDirectory, file: PartialFile) {
            self.owner = owner
            self.file = file
        }

        func write(_ bytes: UnsafeRawBufferPointer) throws { try file.write(bytes) }

        /// Names the finished image after its format and returns its path.
        func commit() throws -> String {
            let ext = ImageFormat(signature: file.head)?.fileExtension ?? "bin"
            // Another program (a second blframe) may have saved images meanwhile, under other
            // extensions too: a number taken under any of blframe's extensions is skipped. (A
            // few lookups, not a listing of the directory, which grows with every image.)
            while ImageDirectory.numberTaken(owner.next, in: owner.path) { owner.next += 1 }
            let (path, number) = try file.commit(first: owner.next) { ImageDirectory.name($0, ext) }
            owner.next = number + 1
            return path
        }

        func discard() { file.discard() }
    }
}
