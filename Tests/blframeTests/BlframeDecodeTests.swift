import Foundation
import XCTest
import BLTestSupport

final class BlframeDecodeTests: XCTestCase {
    func testTextBodiesGetANewlineUnlessTheyHaveOne() throws {
        let result = try runTool("blframe", ["-d"], input: data("T0000005helloN0000000U0000008http://xT0000003ab\nT0000000"))
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(result.stdoutText, "hello\nhttp://x\nab\n\n")
        XCTAssertEqual(result.stderr, "")
    }

    func testRawWritesBodiesExactly() throws {
        let result = try runTool("blframe", ["-d", "--raw"], input: data("T0000005helloT0000003ab\nN0000000"))
        XCTAssertEqual(result.stdoutText, "helloab\n")
    }

    func testEncodeExactThenDecodeRawReproducesAnyFile() throws {
        var rng = SeededGenerator(seed: 0xB1F4)
        var samples: [Data] = [Data(), data("\n"), data("line\n"), data("\n\n"), randomData(1, &rng)]
        for _ in 0..<6 { samples.append(randomData(Int.random(in: 0...200_000, using: &rng), &rng)) }
        samples.append(randomData(9_999_999, &rng))
        for (i, sample) in samples.enumerated() {
            let framed = try runTool("blframe", ["-c", "T", "--exact"], input: sample)
            XCTAssertEqual(framed.status, 0, "sample \(i)")
            let back = try runTool("blframe", ["-d", "--raw"], input: framed.stdout)
            XCTAssertEqual(back.status, 0, "sample \(i): \(back.stderr)")
            XCTAssertTrue(back.stdout == sample, "sample \(i) of \(sample.count) bytes did not round-trip")
        }
    }

