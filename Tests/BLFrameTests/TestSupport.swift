import BLFrame
import BLTestSupport

/// A decoded frame, collected whole for comparison.
struct Frame: Equatable, CustomStringConvertible {
    var code: FrameCode
    var body: [UInt8]
    var description: String { "\(code)(\(body.count))" }
}

/// What decoding produced: the frames, the skipped counts, and the error if any.
struct Outcome: Equatable {
    var frames: [Frame] = []
    var skipped: [Int] = []
    var error: FrameError?
}

/// Feeds `stream` to a fresh decoder in the given chunk sizes (cycled), then finishes.
func decode(_ stream: [UInt8], chunks: [Int] = [Int.max], maxBodySize: Int = FrameFormat.maxBodySize,
            resync: Bool = false) -> Outcome {
    var decoder = FrameDecoder(maxBodySize: maxBodySize, resync: resync)
    var outcome = Outcome()
    var current: Frame?
    var position = 0
    var chunkIndex = 0
    do {
        try stream.withUnsafeBytes { all in
            while position < all.count {
                let size = max(1, min(chunks[chunkIndex % chunks.count], all.count - position))
                chunkIndex += 1
                var input = UnsafeRawBufferPointer(rebasing: all[position..<(position + size)])
                position += size
                while let event = try decoder.next(&input) {
                    switch event {
                    case .frameStart(let header):
                        precondition(current == nil, "frameStart inside a frame")
                        current = Frame(code: header.code, body: [])
                    case .body(let piece):
                        current!.body.append(contentsOf: piece)
                    case .frameEnd(let header):
                        precondition(current?.code == header.code && current?.body.count == header.size)
                        outcome.frames.append(current!)
                        current = nil
                    case .skipped(let count):
                        outcome.skipped.append(count)
                    }
                }
                precondition(input.isEmpty, "decoder returned nil with input left")
            }
        }
        let trailing = try decoder.finish()
        if trailing > 0 { outcome.skipped.append(trailing) }
    } catch let error as FrameError {
        outcome.error = error
    } catch {
        fatalError("unexpected \(error)")
    }
    return outcome
}

func encodeAll(_ frames: [Frame]) -> [UInt8] {
    var stream: [UInt8] = []
    for frame in frames { stream += try! FrameEncoder.encode(frame.code, body: frame.body) }
    return stream
}

func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

func randomFrames(_ rng: inout SeededGenerator, count: Int, maxBody: Int) -> [Frame] {
    (0..<count).map { _ in
        let code = FrameCode.allCases.randomElement(using: &rng)!
        if code == .notify { return Frame(code: .notify, body: []) }
        // Mostly small bodies, sometimes empty, sometimes large.
        let size: Int
        switch Int.random(in: 0..<10, using: &rng) {
        case 0: size = 0
        case 1: size = Int.random(in: 0...maxBody, using: &rng)
        default: size = Int.random(in: 1...64, using: &rng)
        }
        return Frame(code: code, body: (0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) })
    }
}

func randomChunking(_ rng: inout SeededGenerator) -> [Int] {
    switch Int.random(in: 0..<4, using: &rng) {
    case 0: return [1]
    case 1: return [Int.random(in: 1...9, using: &rng)]
    case 2: return (0..<17).map { _ in Int.random(in: 1...300, using: &rng) }
    default: return [Int.random(in: 1...100_000, using: &rng)]
    }
}
