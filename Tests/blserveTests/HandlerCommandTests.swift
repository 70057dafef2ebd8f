import XCTest
import Glibc
@testable import BLCommand
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

    /// An executable shell script at dir/name.
    private func script(_ name: String, running body: String) throws -> String {
        let path = dir + "/" + name
        try "#!/bin/sh\n\(body)\n".write(toFile: path, atomically: true, encoding: .utf8)
        XCTAssertEqual(chmod(path, 0o755), 0)
        return path
    }

    /// An executable script at dir/name that prints `text` and its $0.
    private func script(_ name: String, printing text: String) throws -> String {
        try script(name, running: "printf '%s:%s' \(text) \"$(basename \"$0\")\"")
    }

    /// Starts `command` as blserve does: on a thread, and once more after a search of PATH when the
    /// start failed with ENOENT.
    private func started(_ command: HandlerCommand, stdout: Subprocess.Stream = .pipe) throws(Errno) -> Subprocess {
        let starting = try command.start(children, environment: [], stdin: .null, stdout: stdout, stderr: .null)
        var heard: [Result<Subprocess, Errno>] = []
        starting.onStarted = { heard.append($0) }
        _ = loop.run(until: { !heard.isEmpty }, timeout: 10)
        // Told once, of the last try.
        _ = loop.run(until: { false }, timeout: 0.1)
        XCTAssertEqual(heard.count, 1)
        guard let result = starting.result else { throw Errno(ETIMEDOUT) }
        return try result.get()
    }

    private func output(_ command: HandlerCommand) throws -> String {
        let child = try started(command)
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

    func testOnlyAMissingFileIsSearchedForAgain() throws {
        let path = try script("handler-a", printing: "a")
        XCTAssertEqual(chmod(path, 0o644), 0)
        var lookups = 0
        let command = HandlerCommand(["handler"]) { _ in
            lookups += 1
            return path
        }
        XCTAssertThrowsError(try started(command, stdout: .null)) {
            XCTAssertEqual($0 as? Errno, Errno(EACCES))
        }
        XCTAssertEqual(lookups, 1, "PATH was searched again after a failure other than ENOENT")
    }

    func testNothingFoundFailsLikeExec() throws {
        let command = HandlerCommand(["no-such-handler-blpipe"]) { _ in nil }
        XCTAssertNil(command.resolvedPath)
        XCTAssertThrowsError(try started(command, stdout: .null)) {
            XCTAssertEqual($0 as? Errno, Errno(ENOENT))
        }
    }

    /// A handler that would run on: left running, it keeps the children busy.
    private func slowHandler() throws -> String {
        try script("handler-slow", running: "exec sleep 30")
    }

    func testACancelWhileTheSecondTryStartsEndsThatTry() throws {
        let path = try slowHandler()
        var lookups = 0
        let command = HandlerCommand(["handler"]) { _ in
            lookups += 1
            return lookups == 1 ? self.dir + "/gone" : path
        }
        // Every try is reported late, as a slow start is: the second is still being started when
        // the start is cancelled (as when its central goes away).
        children.reportDelay = 0.3
        let starting = try command.start(children, environment: [], stdin: .null, stdout: .pipe, stderr: .null)
        var told = false
        starting.onStarted = { _ in told = true }
        XCTAssertTrue(loop.run(until: { lookups == 2 }, timeout: 10))
        XCTAssertFalse(children.isIdle, "the second try is under way")
        starting.cancel()
        XCTAssertTrue(loop.run(until: { self.children.isIdle }, timeout: 10), "the second try was left running")
        _ = loop.run(until: { false }, timeout: 0.2)
        XCTAssertFalse(told)
        XCTAssertNil(starting.result)
    }

    func testAStartItsOwnerLetGoIsEndedOnceItHasStarted() throws {
        let path = try slowHandler()
        let command = HandlerCommand(["handler"]) { _ in path }
        children.reportDelay = 0.3
        var starting: HandlerStart? = try command.start(children, environment: [], stdin: .null, stdout: .pipe, stderr: .null)
        weak let released = starting
        starting = nil
        XCTAssertNil(released, "something else holds the start")
        XCTAssertFalse(children.isIdle)
        XCTAssertTrue(loop.run(until: { self.children.isIdle }, timeout: 10), "a process nobody wanted was left running")
    }
}
