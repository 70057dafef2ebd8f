// libFuzzer entry point for the frame decoder. Built by scripts/fuzz (not a SwiftPM target):
//   swiftc -sanitize=fuzzer,address -parse-as-library Sources/BLFrame/*.swift Tests/Fuzz/FuzzFrameDecoder.swift
//
// The first input byte picks the decoder's options and a chunking; the rest is the stream. Every
// run checks properties that must hold for any input:
//   1. the events are well formed (start, body pieces summing to the size, end);
//   2. decoding in chunks gives exactly what decoding in one piece gives (frames, skips, error);
//   3. without resync, re-encoding the frames reproduces the input up to the error (or all of it);
//   4. with resync, the only possible errors are truncation at the end and an oversized header.

struct Decoded: Equatable {
    var frames: [(FrameCode, [UInt8])] = []
    var skipped: [Int] = []
    var error: FrameError?
    var consumedBeforeError = 0

    static func == (a: Decoded, b: Decoded) -> Bool {
        a.skipped == b.skipped && a.error == b.error && a.frames.count == b.frames.count
            && zip(a.frames, b.frames).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
    }
}

func run(_ stream: UnsafeRawBufferPointer, chunk: Int, limit: Int, resync: Bool) -> Decoded {
    var decoder = FrameDecoder(maxBodySize: limit, resync: resync)
    var result = Decoded()
    var current: (FrameCode, [UInt8], Int)?
    var position = 0
    do {
        while position < stream.count {
            let end = min(stream.count, position + chunk)
            var input = UnsafeRawBufferPointer(rebasing: stream[position..<end])
            position = end
            while let event = try decoder.next(&input) {
                switch event {
                case .frameStart(let header):
                    precondition(current == nil, "frameStart inside a frame")
                    precondition(header.size <= limit, "size over the limit accepted")
                    current = (header.code, [], header.size)
                case .body(let piece):
                    precondition(current != nil && !piece.isEmpty, "stray or empty body piece")
                    current!.1.append(contentsOf: piece)
                    precondition(current!.1.count <= current!.2, "body longer than announced")
                case .frameEnd(let header):
                    precondition(current != nil && current!.1.count == header.size, "frame ended early")
                    result.frames.append((current!.0, current!.1))
                    current = nil
                case .skipped(let count):
                    precondition(resync && count > 0, "skip outside resync")
                    result.skipped.append(count)
                }
            }
            precondition(input.isEmpty, "input left over")
        }
        let trailing = try decoder.finish()
        if trailing > 0 { result.skipped.append(trailing) }
    } catch {
        result.error = error
        result.consumedBeforeError = error.offset
    }
    return result
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    guard size > 0 else { return 0 }
    let control = data[0]
    let stream = UnsafeRawBufferPointer(start: data + 1, count: size - 1)
    let resync = control & 1 == 1
    let limit = control & 2 == 2 ? 300 : FrameFormat.maxBodySize
    let chunk = Int(control >> 2) + 1

    let whole = run(stream, chunk: Int.max, limit: limit, resync: resync)
    let chunked = run(stream, chunk: chunk, limit: limit, resync: resync)
    precondition(whole == chunked, "chunking changed the result")

    if !resync {
        var reencoded: [UInt8] = []
        for (code, body) in whole.frames { reencoded += try! FrameEncoder.encode(code, body: body) }
        let expected = whole.error == nil ? stream.count : reencoded.count
        precondition(reencoded.count == expected, "frames do not account for the input")
        precondition(reencoded.elementsEqual(stream.prefix(reencoded.count)), "re-encoding differs from input")
        if let error = whole.error {
            precondition(error.offset >= reencoded.count && error.offset <= stream.count, "error offset out of range")
        }
    } else if let error = whole.error {
        switch error.kind {
        case .truncatedHeader, .truncatedBody, .tooLarge: break
        default: preconditionFailure("resync reported \(error)")
        }
    }
    return 0
}
