import XCTest
import Foundation
import Glibc
import BLCommand

final class ProcessCPUClockTests: XCTestCase {
    private static func threadCPUSeconds() -> Double {
        var ts = timespec()
        _ = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Waiting is not CPU time.
    func testSleepingAddsLittle() {
        let cpu0 = ProcessCPUClock.seconds(), wall0 = MonotonicClock.seconds()
        usleep(300_000)
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - wall0, 0.3)
        XCTAssertLessThan(ProcessCPUClock.seconds() - cpu0, 0.15)
    }

    /// Work done by another thread counts: the clock is the process's, not the caller's thread's.
    func testAnotherThreadsWorkCounts() {
        let before = ProcessCPUClock.seconds()
        let done = DispatchSemaphore(value: 0)
        let worker = Thread {
            let start = Self.threadCPUSeconds()
            var x: UInt64 = 1
            // 50 ms of this thread's own CPU time, however long that takes on a busy machine.
            while Self.threadCPUSeconds() - start < 0.05 {
                for _ in 0..<10_000 { x = x &* 6364136223846793005 &+ 1442695040888963407 }
            }
            blackHole(x)
            done.signal()
        }
        worker.start()
        XCTAssertEqual(done.wait(timeout: .now() + 60), .success)
        XCTAssertGreaterThanOrEqual(ProcessCPUClock.seconds() - before, 0.05)
    }
}

@inline(never) private func blackHole(_ x: UInt64) {
    if x == 42 { print("") }
}
