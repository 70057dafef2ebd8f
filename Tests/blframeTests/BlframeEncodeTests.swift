import Foundation
import XCTest
import BLTestSupport

final class BlframeEncodeTests: XCTestCase {
    func testDefaultIsTextAndDropsOneTrailingNewline() throws {
        let result = try runTool("blframe", [], input: data("hello\n"))
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(result.stdoutText, "T0000005hello")
        XCTAssertEqual(try runTool("blframe", [], input: data("two\n\n")).stdoutText, "T0000004two\n")
        XCTAssertEqual(try runTool("blframe", [], input: data("")).stdoutText, "T0000000")
    }

    func testExactKeepsEveryByte() throws {
        XCTAssertEqual(try runTool("blframe", ["--exact"], input: data("hello\n")).stdoutText, "T0000006hello\n")
        XCTAssertEqual(try runTool("blframe", ["-c", "U", "-e"], input: data("x\n")).stdoutText, "U0000002x\n")
    }

    func testCodeChoice() throws {
        XCTAssertEqual(try runTool("blframe", ["-c", "U"], input: data("http://host/a.png\n")).stdoutText, "U0000017http://host/a.png")
        XCTAssertEqual(try runTool("blframe", ["-cU"], input: data("x")).stdoutText, "U0000001x")
        XCTAssertEqual(try runTool("blframe", ["--code=t"], input: data("x")).stdoutText, "T0000001x")
        // I frames always keep every byte, including a final newline.
        XCTAssertEqual(try runTool("blframe", ["-c", "I"], input: data("ab\n")).stdout, data("I0000003ab\n"))
    }

    func testAutoPicksURLImageOrText() throws {
        XCTAssertEqual(try runTool("blframe", ["-c", "auto"], input: data("http://host/a.png\n")).stdoutText, "U0000017http://host/a.png")
        XCTAssertEqual(try runTool("blframe", ["-c", "auto"], input: data("hello\n")).stdoutText, "T0000005hello")
        let png = pngHeader + Data([0, 1, 0x0A])
        XCTAssertEqual(try runTool("blframe", ["-c", "auto"], input: png).stdout, data("I0000011") + png)
        let jpeg = jpegHeader + Data([0x0A])
        XCTAssertEqual(try runTool("blframe", ["-c", "auto"], input: jpeg).stdout, data("I0000005") + jpeg)
    }

    func testNotifyFrameDoesNotReadStdin() throws {
        // stdin stays open and empty: the tool must not wait for it.
        let process = try Spawned(productsDirectory.appendingPathComponent("blframe").path, ["-c", "N"], stderr: .inherit)
        let deadline = Date().addingTimeInterval(5)
        while !process.hasEnded && Date() < deadline { usleep(10_000) }
        XCTAssertTrue(process.hasEnded, "blframe -c N waited for stdin")
        process.terminate()
        process.wait()
        XCTAssertEqual(String(decoding: Spawned.readAll(process.stdout), as: UTF8.self), "N0000000")
        process.closeStdin()
    }

    func testLinesMakesOneFramePerLine() throws {
        let result = try runTool("blframe", ["--lines"], input: data("a\nbb\n\nhttp://x\nlast"))
        XCTAssertEqual(result.stdoutText, "T0000001aT0000002bbT0000000T0000008http://xT0000004last")
        let auto = try runTool("blframe", ["-l", "-c", "auto"], input: data("hi\nhttp://x\n"))
        XCTAssertEqual(auto.stdoutText, "T0000002hiU0000008http://x")
    }

    func testLinesEmitsEachFrameBeforeStdinCloses() throws {
        let process = try Spawned(productsDirectory.appendingPathComponent("blframe").path, ["--lines"], stderr: .inherit)
        defer {
            process.closeStdin()
            process.wait()
        }
        let reader = FileHandle(fileDescriptor: process.stdout, closeOnDealloc: false)
        for (line, expected) in [("first", "T0000005first"), ("second line", "T0000011second line")] {
            process.send(data(line + "\n"))
            var received = Data()
            let deadline = Date().addingTimeInterval(5)
            while received.count < expected.utf8.count && Date() < deadline {
                var fds = pollfd(fd: reader.fileDescriptor, events: Int16(POLLIN), revents: 0)
                if poll(&fds, 1, 100) > 0 { received += reader.availableData }
            }
            XCTAssertEqual(String(decoding: received, as: UTF8.self), expected, "frame not emitted while stdin is open")
        }
    }

