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
    /// The directory's modification time as blframe's own last change left it, and whether
    /// another program has changed the directory since (then it is listed again, once).
    private var ownChange: timespec?
    private var changedByOthers = false

    init(path: String) throws {
        var path = path
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        self.path = path
        try PartialFile.makeDirectories(self.path)
        // Numbering goes on after the highest number there: a directory that cannot be listed
        // is one blframe cannot number images in (73, as for an image it cannot create).
        do {
            next = (try ImageDirectory.highestNumber(in: self.path) ?? 0) + 1
        } catch {
            throw ToolError(.cantCreate, error.message)
        }
        ownChange = modificationTime()
    }

    private func modificationTime() -> timespec? {
        var st = stat()
        return stat(path, &st) == 0 ? st.st_mtim : nil
    }

    /// Notes whether the directory changed since blframe's own last change to it.
    private func lookForOthers() {
        guard let own = ownChange, let now = modificationTime(),
              now.tv_sec == own.tv_sec && now.tv_nsec == own.tv_nsec else {
            changedByOthers = true
            return
        }
    }

    /// The number to try first for the next image: after the highest one in the directory if
    /// another program changed it (listed again then only; a change within the clock's tick of
    /// one of blframe's own goes unseen, which the check of each number at commit covers).
    fileprivate func numberForNext() -> Int {
        lookForOthers()
        if changedByOthers, let highest = try? ImageDirectory.highestNumber(in: path), highest >= next {
            next = highest + 1
        }
        changedByOthers = false
        return next
    }

    /// Holds an exclusive lock on the directory among blframes (flock(2)) while an image is
    /// named: checking that a number is free under every extension and taking it under one are
    /// two steps, and two blframes saving at once had given one number to a PNG and a JPEG.
    /// Waits a second at most for another blframe (one stopped with ^Z while naming must not
    /// stop this one), and goes on without the lock where the file system has none (NFS).
    fileprivate func whileLocked<R>(_ body: () throws(ToolError) -> R) throws(ToolError) -> R {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        defer { if fd >= 0 { close(fd) } }  // closing releases the lock
        if fd >= 0 {
            for _ in 0..<200 {
                if flock(fd, LOCK_EX | LOCK_NB) == 0 || (errno != EWOULDBLOCK && errno != EINTR) { break }
                usleep(5_000)
            }
        }
        return try body()
    }

    fileprivate func committed(_ number: Int) {
        next = number + 1
        ownChange = modificationTime()
    }

    /// The highest image number in `directory`, whatever the extension (nil: none).
    static func highestNumber(in directory: String) throws(ToolError) -> Int? {
        try DirectoryListing.names(in: directory).compactMap(number).max()
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
        lookForOthers()
        let writer = Writer(owner: self, file: try PartialFile(directory: path, prefix: "blframe"))
        ownChange = modificationTime()  // the temporary file's creation
        return writer
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
            try file.finish()
            let directory = owner.path
            // Another program (a second blframe) may have saved images meanwhile, under other
            // extensions too. The directory is listed again only then: it grows with every image.
            // The listing only picks the number to try first (each is checked under the lock):
            // it is made before the lock, which is held for no longer than the naming.
            let first = owner.numberForNext()
            let (path, number) = try owner.whileLocked { () throws(ToolError) in
                try file.commit(first: first, name: { ImageDirectory.name($0, ext) },
                                skip: { ImageDirectory.numberTaken($0, in: directory) })
            }
            owner.committed(number)
            return path
        }

        func discard() { file.discard() }
    }
}
