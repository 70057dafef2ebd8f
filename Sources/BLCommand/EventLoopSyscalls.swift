#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// The monotonic clock (`clock_gettime(CLOCK_MONOTONIC)`): never jumps with wall-clock changes,
/// so timers and timeouts measured on it stay correct across NTP adjustments.
public enum MonotonicClock {
    /// Nanoseconds since an arbitrary fixed point (boot, on Linux).
    ///
    /// The corresponding C function is `clock_gettime(CLOCK_MONOTONIC, ...)`.
    @inlinable
    public static func nanoseconds() -> UInt64 {
        var ts = timespec()
        // CLOCK_MONOTONIC cannot fail with a valid pointer.
        _ = clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }

    /// Seconds since an arbitrary fixed point, as a `Double` (handy for measuring elapsed time).
    @inlinable
    public static func seconds() -> Double {
        Double(nanoseconds()) / 1e9
    }
}

/// The CPU time this process has used so far, all of its threads together (for reporting what a
/// tool's own work cost, beside the time it spent waiting).
public enum ProcessCPUClock {
    /// Seconds of CPU time since the process started.
    ///
    /// The corresponding C function is `clock_gettime(CLOCK_PROCESS_CPUTIME_ID, ...)`.
    public static func seconds() -> Double {
        var ts = timespec()
        // Cannot fail for the calling process with a valid pointer.
        _ = clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// Small wrappers over the Linux system calls the event loop needs and the Swift `Glibc` module
/// does not expose.
enum LoopSyscalls {
    /// The size of `struct signalfd_siginfo`, fixed by the kernel ABI.
    static let signalInfoSize = 128

    /// Creates (`fd == -1`) or updates a signalfd for `mask`, non-blocking and close-on-exec.
    /// (Through CLinux: the Glibc module leaves `<sys/signalfd.h>` out. A lookup with `dlsym`
    /// would find nothing in a statically linked tool.)
    ///
    /// The corresponding C function is `signalfd(2)`.
    static func signalfd(_ fd: Int32, _ mask: inout sigset_t) throws(Errno) -> Int32 {
        let result = cl_signalfd(fd, &mask)
        if result < 0 { throw Errno.current }
        return result
    }

    /// Changes the calling thread's signal mask.
    ///
    /// The corresponding C function is `pthread_sigmask(3)`.
    static func sigmask(_ how: Int32, _ set: inout sigset_t, old: inout sigset_t) throws(Errno) {
        let rc = pthread_sigmask(how, &set, &old)
        if rc != 0 { throw Errno(rc) }
    }

    /// The calling thread's current signal mask.
    static func currentSigmask() -> sigset_t {
        var old = sigset_t()
        _ = pthread_sigmask(SIG_SETMASK, nil, &old)
        return old
    }

    /// Decoded fields of one `struct signalfd_siginfo` record (offsets from `<sys/signalfd.h>`).
    static func decodeSignalInfo(_ record: UnsafeRawBufferPointer) -> SignalInfo {
        SignalInfo(
            signal: Int32(bitPattern: record.loadUnaligned(fromByteOffset: 0, as: UInt32.self)),
            code: record.loadUnaligned(fromByteOffset: 8, as: Int32.self),
            senderPID: Int32(bitPattern: record.loadUnaligned(fromByteOffset: 12, as: UInt32.self)),
            senderUID: record.loadUnaligned(fromByteOffset: 16, as: UInt32.self),
            status: record.loadUnaligned(fromByteOffset: 40, as: Int32.self)
        )
    }
}
