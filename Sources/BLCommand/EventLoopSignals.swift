#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Identifies a signal handler; pass it to ``EventLoop/removeSignalHandler(_:)``.
public struct SignalToken: Hashable, Sendable {
    let id: UInt64
    /// The signal this handler receives.
    public let signal: Int32
}

extension EventLoop {
    /// Calls `handler` on the loop when `signal` arrives (SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1…).
    ///
    /// The signal is **blocked** in the calling thread and read from a `signalfd` watched by this
    /// loop, so the handler is an ordinary loop callback (it may do anything, unlike a C signal
    /// handler), except wait in a nested loop turn (`run(until:)`, `sleep`, a `callAndWait`): no
    /// signal is read until it returns, so hand such work to `callSoon`. Instances of one signal
    /// can coalesce: for SIGCHLD, reap with `waitpid(-1, …, WNOHANG)`
    /// in a loop. See ``Signals`` for what child processes must undo (the blocked mask is inherited).
    /// Several handlers for one signal are all called, in registration order.
    ///
    /// The corresponding C functions are `pthread_sigmask(3)` and `signalfd(2)`.
    @discardableResult
    public func onSignal(_ signal: Int32, _ handler: @escaping (SignalInfo) -> Void) throws(Errno) -> SignalToken {
        if sigismember(&signalMask, signal) != 1 {
            try Signals.block(signal)
            var mask = signalMask
            sigaddset(&mask, signal)
            do {
                signalFD = try LoopSyscalls.signalfd(signalFD, &mask)
            } catch {
                Signals.unblock(signal)
                throw error
            }
            signalMask = mask
            if signalWatch == nil {
                signalWatch = watch(fd: signalFD, events: .readable) { [unowned self] _ in
                    self.readSignals()
                }
            }
        }
        let id = makeID()
        signalHandlers.append((id: id, signal: signal, handler: handler))
        return SignalToken(id: id, signal: signal)
    }

    /// Removes a signal handler. When the last handler of a signal goes, the signal is unblocked
    /// again (unless it was blocked before), so it regains its default action.
    public func removeSignalHandler(_ token: SignalToken) {
        guard let i = signalHandlers.firstIndex(where: { $0.id == token.id }) else { return }
        signalHandlers.remove(at: i)
        if signalHandlers.contains(where: { $0.signal == token.signal }) { return }
        var mask = signalMask
        sigdelset(&mask, token.signal)
        if signalFD >= 0 { _ = try? LoopSyscalls.signalfd(signalFD, &mask) }
        signalMask = mask
        Signals.unblock(token.signal)
    }

    func readSignals() {
        let size = LoopSyscalls.signalInfoSize
        if signalBuffer == nil {
            signalBuffer = .allocate(byteCount: size * 8, alignment: 8)
        }
        let buffer = signalBuffer!
        while signalFD >= 0 {
            let n: Int
            do {
                n = try FileIO.read(signalFD, into: buffer)
            } catch {
                return // EAGAIN: drained
            }
            if n < size { return }
            var offset = 0
            while offset + size <= n {
                let info = LoopSyscalls.decodeSignalInfo(UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + size]))
                offset += size
                deliver(info)
            }
        }
    }

    private func deliver(_ info: SignalInfo) {
        // Handlers may add or remove handlers: call by id, checking each is still registered.
        var ids: [UInt64] = []
        for h in signalHandlers where h.signal == info.signal { ids.append(h.id) }
        for id in ids {
            if let h = signalHandlers.first(where: { $0.id == id }) { h.handler(info) }
        }
    }

    func tearDownSignals() {
        if let w = signalWatch { remove(w) }
        signalWatch = nil
        if signalFD >= 0 { FileIO.close(signalFD) }
        signalFD = -1
        var blocked: [Int32] = []
        for h in signalHandlers where !blocked.contains(h.signal) { blocked.append(h.signal) }
        signalHandlers.removeAll()
        for s in blocked { Signals.unblock(s) }
        sigemptyset(&signalMask)
        signalBuffer?.deallocate()
        signalBuffer = nil
    }
}
