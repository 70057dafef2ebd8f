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
            // extensions too: the number goes on after the highest one there now.
            if let names = try? DirectoryListing.names(in: owner.path),
               let highest = names.compactMap(ImageDirectory.number).max(), highest >= owner.next {
                owner.next = highest + 1
            }
            let (path, number) = try file.commit(first: owner.next) { ImageDirectory.name($0, ext) }
            owner.next = number + 1
            return path
        }

        func discard() { file.discard() }
    }
}
