import Glibc
import XCTest
@testable import BLCommand

final class PartialFileTests: XCTestCase {
    private func makeDirectory() -> String {
        var template = Array("/tmp/partialfile-XXXXXX".utf8CString)
        let path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
        addTeardownBlock { _ = try? self.remove(path) }
        return path
    }

    private func remove(_ dir: String) throws {
        for name in try DirectoryListing.names(in: dir) { unlink("\(dir)/\(name)") }
        rmdir(dir)
    }

    private func contents(_ path: String) -> String? {
        guard let f = fopen(path, "r") else { return nil }
        defer { fclose(f) }
        var out: [UInt8] = []
        while case let c = fgetc(f), c != EOF { out.append(UInt8(c)) }
        return String(decoding: out, as: UTF8.self)
    }

    /// The file appears under the first free name only when committed, never replaces a file
    /// that is there, and leaves no temporary behind: with a rename that does not replace, and
    /// with the hard link used where the file system has no such rename.
    func testCommitTakesTheFirstFreeNameAndReplacesNothing() throws {
        defer { PartialFile.renameNoReplaceWorks = true }
        for renameWorks in [true, false] {
            PartialFile.renameNoReplaceWorks = renameWorks
            let dir = makeDirectory()
            for n in [3, 4] {
                let f = fopen("\(dir)/\(n).txt", "w")!
                fputs("old \(n)", f)
                fclose(f)
            }
            let file = try PartialFile(directory: dir, prefix: "test")
            try Array("new".utf8).withUnsafeBytes { try file.write($0) }
            XCTAssertNil(contents("\(dir)/5.txt"), "nothing under a final name before commit")
            XCTAssertEqual(contents(file.temporaryPath), "new")
            let (path, number) = try file.commit(first: 3) { "\($0).txt" }
            XCTAssertEqual(path, "\(dir)/5.txt", "rename works: \(renameWorks)")
            XCTAssertEqual(number, 5)
            XCTAssertEqual(contents(path), "new")
            XCTAssertEqual(contents("\(dir)/3.txt"), "old 3")
            XCTAssertEqual(contents("\(dir)/4.txt"), "old 4")
            XCTAssertEqual(try DirectoryListing.names(in: dir).sorted(), ["3.txt", "4.txt", "5.txt"])
            XCTAssertEqual(PartialFile.renameNoReplaceWorks, renameWorks)
        }
    }

    /// A file finished (synced and closed) but never named is removed when it goes, as one
    /// still open is.
    func testAFileFinishedButNeverNamedLeavesNothing() throws {
        let dir = makeDirectory()
        var file: PartialFile? = try PartialFile(directory: dir, prefix: "test")
        try Array("x".utf8).withUnsafeBytes { try file!.write($0) }
        try file!.finish()
        XCTAssertEqual(try DirectoryListing.names(in: dir).count, 1)
        file = nil
        XCTAssertEqual(try DirectoryListing.names(in: dir), [])
    }

    func testCommitIntoAMissingDirectoryFailsAndRemovesTheTemporaryFile() throws {
        let dir = makeDirectory()
        let file = try PartialFile(directory: dir, prefix: "test")
        try Array("x".utf8).withUnsafeBytes { try file.write($0) }
        XCTAssertThrowsError(try file.commit(first: 1) { "missing/\($0).txt" }) { error in
            XCTAssertEqual((error as? ToolError)?.code, .cantCreate, "\(error)")
        }
        XCTAssertEqual(try DirectoryListing.names(in: dir), [])
    }
}