    func testLargestBodyIsAcceptedAndOneMoreIsRefused() throws {
        let limit = 9_999_999
        let ok = try runTool("blframe", ["-c", "I"], input: Data(repeating: 0x41, count: limit))
        XCTAssertEqual(ok.status, 0)
        XCTAssertEqual(ok.stdout.count, limit + 8)
        XCTAssertEqual(ok.stdout.prefix(8), data("I9999999"))

        let over = try runTool("blframe", ["-c", "I"], input: Data(repeating: 0x41, count: limit + 1))
        XCTAssertEqual(over.status, 65)
        XCTAssertEqual(over.stdout.count, 0, "nothing may be written for an oversized body")
        XCTAssertTrue(over.stderr.hasPrefix("blframe: "), over.stderr)
        XCTAssertTrue(over.stderr.contains("9999999"), over.stderr)
        XCTAssertEqual(over.stderr.filter { $0 == "\n" }.count, 1, "one line: \(over.stderr)")

        // A T body that is one byte over only because of echo's newline still fits.
        let trimmed = try runTool("blframe", [], input: Data(repeating: 0x41, count: limit) + data("\n"))
        XCTAssertEqual(trimmed.status, 0)
        XCTAssertEqual(trimmed.stdout.count, limit + 8)
    }

    /// The size of a file on standard input counts from where its offset stands.
    func testFileReadFromItsMiddleIsMeasuredFromThere() throws {
        let dir = try temporaryDirectory(self)
        let file = dir.appendingPathComponent("big")
        try Data(repeating: 0x41, count: 9_999_999 + 100).write(to: file)
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let result = try runProgram("/bin/bash", ["-c", "{ dd bs=200 count=1 of=/dev/null status=none; exec \"$0\" -c I; } <\"$1\" | wc -c",
                                                  blframe, file.path])
        let err = result.stderr
        XCTAssertEqual(result.status, 0, err)
        XCTAssertEqual(result.stdoutText, "\(9_999_999 - 100 + 8)\n", err)
    }

    func testOversizedLineKeepsEarlierFrames() throws {
        let input = data("ok\n") + Data(repeating: 0x41, count: 10_000_000) + data("\nnever\n")
        let result = try runTool("blframe", ["--lines"], input: input)
        XCTAssertEqual(result.status, 65)
        XCTAssertEqual(result.stdoutText, "T0000002ok")
        XCTAssertTrue(result.stderr.contains("limit"), result.stderr)
    }

    func testUsageErrors() throws {
        for arguments in [["--bogus"], ["-c", "X"], ["-c"], ["--raw"], ["-d", "--lines"], ["extra"], ["-c", "N", "--lines"],
                          ["--lines", "--exact"], ["-d", "--json", "--raw"], ["-", "-"], ["-d", "file"], ["--", "--help"]] {
            let result = try runTool("blframe", arguments)
            XCTAssertEqual(result.status, 64, "\(arguments)")
            XCTAssertEqual(result.stdout.count, 0, "\(arguments)")
            XCTAssertTrue(result.stderr.hasPrefix("blframe: ") && result.stderr.contains("--help"), "\(arguments): \(result.stderr)")
            XCTAssertEqual(result.stderr.filter { $0 == "\n" }.count, 1, "\(arguments): \(result.stderr)")
        }
        XCTAssertTrue(try runTool("blframe", ["--line"]).stderr.contains("did you mean '--lines'"))
        XCTAssertEqual(try runTool("blframe", ["extra"]).stderr,
                       "blframe: reads standard input only: '-' is the one operand it takes, not 'extra'; try 'blframe --help'\n")
    }

    /// `-` names standard input, as for any filter.
    func testDashIsStandardInput() throws {
        XCTAssertEqual(try runTool("blframe", ["-"], input: data("hi\n")).stdoutText, "T0000002hi")
        XCTAssertEqual(try runTool("blframe", ["-d", "-"], input: data("T0000002hi")).stdoutText, "hi\n")
    }

    /// An argument that is not UTF-8 is refused rather than changed (Swift would make the byte
    /// U+FFFD, and --images another directory).
    func testArgumentsThatAreNotUTF8AreRefused() throws {
        let dir = try temporaryDirectory(self)
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let result = try runProgram("/bin/bash", ["-c", "exec \"$0\" -d -i \"$1\"/$'\\xff'dir </dev/null", blframe, dir.path])
        let err = result.stderr
        XCTAssertEqual(result.status, 64, err)
        XCTAssertTrue(err.hasPrefix("blframe: argument 3 is not valid UTF-8 (\(dir.path)/\\xffdir)"), err)
        XCTAssertEqual(err.filter { $0 == "\n" }.count, 1, err)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), [], "a directory was made")
    }

    func testHelpAndVersion() throws {
        let help = try runTool("blframe", ["--help"])
        XCTAssertEqual(help.status, 0)
        XCTAssertTrue(help.stdoutText.hasPrefix("usage: blframe"))
        XCTAssertTrue(help.stdoutText.contains("--images DIR"))
        XCTAssertEqual(help.stderr, "")
        let version = try runTool("blframe", ["--version"])
        XCTAssertEqual(version.status, 0)
        XCTAssertTrue(version.stdoutText.hasPrefix("blframe "))
    }
}
