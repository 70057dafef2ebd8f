import BLCommand

/// Reads the non-blocking pipe `fd` on `loop` until end of file, or until `enough` holds for
/// what has been read so far. Returns the bytes, or nil when neither happened within
/// `timeout` seconds. The pipe stays open.
public func readPipe(_ fd: Int32, on loop: EventLoop, timeout: Double = 10,
                     until enough: @escaping ([UInt8]) -> Bool = { _ in false }) -> [UInt8]? {
    var out: [UInt8] = []
    var ended = false
    var buffer = [UInt8](repeating: 0, count: 4096)
    let token = loop.watch(fd: fd, events: .readable) { _ in
        do {
            let n = try buffer.withUnsafeMutableBytes { try FileIO.read(fd, into: $0) }
            if n == 0 { ended = true } else { out += buffer[0..<n] }
        } catch {
            // EAGAIN: nothing after all; anything else ends the pipe for the reader.
            if (error as? Errno) != .again { ended = true }
        }
    }
    defer { loop.remove(token) }
    return loop.run(until: { ended || enough(out) }, timeout: timeout) ? out : nil
}
