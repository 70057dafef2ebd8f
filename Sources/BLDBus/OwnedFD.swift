#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLCommand

/// A file descriptor with one owner, closed when the owner lets it go.
///
/// Ownership rules for D-Bus fd passing (`h` values):
/// * **Reading** an `h` from a message (``DBusMessage/arguments``) gives a fresh duplicate that
///   the returned `OwnedFD` owns (libdbus `dbus_message_iter_get_basic` duplicates on every read).
/// * **Appending** ``DBusValue/unixFD(_:)`` duplicates the descriptor into the message
///   (`dbus_message_iter_append_basic`); this `OwnedFD` keeps its own copy. Close it (or drop the
///   value) once the message is built, or the peer will never see end of file. For the socketpair
///   end handed out by AcquireNotify/AcquireWrite that is what bluetoothd requires.
///
/// Not `Sendable`: it is mutable and is meant for the loop thread.
public final class OwnedFD: CustomStringConvertible {
    /// The descriptor, or -1 after ``take()`` or ``close()``.
    public private(set) var rawValue: Int32

    /// Takes ownership of `fd`; it will be closed in `deinit` unless taken.
    public init(taking fd: Int32) {
        rawValue = fd
    }

    /// Duplicates `fd` (close-on-exec); the caller keeps `fd`.
    ///
    /// The corresponding C function is `fcntl(fd, F_DUPFD_CLOEXEC, 0)`.
    public static func duplicating(_ fd: Int32) throws(Errno) -> OwnedFD {
        let d = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        if d < 0 { throw Errno.current }
        return OwnedFD(taking: d)
    }

    /// True until the descriptor has been taken or closed.
    public var isValid: Bool { rawValue >= 0 }

    /// Gives up ownership and returns the descriptor (-1 if there is none); the caller must close it.
    public func take() -> Int32 {
        defer { rawValue = -1 }
        return rawValue
    }

    /// Closes the descriptor now (no-op if already closed or taken).
    public func close() {
        if rawValue >= 0 { FileIO.close(rawValue) }
        rawValue = -1
    }

    deinit {
        if rawValue >= 0 { FileIO.close(rawValue) }
    }

    public var description: String { "fd \(rawValue)" }
}