    func testImagesAreSavedNamedAndNeverOverwritten() throws {
        let dir = try temporaryDirectory(self).appendingPathComponent("out")
        let png = pngHeader + Data([1, 2, 3])
        let jpeg = jpegHeader + Data([9])
        let other = data("not an image")
        var stream = data("I\(String(format: "%07d", png.count))") + png
        stream += data("T0000002hi")
        stream += data("I\(String(format: "%07d", jpeg.count))") + jpeg
        stream += data("I\(String(format: "%07d", other.count))") + other
        let result = try runTool("blframe", ["-d", "--images", dir.path], input: stream)
        XCTAssertEqual(result.status, 0, result.stderr)
        let paths = ["000001.png", "000002.jpg", "000003.bin"].map { dir.appendingPathComponent($0).path }
        XCTAssertEqual(result.stdoutText, "\(paths[0])\nhi\n\(paths[1])\n\(paths[2])\n")
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: paths[0])), png)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: paths[1])), jpeg)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: paths[2])), other)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted(),
                       ["000001.png", "000002.jpg", "000003.bin"], "no temporary files may remain")

        // A second run continues the numbering and never replaces an existing file (the
        // directory's trailing slashes do not show in the paths).
        try data("keep me").write(to: dir.appendingPathComponent("000004.png"))
        let again = try runTool("blframe", ["-d", "-i", dir.path + "//"], input: data("I\(String(format: "%07d", png.count))") + png)
        XCTAssertEqual(again.stdoutText, dir.appendingPathComponent("000005.png").path + "\n")
        XCTAssertEqual(try Data(contentsOf: dir.appendingPathComponent("000004.png")), data("keep me"))
    }

    func testPartialImageIsRemovedOnMalformedInput() throws {
        let dir = try temporaryDirectory(self)
        let stream = data("T0000002hiI0000100") + pngHeader  // ends 92 bytes early
        let result = try runTool("blframe", ["-d", "--images", dir.path], input: stream)
        XCTAssertEqual(result.status, 65)
        XCTAssertEqual(result.stdoutText, "hi\n", "the complete frame before the error must be written")
        XCTAssertEqual(result.stderr, "blframe: input ends inside an I frame (8 of 100 body bytes) at byte 26\n")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), [], "partial image left behind")
    }

    /// An image that cannot be saved ends the run (74 here: the file size limit, with SIGXFSZ
    /// ignored as the shell leaves it, so the write fails) after the frames completed before it
    /// in the same read are written, and leaves no partial file.
    func testFramesBeforeAnImageThatCannotBeSavedAreWritten() throws {
        let dir = try temporaryDirectory(self)
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let result = try runProgram("/bin/bash", ["-c", "trap '' XFSZ; ulimit -f 0; exec \"$0\" -d -i \"$1\"", blframe, dir.path],
                                    input: data("T0000002hiI0000003abcT0000002no"))
        let err = result.stderr
        XCTAssertEqual(result.status, 74, err)
        XCTAssertEqual(result.stdoutText, "hi\n", "the frame before the image must be written, nothing after it")
        // The message names the directory, not the hidden temporary file that is gone.
        XCTAssertEqual(err, "blframe: writing a file in \(dir.path): File too large\n")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), [], "partial image left behind")
    }

    /// The frames before an image are out before the image is written: a signal that ends
    /// blframe while it writes one (SIGXFSZ here, at its default) loses none of them.
    func testFramesBeforeAnImageAreOutBeforeItIsWritten() throws {
        let dir = try temporaryDirectory(self)
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let result = try runProgram("/bin/bash", ["-c", "trap - XFSZ; ulimit -f 0; exec \"$0\" -d -i \"$1\"", blframe, dir.path],
                                    input: data("T0000002hiI0000003abc"))
        XCTAssertEqual(result.status, 128 + SIGXFSZ, result.stderr)
        XCTAssertEqual(result.stdoutText, "hi\n", "the frame before the image was lost with it")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), [], "partial image left behind")
    }

    /// Waits (at most 10 s) until `dir` holds the partial file of process `pid`, looking every
    /// `interval` microseconds (0: without a pause).
    private func waitForPartialFile(in dir: URL, of pid: pid_t, interval: UInt32 = 20_000) throws -> Bool {
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if try FileManager.default.contentsOfDirectory(atPath: dir.path).contains(where: { $0.hasPrefix(".blframe-\(pid)-") }) {
                return true
            }
            if interval > 0 { usleep(interval) }
        }
        return false
    }

    /// A signal that comes the moment the partial file appears removes it too (it once came
    /// before blframe had armed the cleanup, in about a third of the tries).
    func testSignalAsThePartialFileAppears() throws {
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        for attempt in 1...30 {
            let dir = try temporaryDirectory(self)
            let killed = try Spawned(blframe, ["-d", "-i", dir.path])
            killed.send(data("I0000010abc"))
            XCTAssertTrue(try waitForPartialFile(in: dir, of: killed.pid, interval: 0))
            kill(killed.pid, SIGUSR1)
            XCTAssertEqual(killed.wait(), 128 + SIGUSR1)
            XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), [], "partial image left behind (try \(attempt))")
        }
    }

    /// A signal that ends blframe mid-image removes the partial file (SIGUSR1 as well as
    /// SIGTERM); one it was started with ignored (`nohup`: SIGHUP) stays ignored, and the image
    /// is saved whole.
    func testSignalsMidImage() throws {
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let dir = try temporaryDirectory(self)
        let killed = try Spawned(blframe, ["-d", "-i", dir.path])
        killed.send(data("I0000010abc"))
        XCTAssertTrue(try waitForPartialFile(in: dir, of: killed.pid))
        kill(killed.pid, SIGUSR1)
        XCTAssertEqual(killed.wait(), 128 + SIGUSR1)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), [], "partial image left behind")

        // bash execs blframe: the same pid.
        let nohup = try Spawned("/bin/bash", ["-c", "trap '' HUP; exec \"$0\" -d -i \"$1\"", blframe, dir.path])
        nohup.send(data("I0000010abc"))
        XCTAssertTrue(try waitForPartialFile(in: dir, of: nohup.pid))
        kill(nohup.pid, SIGHUP)
        usleep(200_000)
        nohup.feed(data("defghij"))
        let out = String(decoding: Spawned.readAll(nohup.stdout), as: UTF8.self)
        XCTAssertEqual(nohup.wait(), 0, "an ignored SIGHUP ended blframe")
        XCTAssertEqual(out, dir.path + "/000001.bin\n")
        XCTAssertEqual(try Data(contentsOf: dir.appendingPathComponent("000001.bin")), data("abcdefghij"))
    }

    /// A temporary file left by a killed blframe whose pid this one has is passed over, not
    /// an error, and not touched.
    func testStaleTemporaryFileIsPassedOver() throws {
        let dir = try temporaryDirectory(self)
        let process = try Spawned(productsDirectory.appendingPathComponent("blframe").path, ["-d", "-i", dir.path])
        let stale = dir.appendingPathComponent(".blframe-\(process.pid)-1.part")
        try data("stale").write(to: stale)
        process.feed(data("I0000003abc"))
        let out = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
        let err = String(decoding: Spawned.readAll(process.stderr), as: UTF8.self)
        XCTAssertEqual(process.wait(), 0, err)
        XCTAssertEqual(out, dir.path + "/000001.bin\n")
        XCTAssertEqual(try Data(contentsOf: stale), data("stale"))
    }

    /// --images that cannot be a directory: 73, with what is in the way.
    func testImagesDirectoryInTheWay() throws {
        let dir = try temporaryDirectory(self)
        try data("x").write(to: dir.appendingPathComponent("file"))
        try FileManager.default.createSymbolicLink(atPath: dir.appendingPathComponent("dangling").path,
                                                   withDestinationPath: dir.appendingPathComponent("nowhere").path)
        for (argument, message) in [("file/sub", "file: not a directory"), ("dangling", "dangling: a symbolic link to nothing")] {
            let result = try runTool("blframe", ["-d", "-i", dir.appendingPathComponent(argument).path], input: data("T0000002hi"))
            XCTAssertEqual(result.status, 73, argument)
            XCTAssertEqual(result.stderr, "blframe: \(dir.path)/\(message)\n")
        }
    }

    func testImageWithoutImagesDirIsReportedAndSkipped() throws {
        let png = pngHeader + Data([0x1B, 0x5B])
        let result = try runTool("blframe", ["-d"], input: data("I0000010") + png + data("T0000002ok"))
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(result.stdoutText, "ok\n", "image bytes must never reach stdout")
        XCTAssertTrue(result.stderr.contains("I frame of 10 bytes"), result.stderr)
    }

    func testJSONLines() throws {
        let dir = try temporaryDirectory(self)
        let png = pngHeader
        let stream = data("T0000004a\"\\\nN0000000U0000003\u{e9}x") + data("I0000008") + png + data("T0000001") + Data([0xFF])
        let result = try runTool("blframe", ["-d", "--json", "--images", dir.path], input: stream)
        XCTAssertEqual(result.status, 0, result.stderr)
        let lines = result.stdoutText.split(separator: "\n").map(String.init)
        XCTAssertEqual(lines, [
            #"{"code":"T","size":4,"text":"a\"\\\n"}"#,
            #"{"code":"N","size":0}"#,
            #"{"code":"U","size":3,"text":"éx"}"#,
            #"{"code":"I","size":8,"path":"\#(dir.path)/000001.png"}"#,
            #"{"code":"T","size":1,"text":"\#u{FFFD}"}"#,
        ])
        for line in lines {
            XCTAssertNoThrow(try JSONSerialization.jsonObject(with: data(line)), line)
        }
    }

    func testJSONTextCutShortEndsAsAWholeObjectMarkedTruncated() throws {
        let result = try runTool("blframe", ["-d", "--json"], input: data("T0000002hiU0000005ht\u{e9}"))
        XCTAssertEqual(result.status, 65)
        XCTAssertEqual(result.stdoutText, #"{"code":"T","size":2,"text":"hi"}"# + "\n"
                       + #"{"code":"U","size":5,"text":"ht\#u{e9}","truncated":true}"# + "\n")
        for line in result.stdoutText.split(separator: "\n") {
            XCTAssertNoThrow(try JSONSerialization.jsonObject(with: data(String(line))), String(line))
        }
        XCTAssertTrue(result.stderr.contains("input ends inside a U frame"), result.stderr)
    }

    /// A standard input left non-blocking by another program sharing it is waited for, not an
    /// I/O error (EAGAIN) on the first read that finds it empty.
    func testNonBlockingStdinIsWaitedFor() throws {
        // Should blframe fail, the write below must fail with EPIPE, not end the test process.
        ignoreSIGPIPE()
        for arguments in [["-d"], ["-c", "T"], ["--lines"]] {
            let (readEnd, writeEnd) = try Spawned.pipe()
            let p = [readEnd, writeEnd]
            XCTAssertEqual(fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK), 0)
            let process = try Spawned(productsDirectory.appendingPathComponent("blframe").path, arguments, stdin: .fd(p[0]))
            close(p[0])
            usleep(300_000)  // blframe finds its input empty first
            let input = arguments == ["-d"] ? "T0000002hi" : "hi"
            XCTAssertEqual(write(p[1], input, input.utf8.count), input.utf8.count)
            close(p[1])
            let group = DispatchGroup()
            nonisolated(unsafe) var outData = Data(), errData = Data()
            DispatchQueue.global().async(group: group) { outData = Spawned.readAll(process.stdout) }
            DispatchQueue.global().async(group: group) { errData = Spawned.readAll(process.stderr) }
            group.wait()
            let out = String(decoding: outData, as: UTF8.self)
            let err = String(decoding: errData, as: UTF8.self)
            XCTAssertEqual(process.wait(), 0, "\(arguments): \(err)")
            XCTAssertEqual(out, arguments == ["-d"] ? "hi\n" : "T0000002hi", "\(arguments)")
        }
    }

    /// Another program saving into the same folder while an image arrives: the image takes the
    /// number after the highest one there when it is complete, whatever the extension.
    func testImageNumberFollowsImagesSavedMeanwhile() throws {
        ignoreSIGPIPE()
        let dir = try temporaryDirectory(self)
        let (readEnd, writeEnd) = try Spawned.pipe()
        let process = try Spawned(productsDirectory.appendingPathComponent("blframe").path, ["-d", "--images", dir.path],
                                  stdin: .fd(readEnd))
        close(readEnd)
        let frame = data("I0000008") + pngHeader
        frame.prefix(10).withUnsafeBytes { XCTAssertEqual(write(writeEnd, $0.baseAddress, 10), 10) }
        usleep(300_000)  // blframe has begun the image
        XCTAssertTrue(FileManager.default.createFile(atPath: dir.appendingPathComponent("000007.jpg").path, contents: Data("x".utf8)))
        frame.dropFirst(10).withUnsafeBytes { XCTAssertEqual(write(writeEnd, $0.baseAddress, $0.count), $0.count) }
        close(writeEnd)
        let out = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
        XCTAssertEqual(process.wait(), 0)
        XCTAssertEqual(out, dir.path + "/000008.png\n")
    }

    /// Two blframes saving into one folder at once: every image gets a number of its own, also
    /// when their formats differ (a rename that does not replace only guards the one name, so
    /// 000002.png and 000002.jpg had both been made).
    func testTwoBlframesSavingIntoOneFolderNeverShareANumber() throws {
        let base = try temporaryDirectory(self)
        let dir = base.appendingPathComponent("out")
        for (name, first, second) in [("a", pngHeader, jpegHeader), ("b", jpegHeader, pngHeader)] {
            var stream = Data()
            for i in 0..<2000 {
                let body = (i % 2 == 0 ? first : second) + Data([UInt8(i & 0xFF)])
                stream += data("I\(String(format: "%07d", body.count))") + body
            }
            try stream.write(to: base.appendingPathComponent(name))
        }
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let both = try runProgram("/bin/sh", ["-c", "\"$0\" -d -i out < a > a.out & \"$0\" -d -i out < b > b.out; s=$?; wait $! && exit $s", blframe],
                                  cwd: base)
        XCTAssertEqual(both.status, 0, both.stderr)
        let names = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        XCTAssertEqual(names.count, 4000)
        let numbers = names.compactMap { $0.split(separator: ".").first.flatMap { Int($0) } }
        XCTAssertEqual(Set(numbers).count, 4000, "numbers used twice: \(4000 - Set(numbers).count)")
        let printed = try ["a.out", "b.out"].flatMap {
            try String(contentsOf: base.appendingPathComponent($0), encoding: .utf8).split(separator: "\n").map(String.init)
        }
        XCTAssertEqual(Set(printed), Set(names.map { "out/" + $0 }))
    }

    func testImageNumbersTooLargeToCountOnAreIgnored() throws {
        let dir = try temporaryDirectory(self)
        for name in ["9223372036854775807.png", "99999999999999999999.png", "000007.png"] {
            XCTAssertTrue(FileManager.default.createFile(atPath: dir.appendingPathComponent(name).path, contents: Data("x".utf8)))
        }
        let result = try runTool("blframe", ["-d", "--images", dir.path], input: data("I0000008") + pngHeader)
        XCTAssertEqual(result.status, 0, result.stderr)
        XCTAssertEqual(result.stdoutText, dir.path + "/000008.png\n")
    }

    func testMalformedInputReportsOffsetAfterWritingEarlierFrames() throws {
        let result = try runTool("blframe", ["-d"], input: data("T0000002okT00x0000"))
        XCTAssertEqual(result.status, 65)
        XCTAssertEqual(result.stdoutText, "ok\n")
        // A text cut short still ends its line (not with --raw).
        let cut = try runTool("blframe", ["-d"], input: data("T0000002okT0000005hel"))
        XCTAssertEqual(cut.status, 65)
        XCTAssertEqual(cut.stdoutText, "ok\nhel\n")
        // A text of which nothing came prints nothing, not an empty line (an empty frame's).
        let none = try runTool("blframe", ["-d"], input: data("T0000002okT0000005"))
        XCTAssertEqual(none.status, 65)
        XCTAssertEqual(none.stdoutText, "ok\n")
        XCTAssertEqual(try runTool("blframe", ["-d", "--raw"], input: data("T0000005hel")).stdoutText, "hel")
        XCTAssertEqual(result.stderr, "blframe: non-digit 'x' (0x78) in the size field at byte 13\n")
        let unknown = try runTool("blframe", ["-d"], input: data("hello"))
        XCTAssertEqual(unknown.status, 65)
        XCTAssertEqual(unknown.stderr, "blframe: unknown frame code 'h' (0x68) at byte 0\n")
    }

    func testResyncSkipsNoise() throws {
        let result = try runTool("blframe", ["-d", "--resync"], input: data("junk\nT0000002hi~~N0000000T0000003yes"))
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(result.stdoutText, "hi\nyes\n")
        XCTAssertEqual(result.stderr, "blframe: skipped 5 bytes before the frame at byte 5\nblframe: skipped 2 bytes before the frame at byte 17\n")
    }

    /// Noisy input does not flood stderr: the first ten gaps are said one by one, the rest in
    /// one line at the end.
    func testResyncSaysTenGapsThenCounts() throws {
        var input = Data()
        for _ in 0..<15 { input += data("~~T0000001x") }
        let result = try runTool("blframe", ["-d", "--resync"], input: input)
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(result.stdoutText, String(repeating: "x\n", count: 15))
        let lines = result.stderr.split(separator: "\n")
        XCTAssertEqual(lines.count, 11, result.stderr)
        XCTAssertEqual(lines.first, "blframe: skipped 2 bytes before the frame at byte 2")
        XCTAssertEqual(lines[9], "blframe: skipped 2 bytes before the frame at byte 101 (further gaps are counted and said at the end)")
        XCTAssertEqual(lines.last, "blframe: skipped 10 bytes more, in 5 gaps before frames")
    }

    /// An input that cannot be read is said before --images creates anything.
    func testUnreadableInputCreatesNoImagesDirectory() throws {
        let dir = try temporaryDirectory(self)
        let images = dir.appendingPathComponent("a/b").path
        let result = try runProgram("/bin/sh", ["-c", "exec \"$0\" -d --images \"$1\" < \"$2\"",
                                                productsDirectory.appendingPathComponent("blframe").path, images, dir.path])
        XCTAssertEqual(result.status, 74)
        XCTAssertEqual(result.stderr, "blframe: stdin: Is a directory\n")
        XCTAssertFalse(FileManager.default.fileExists(atPath: dir.appendingPathComponent("a").path), "the directory was created")
    }

    /// A note about skipped input comes after the output of the frames before it.
    func testNotesFollowTheOutputBeforeThem() throws {
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let result = try runProgram("/bin/bash", ["-c", "exec \"$0\" -d --resync 2>&1", blframe],
                                    input: data("T0000002hiI0000001aT0000002yo~T0000002ok"))
        XCTAssertEqual(result.status, 0)
        XCTAssertEqual(result.stdoutText, "hi\nblframe: skipped an I frame of 1 byte at byte 10 (use --images DIR to save it)\n"
                       + "yo\nblframe: skipped 1 byte before the frame at byte 30\nok\n")
    }

    /// Bad input after frames that could not be written: the lost output sets the status (74),
    /// and both failures are said, the input's first.
    func testOutputErrorIsNotHiddenByBadInputAfterIt() throws {
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        let result = try runProgram("/bin/bash", ["-c", "exec \"$0\" -d >/dev/full", blframe], input: data("T0000002hi\n"))
        XCTAssertEqual(result.status, 74)
        XCTAssertEqual(result.stderr, "blframe: unknown frame code 0x0a at byte 10\nblframe: stdout: No space left on device\n")
        // The output failing first (a frame too large to hold back) is said once.
        let large = try runProgram("/bin/bash", ["-c", "exec \"$0\" -d >/dev/full", blframe],
                                   input: data("T0300000" + String(repeating: "a", count: 300_000) + "\n"))
        XCTAssertEqual(large.status, 74)
        XCTAssertEqual(large.stderr, "blframe: stdout: No space left on device\n")
    }

    func testClosedStdoutEndsQuietly() throws {
        // `blframe … | head -c 1`: the reader goes away; blframe must stop at once, with 0 and
        // nothing on stderr, decoding, encoding a whole input or encoding lines.
        let blframe = productsDirectory.appendingPathComponent("blframe").path
        for (feed, arguments) in [("yes T0000001a | tr -d '\\n' | head -c 10000000", "-d"),
                                  ("head -c 5000000 /dev/zero", "-c I"),
                                  ("yes hello | head -c 10000000", "--lines")] {
            // blframe's stderr is the test's to read; the feeding commands' is not.
            let index = feed.filter { $0 == "|" }.count + 1
            let script = "exec 3>&2 2>/dev/null; \(feed) | \"$0\" \(arguments) 2>&3 | head -c 1 >/dev/null; echo \"status=${PIPESTATUS[\(index)]}\""
            let result = try runProgram("/bin/bash", ["-c", script, blframe])
            XCTAssertEqual(result.stdoutText, "status=0\n", "blframe \(arguments) after head closed the pipe")
            XCTAssertEqual(result.stderr, "", "blframe \(arguments)")
        }
    }
}

/// A fresh temporary directory, removed at the end of the test.
func temporaryDirectory(_ test: XCTestCase) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("blframe-test-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    test.addTeardownBlock { try? FileManager.default.removeItem(at: url) }
    return url
}
