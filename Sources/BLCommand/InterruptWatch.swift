#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// SIGINT, SIGTERM and SIGHUP delivered through the event loop, so a tool can end cleanly
/// (unsubscribe, disconnect what it connected) instead of dying mid-operation. Until
/// `onInterrupt` is set, a signal stops the loop, which makes any wait in progress give up; a
/// handler set after a signal came runs at once (a wait whose failure was ignored must not
/// hide the signal). A second signal ends the process at once with 130 (interrupted), after
/// `onSecondInterrupt` (quick last steps: kill child processes, end a link) and the queued
/// diagnostics.
/// A signal the process started with ignored (`nohup`) is left so (``Signals/ignoredAtStart(_:)``).
public final class InterruptWatch {
    public var onInterrupt: (() -> Void)? {
        didSet {
            if received != nil, let handler = onInterrupt { handler() }
        }
    }
    /// Called with the second signal, just before the process exits.
    public var onSecondInterrupt: ((Int32) -> Void)?
    public private(set) var received: Int32?
    /// Whether any watch of the process has had a signal: the diagnostics written at the end
    /// then wait for stderr's reader only a short while (``Tool/finishDiagnostics()``).
    /// (Set and read on the thread running the loop.)
    nonisolated(unsafe) public private(set) static var signalled = false
    /// Why a signal could not be watched (it then keeps its default action), if one could not.
    public private(set) var setupError: Errno?
    private var tokens: [SignalToken] = []

    public init(loop: EventLoop, signals: [Int32] = Signals.interruptSignals) {
        for signo in Signals.notIgnoredAtStart(signals) {
            do {
                tokens.append(try loop.onSignal(signo) { [weak self, weak loop] info in
                    guard let self else { return }
                    if self.received != nil {
                        self.onSecondInterrupt?(info.signal)
                        Tool.finishDiagnostics()
                        exit(ExitCode.interrupted.rawValue)
                    }
                    self.received = info.signal
                    InterruptWatch.signalled = true
                    if let handler = self.onInterrupt {
                        handler()
                    } else {
                        loop?.stop()
                    }
                })
            } catch {
                if setupError == nil { setupError = error }
            }
        }
    }

    /// Runs `body`; if a signal arrived meanwhile, whatever it threw becomes a quiet exit 130
    /// (the signal stopped a wait, so the error is only its consequence), unless it is itself
    /// an exit 130 with something to say (blsend: how many bytes were confirmed).
    public func guarding<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch {
            if received != nil {
                if let toolError = error as? ToolError, toolError.code == .interrupted { throw toolError }
                throw ToolError.quiet(.interrupted)
            }
            throw error
        }
    }
}
