/// SplitMix64: a small seeded generator so every property test is reproducible.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// `count` random bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        var result = [UInt8](repeating: 0, count: count)
        var i = 0
        while i < count {
            var word = next()
            for _ in 0..<min(8, count - i) {
                result[i] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                i += 1
            }
        }
        return result
    }
}
