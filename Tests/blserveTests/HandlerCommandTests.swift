import XCTest
import Glibc
import BLCommand
import BLTestSupport
@testable import blserve

final class HandlerCommandTests: XCTestCase {
    private var loop: EventLoop!
    private var children: ChildProcesses!
    private var dir: String!

    override func setUpWithError() throws {
        loop = EventLoop()
        children = try ChildProcesses(loop: loop)
        var template = Array("/tmp/blserve-cmd.XXXXXX".utf8CString)
        dir = String(cString: try XCTUnwrap(mkdtemp(&template)))
    }

    override func tearDown() {
        children?.terminateAll(signal: SIGKILL, grace: 1)
        children = nil
        loop = nil
        if let dir { _ = try? FileManager.default.removeItem(atPath: dir) }
    }

    /// An executable script at dir/name that prints `text` and its $0.
    private func script(_ name: String, printing text: String) throws -> String {
        let path = dir + "/" + name
        try "#!/bin/sh\nprintf '%s:%s' \(text) \"$(basename \"$0\")\"\n".write(toFile: path, atomically: true, encoding: .utf8)
        XCTAssertEqual(chmod(path, 0o755), 0)
        return path
    }

    private func output(_ command: HandlerCommand) throws -> String {
        let child = try command.spawn(children, environment: [], stdin: .null, stdout: .pipe, stderr: .inherit)
        let out = try XCTUnwrap(readPipe(child.stdoutFD, on: loop), "stdout did not end")
        _ = loop.run(until: { child.status != nil }, timeout: 10)
        XCTAssertEqual(child.status, .exited(0))
        return String(decoding: out, as: UTF8.self)
    }

    func testLooksUpOnceAndRunsTheFileFoundUnderItsName() throws {
        let first = try script("handler-a", printing: "a")
        var lookups = 0
        let command = HandlerCommand(["handler"]) { name in
            lookups += 1
            return name == "handler" ? first : nil
        }
        XCTAssertEqual(command.resolvedPath, first)
        XCTAssertEqual(try output(command), "a:handler-a")
        XCTAssertEqual(try output(command), "a:handler-a")
        XCTAssertEqual(lookups, 1, "PATH was searched again for a file that is still there")
    }

    func testSearchesAgainWhenTheFileIsGone() throws {
        let first = try script("handler-a", printing: "a")
        var found = first
        var lookups = 0
        let command = HandlerCommand(["handler"]) { _ in
            lookups += 1
            return found
        }
        XCTAssertEqual(try output(command), "a:handler-a")
        XCTAssertEqual(unlink(first), 0)
        found = try script("handler-b", printing: "b")
        XCTAssertEqual(try output(command), "b:handler-b")
        XCTAssertEqual(command.resolvedPath, found)
        XCTAssertEqual(lookups, 2)
    }

    func testNothingFoundFailsLikeExec() throws {
        let command = HandlerCommand(["no-such-handler-blpipe"]) { _ in nil }
        XCTAssertNil(command.resolvedPath)
        XCTAssertThrowsError(try command.spawn(children, environment: [], stdin: .null, stdout: .null, stderr: .null)) {
            XCTAssertEqual($0 as? Errno, Errno(ENOENT))
        }
    }
}
