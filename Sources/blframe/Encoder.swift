#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLCommand
import BLFrame

/// `blframe [-c CODE] [--exact] [--lines]`: standard input to frames.
struct Encoder {
    /// nil means auto.
    let code: FrameCode?
    let exact: Bool
    let lines: Bool
    let out = OutputBuffer(fd: 1)

    init(options: ParsedOptions) throws {
        switch options.string("code") {
        case nil: code = .text
        case let text? where text.lowercased() == "auto": code = nil
        case let text?:
            guard text.count == 1, let letter = text.first, let code = FrameCode(letter: letter) else {
                throw UsageError("--code wants T, U, I, N or auto, not '\(text)'")
            }
            self.code = code
        }
        exact = options.has("exact")
        lines = options.has("lines")
        if lines && code == .notify {
            throw UsageError("-c N frames carry no body, so --lines makes no sense with it")
        }
    }

    func run() throws {
        if code == .notify {
            // N frames are empty: standard input is not read at all.
            try emit(.notify, UnsafeRawBufferPointer(start: nil, count: 0))
        } else if lines {
            try encodeLines()
        } else {
            try encodeWhole()
        }
        try flush()
    }

    /// The code for a body, and the part of it the frame carries.
    private func frame(_ body: UnsafeRawBufferPointer, trimNewline: Bool) -> (FrameCode, UnsafeRawBufferPointer) {
        let code = self.code ?? FrameCode.detect(prefix: body)
        if trimNewline && code.isText && !exact, body.last == 0x0A {
            return (code, UnsafeRawBufferPointer(rebasing: body.dropLast()))
        }
        return (code, body)
    }

    /// All of standard input as one frame.
    private func encodeWhole() throws {
        let limit = FrameFormat.maxBodySize
        var st = stat()
        if fstat(0, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG {
            // What is left of the file from where standard input stands (`{ head -c 8; blframe; } <f`).
            let left = Int(st.st_size) - max(0, Int(lseek(0, 0, SEEK_CUR)))
            // One trailing newline could still be trimmed, hence limit + 1.
            if left > limit + 1 {
                throw ToolError(.dataError, "input of \(left) bytes is over the frame limit of \(limit) bytes")
            }
        }
        // Reserve the header in front of the body so header and body leave in one write.
        let header = FrameFormat.headerSize
        var buffer = [UInt8](repeating: 0, count: header + 64 * 1024)
        var used = header
        // One byte past the largest body that could still fit after trimming a newline is
        // enough to know the input is too large.
        let capacity = header + limit + 2
        while true {
            if used == buffer.count {
                buffer.append(contentsOf: repeatElement(0, count: min(buffer.count, capacity - buffer.count)))
            }
            let n = try readStdin(into: &buffer, at: used)
            if n == 0 { break }
            used += n
            if used - header > limit + 1 {
                throw ToolError(.dataError, "input is over the frame limit of \(limit) bytes")
            }
        }
        try buffer.withUnsafeMutableBytes { raw in
            let all = UnsafeRawBufferPointer(rebasing: raw[header..<used])
            let (code, body) = frame(all, trimNewline: true)
            try check(code, size: body.count)
            FrameEncoder.writeHeader(code, size: body.count, to: raw.baseAddress!)
            try write(UnsafeRawBufferPointer(rebasing: raw[0..<(header + body.count)]))
        }
    }

    /// Each line (newline removed) as its own frame, flushed once every complete line read so
    /// far has been written. Input is read straight into one buffer that grows to the longest
    /// line, so a line is copied only by the kernel, however many reads it spans.
    private func encodeLines() throws {
        let limit = FrameFormat.maxBodySize
        var buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 * 1024, alignment: FileIO.bufferAlignment)
        defer { buffer.deallocate() }
        var start = 0    // first byte of the current (incomplete) line
        var end = 0      // bytes filled
        while true {
            if end == buffer.count {
                if start > 0 {
                    // Move the incomplete line to the front.
                    let pending = end - start
                    if pending > 0 { buffer.baseAddress!.copyMemory(from: buffer.baseAddress! + start, byteCount: pending) }
                    start = 0
                    end = pending
                } else {
                    // One line fills the buffer: grow it, up to a line one byte over the limit.
                    guard buffer.count <= limit else {
                        throw ToolError(.dataError, "line of more than \(limit) bytes is over the frame limit")
                    }
                    let bigger = UnsafeMutableRawBufferPointer.allocate(byteCount: min(buffer.count * 2, limit + 1), alignment: FileIO.bufferAlignment)
                    bigger.baseAddress!.copyMemory(from: buffer.baseAddress!, byteCount: end)
                    buffer.deallocate()
                    buffer = bigger
                }
            }
            let n = try readStdin(into: UnsafeMutableRawBufferPointer(rebasing: buffer[end...]))
            if n == 0 { break }
            var scan = end
            end += n
            while scan < end, let newline = memchr(buffer.baseAddress! + scan, 0x0A, end - scan) {
                let position = UnsafeRawPointer(newline) - UnsafeRawPointer(buffer.baseAddress!)
                try emitLine(UnsafeRawBufferPointer(rebasing: buffer[start..<position]))
                start = position + 1
                scan = start
            }
            if end - start > limit {
                throw ToolError(.dataError, "line of more than \(limit) bytes is over the frame limit")
            }
            if start == end {
                start = 0
                end = 0
            }
            try flush()
        }
        if end > start {
            try emitLine(UnsafeRawBufferPointer(rebasing: buffer[start..<end]))
        }
    }

    private func emitLine(_ line: UnsafeRawBufferPointer) throws {
        let (code, body) = frame(line, trimNewline: false)
        try check(code, size: body.count)
        try emit(code, body)
    }

    private func check(_ code: FrameCode, size: Int) throws {
        do {
            try FrameEncoder.check(code, size: size)
        } catch {
            throw ToolError(.dataError, "body of \(size) bytes is over the frame limit of \(FrameFormat.maxBodySize) bytes")
        }
    }

    private func emit(_ code: FrameCode, _ body: UnsafeRawBufferPointer) throws {
        var header: (UInt64) = 0
        try withUnsafeMutableBytes(of: &header) { raw in
            FrameEncoder.writeHeader(code, size: body.count, to: raw.baseAddress!)
            try write(UnsafeRawBufferPointer(raw))
        }
        try write(body)
    }

    // MARK: I/O with the tool's error contract

    private func readStdin(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        do {
            return try FileIO.readWaiting(0, into: buffer)
        } catch {
            throw ToolError(.ioError, "stdin: \(error)")
        }
    }

    private func readStdin(into buffer: inout [UInt8], at offset: Int) throws -> Int {
        try buffer.withUnsafeMutableBytes { raw in
            try readStdin(into: UnsafeMutableRawBufferPointer(rebasing: raw[offset...]))
        }
    }

    private func write(_ bytes: UnsafeRawBufferPointer) throws {
        do {
            try out.write(bytes)
        } catch {
            throw Encoder.outputError(error)
        }
    }

    private func flush() throws {
        do {
            try out.flush()
        } catch {
            throw Encoder.outputError(error)
        }
    }

    /// A reader that went away (EPIPE) ends the tool quietly with 0, like `cat | head`.
    static func outputError(_ error: Errno) -> Error {
        ToolError.stdout(error) ?? ToolError.quiet(.ok)
    }
}
