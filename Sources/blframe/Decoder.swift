#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLCommand
import BLFrame

/// `blframe -d`: frames on standard input to bodies, image files or JSON lines on standard output.
/// A struct, not a class: its state changes a few times per frame, and a class's stored
/// properties would each cost a run-time exclusivity check there (a third of the decoding time of
/// 100-byte frames).
struct Decoder {
    let raw: Bool
    let json: Bool
    let images: ImageDirectory?
    var decoder: FrameDecoder
    let out = OutputBuffer(fd: 1)

    // The frame being decoded.
    private var header = FrameHeader(code: .notify, size: 0)
    private var lastByte: UInt8 = 0
    private var image: ImageDirectory.Writer?
    private var escaper = JSONStringEscaper()
    /// A T or U frame's text is being written (with --json: its object is open).
    private var textOpen = false
    /// Some of that text has been written.
    private var textStarted = false
    /// --resync: gaps said one by one so far; those after ``gapsSaidOneByOne`` are only counted,
    /// and said in one line when decoding ends (noisy input must not flood stderr).
    private var gapsSaid = 0
    private var gapsUnsaid = 0
    private var bytesUnsaid = 0
    static let gapsSaidOneByOne = 10

    init(options: ParsedOptions) throws {
        raw = options.has("raw")
        json = options.has("json")
        decoder = FrameDecoder(resync: options.has("resync"))
        if let path = options.string("images") {
            guard !path.isEmpty else { throw UsageError("--images wants a directory") }
            // Before the directory is created: an input that cannot be read leaves nothing.
            if let problem = FileIO.unreadable(0) { throw ToolError(.ioError, "stdin: \(problem)") }
            images = try ImageDirectory(path: path)
        } else {
            images = nil
        }
    }

    mutating func run() throws {
        let chunkSize = 256 * 1024
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: FileIO.bufferAlignment)
        defer { chunk.deallocate() }
        do {
            while true {
                let n: Int
                do {
                    n = try FileIO.readWaiting(0, into: chunk)
                } catch {
                    throw ToolError(.ioError, "stdin: \(error)")
                }
                if n == 0 { break }
                var input = UnsafeRawBufferPointer(rebasing: chunk[0..<n])
                while let event = try decoder.next(&input) {
                    try handle(event)
                }
                try flush()
            }
            let skipped = try decoder.finish()
            sayUnsaidGaps()
            if skipped > 0 {
                try flush()
                Tool.warn("skipped \(Decoder.bytes(skipped)) at the end that do not form a frame")
            }
        } catch {
            sayUnsaidGaps()
            // Whatever went wrong (bad input, an image that cannot be saved, a read error), the
            // frames completed before it are written, and a partial image is removed.
            image?.discard()
            image = nil
            // Every --json line stays one whole object: a text cut short says so. Without
            // --json a text cut short still ends its line (if any of it came), unless bodies
            // are written raw.
            if textOpen {
                textOpen = false
                if json {
                    try? closeJSONText(truncated: true)
                } else if !raw && textStarted && lastByte != 0x0A {
                    try? write("\n")
                }
            }
            let failure = (error as? FrameError).map { ToolError(.dataError, $0.description) } ?? error
            do {
                try flush()
            } catch let output as ToolError where output.code != .ok {
                // What came before could not be written either: that loss sets the exit status,
                // and the failure that stopped decoding is said first.
                if let failure = failure as? ToolError, !failure.message.isEmpty, failure.message != output.message {
                    Tool.warn(failure.message)
                }
                throw output
            } catch {
                // The reader went away: the failure still stands.
            }
            throw failure
        }
        try flush()
    }

    private mutating func handle(_ event: FrameDecoder.Event) throws {
        switch event {
        case .frameStart(let header):
            self.header = header
            lastByte = 0  // an empty body does not end with a newline, so it prints as an empty line
            textStarted = false
            try begin(header)
        case .body(let piece):
            try body(piece)
        case .frameEnd:
            try end()
        case .skipped(let count):
            guard gapsSaid < Decoder.gapsSaidOneByOne else {
                gapsUnsaid += 1
                bytesUnsaid += count
                return
            }
            gapsSaid += 1
            try flush()  // what came before the noise is printed before the note about it
            Tool.warn("skipped \(Decoder.bytes(count)) before the frame at byte \(decoder.frameOffset)"
                      + (gapsSaid == Decoder.gapsSaidOneByOne ? " (further gaps are counted and said at the end)" : ""))
        }
    }

    private mutating func begin(_ header: FrameHeader) throws {
        switch header.code {
        case .text, .url:
            textOpen = true
            if json {
                try write("{\"code\":\"\(header.code)\",\"size\":\(header.size),\"text\":\"")
                escaper = JSONStringEscaper()
            }
        case .image:
            if let images {
                // The frames before it are out before the image is written (and synced, which
                // can take long): nothing already decoded waits on it, or is lost with it.
                try flush()
                image = try images.begin()
            } else {
                try flush()
                Tool.warn("skipped an I frame of \(Decoder.bytes(header.size)) at byte \(decoder.frameOffset) "
                          + "(use --images DIR to save it)")
            }
        case .notify:
            break
        }
    }

    private mutating func body(_ piece: UnsafeRawBufferPointer) throws {
        switch header.code {
        case .text, .url:
            if json {
                var failure: Errno?
                escaper.escape(piece) { run in
                    if failure == nil {
                        do throws(Errno) { try out.write(run) } catch { failure = error }
                    }
                }
                if let failure { throw Encoder.outputError(failure) }
            } else {
                try write(piece)
                if let last = piece.last {
                    lastByte = last
                    textStarted = true
                }
            }
        case .image:
            try image?.write(piece)
        case .notify:
            break
        }
    }

    private mutating func end() throws {
        switch header.code {
        case .text, .url:
            textOpen = false
            if json {
                try closeJSONText(truncated: false)
            } else if !raw && lastByte != 0x0A {
                try write("\n")
            }
        case .image:
            let path = try image?.commit()
            image = nil
            if json {
                var object = JSONObject()
                object.add("code", "I")
                object.add("size", header.size)
                if let path { object.add("path", path) }
                try write(object.json + "\n")
            } else if let path {
                try write(path + "\n")
            }
        case .notify:
            if json { try write("{\"code\":\"N\",\"size\":0}\n") }
        }
    }

    /// "1 byte", "2 bytes".
    static func bytes(_ count: Int) -> String { count == 1 ? "1 byte" : "\(count) bytes" }

    private mutating func sayUnsaidGaps() {
        guard gapsUnsaid > 0 else { return }
        try? flush()
        Tool.warn("skipped \(Decoder.bytes(bytesUnsaid)) more, in \(gapsUnsaid) gap\(gapsUnsaid == 1 ? "" : "s") before frames")
        gapsUnsaid = 0
        bytesUnsaid = 0
    }

    /// Ends the open text object: `"}` or, for a frame the input cut short, `","truncated":true}`.
    private mutating func closeJSONText(truncated: Bool) throws {
        var failure: Errno?
        escaper.finish { run in
            do throws(Errno) { try out.write(run) } catch { failure = error }
        }
        if let failure { throw Encoder.outputError(failure) }
        try write(truncated ? "\",\"truncated\":true}\n" : "\"}\n")
    }

    private func write(_ bytes: UnsafeRawBufferPointer) throws {
        do { try out.write(bytes) } catch { throw Encoder.outputError(error) }
    }

    private func write(_ text: String) throws {
        do { try out.write(text) } catch { throw Encoder.outputError(error) }
    }

    private func flush() throws {
        do { try out.flush() } catch { throw Encoder.outputError(error) }
    }
}
