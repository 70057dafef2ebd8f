internal import CDBus
import BLCommand

// Wiring libdbus into the EventLoop (the way bluez gdbus/mainloop.c wires it into GLib):
// watch functions, timeout functions, the dispatch-status function, the message filter, the
// object-path handler and the pending-call notification.
//
// Rules (libdbus docs of dbus_connection_set_watch_functions and friends; bluez-notes §6.2):
// * These C callbacks run while libdbus holds the connection lock: they must not call
//   dbus_connection_* functions. They only update loop watches/timers or queue work.
// * Dispatching (dbus_connection_dispatch) happens in a callSoon block, never inside a callback.
// * The filter, object-path and notify callbacks run inside dbus_connection_dispatch; they only
//   queue the message in the connection's inbox, which is drained after dispatch returns.
//
// Context pointers are `Unmanaged` and unretained: the connection outlives its registrations
// because tearDown() unregisters everything before the connection goes away. Pending calls hold a
// retained reference to their DBusPendingCall, released by libdbus through the free function.

private func connection(_ data: UnsafeMutableRawPointer?) -> DBusConnection {
    Unmanaged<DBusConnection>.fromOpaque(data!).takeUnretainedValue()
}

private let addWatchCallback: DBusAddWatchFunction = { watch, data in
    guard let watch else { return 0 }
    connection(data).addWatch(watch)
    return 1
}

private let removeWatchCallback: DBusRemoveWatchFunction = { watch, data in
    guard let watch else { return }
    connection(data).removeWatch(watch)
}

private let toggleWatchCallback: DBusWatchToggledFunction = { watch, data in
    guard let watch else { return }
    connection(data).toggleWatch(watch)
}

private let addTimeoutCallback: DBusAddTimeoutFunction = { timeout, data in
    guard let timeout else { return 0 }
    connection(data).addTimeout(timeout)
    return 1
}

private let removeTimeoutCallback: DBusRemoveTimeoutFunction = { timeout, data in
    guard let timeout else { return }
    connection(data).removeTimeout(timeout)
}

private let toggleTimeoutCallback: DBusTimeoutToggledFunction = { timeout, data in
    guard let timeout else { return }
    connection(data).toggleTimeout(timeout)
}

private let dispatchStatusCallback: DBusDispatchStatusFunction = { _, status, data in
    // Only record that there is work; dispatching here is forbidden.
    if status == DBUS_DISPATCH_DATA_REMAINS { connection(data).scheduleDispatch() }
}

/// Sees every incoming message before the object-path handlers; keeps the signals.
private let filterCallback: DBusHandleMessageFunction = { _, message, data in
    guard let message, dbus_message_get_type(message) == DBUS_MESSAGE_TYPE_SIGNAL else {
        return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
    }
    connection(data).enqueue(.signal(DBusMessage(retaining: message)))
    // Not "handled": other filters and libdbus's own Disconnected handling still see it
    // (exit-on-disconnect is off).
    return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
}

/// Receives the method calls for an exported tree's root and everything under it.
private let objectPathCallback: DBusObjectPathMessageFunction = { _, message, data in
    guard let message, let data, dbus_message_get_type(message) == DBUS_MESSAGE_TYPE_METHOD_CALL else {
        return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
    }
    let tree = Unmanaged<ExportedObjectTree>.fromOpaque(data).takeUnretainedValue()
    guard let conn = tree.connection else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
    // The tree answers every call itself (UnknownObject/UnknownMethod included), later.
    conn.enqueue(.call(tree, DBusMessage(retaining: message)))
    return DBUS_HANDLER_RESULT_HANDLED
}

private let pendingNotifyCallback: DBusPendingCallNotifyFunction = { pending, data in
    guard let pending, let data, let reply = dbus_pending_call_steal_reply(pending) else { return }
    let pc = Unmanaged<DBusPendingCall>.fromOpaque(data).takeUnretainedValue()
    let message = DBusMessage(taking: reply)
    pc.connection?.enqueue(.reply(pc, message))
}

private let releasePendingCallBox: DBusFreeFunction = { data in
    guard let data else { return }
    Unmanaged<DBusPendingCall>.fromOpaque(data).release()
}

extension DBusConnection {
    private var context: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// The corresponding C functions are `dbus_connection_set_watch_functions`,
    /// `dbus_connection_set_timeout_functions`, `dbus_connection_set_dispatch_status_function`
    /// and `dbus_connection_add_filter`.
    func installLoopIntegration() {
        let ok1 = dbus_connection_set_watch_functions(raw, addWatchCallback, removeWatchCallback, toggleWatchCallback, context, nil)
        let ok2 = dbus_connection_set_timeout_functions(raw, addTimeoutCallback, removeTimeoutCallback, toggleTimeoutCallback, context, nil)
        dbus_connection_set_dispatch_status_function(raw, dispatchStatusCallback, context, nil)
        let ok3 = dbus_connection_add_filter(raw, filterCallback, context, nil)
        precondition(ok1 != 0 && ok2 != 0 && ok3 != 0, "libdbus: out of memory while setting up the connection")
        // Messages may already be queued (e.g. NameAcquired after Hello).
        dispatchIfNeeded()
    }

    func tearDown() {
        dbus_connection_set_dispatch_status_function(raw, nil, nil, nil)
        dbus_connection_remove_filter(raw, filterCallback, context)
        for (root, tree) in trees {
            _ = dbus_connection_unregister_object_path(raw, root)
            tree.connection = nil
        }
        trees.removeAll()
        for pc in pendingCalls.values { pc.cancel() }
        pendingCalls.removeAll()
        // Setting NULL functions makes libdbus call our remove functions for every watch/timeout.
        _ = dbus_connection_set_watch_functions(raw, nil, nil, nil, nil, nil)
        _ = dbus_connection_set_timeout_functions(raw, nil, nil, nil, nil, nil)
        for token in watchTokens.values { loop.remove(token) }
        for token in timeoutTokens.values { loop.cancel(token) }
        watchTokens.removeAll()
        timeoutTokens.removeAll()
        dbus_connection_close(raw)
        dbus_connection_unref(raw)
    }

    // MARK: Watches

    private static func requestedEvents(_ watch: OpaquePointer) -> IOEvents {
        guard dbus_watch_get_enabled(watch) != 0 else { return [] }
        let flags = dbus_watch_get_flags(watch)
        var events: IOEvents = []
        if flags & DBUS_WATCH_READABLE.rawValue != 0 { events.insert(.readable) }
        if flags & DBUS_WATCH_WRITABLE.rawValue != 0 { events.insert(.writable) }
        // Errors and hangups are implied; the loop reports them for every active watch.
        return events
    }

    func addWatch(_ watch: OpaquePointer) {
        let fd = dbus_watch_get_unix_fd(watch)
        let token = loop.watch(fd: fd, events: Self.requestedEvents(watch)) { [weak self] events in
            var flags: UInt32 = 0
            if events.contains(.readable) { flags |= DBUS_WATCH_READABLE.rawValue }
            if events.contains(.writable) { flags |= DBUS_WATCH_WRITABLE.rawValue }
            if events.contains(.error) { flags |= DBUS_WATCH_ERROR.rawValue }
            if events.contains(.hangup) { flags |= DBUS_WATCH_HANGUP.rawValue }
            // May call removeWatch for this very watch (on disconnection): the loop allows it.
            _ = dbus_watch_handle(watch, flags)
            self?.dispatchIfNeeded()
        }
        watchTokens[watch] = token
    }

    func removeWatch(_ watch: OpaquePointer) {
        if let token = watchTokens.removeValue(forKey: watch) { loop.remove(token) }
    }

    func toggleWatch(_ watch: OpaquePointer) {
        if let token = watchTokens[watch] { loop.setEvents(token, Self.requestedEvents(watch)) }
    }

    // MARK: Timeouts

    func addTimeout(_ timeout: OpaquePointer) {
        guard dbus_timeout_get_enabled(timeout) != 0 else { return }
        let seconds = Double(dbus_timeout_get_interval(timeout)) / 1000
        // libdbus timeouts repeat until removed or disabled.
        let token = loop.schedule(after: seconds, repeating: seconds) { [weak self] in
            _ = dbus_timeout_handle(timeout)
            self?.dispatchIfNeeded()
        }
        timeoutTokens[timeout] = token
    }

    func removeTimeout(_ timeout: OpaquePointer) {
        if let token = timeoutTokens.removeValue(forKey: timeout) { loop.cancel(token) }
    }

    func toggleTimeout(_ timeout: OpaquePointer) {
        removeTimeout(timeout)
        addTimeout(timeout)
    }

    // MARK: Dispatch

    func scheduleDispatch() {
        if dispatchScheduled { return }
        dispatchScheduled = true
        if let dispatchBlock { loop.callSoon(dispatchBlock) }
    }

    /// Called by the loop, outside every libdbus callback.
    func dispatchIfNeeded() {
        if dbus_connection_get_dispatch_status(raw) == DBUS_DISPATCH_DATA_REMAINS { scheduleDispatch() }
    }

    /// Lets libdbus dispatch everything queued (our callbacks only fill the inbox), then handles
    /// the inbox. Runs from a callSoon block; may be re-entered from a nested loop run started by a
    /// handler, which is fine because no libdbus dispatch is on the stack by then.
    ///
    /// The corresponding C function is `dbus_connection_dispatch`.
    func dispatchNow() {
        dispatchScheduled = false
        dispatching = true
        while dbus_connection_dispatch(raw) == DBUS_DISPATCH_DATA_REMAINS {}
        dispatching = false
        drainInbox()
    }

    // MARK: Registrations

    func registerFallback(_ tree: ExportedObjectTree) throws(DBusError) {
        var vtable = DBusObjectPathVTable()
        vtable.message_function = objectPathCallback
        let data = Unmanaged.passUnretained(tree).toOpaque()
        _ = try LibDBus.check { e in
            dbus_connection_try_register_fallback(raw, tree.root, &vtable, data, e) != 0 ? true : nil
        }
    }

    func attachNotify(_ pc: DBusPendingCall, _ pending: OpaquePointer) {
        let box = Unmanaged.passRetained(pc).toOpaque()
        if dbus_pending_call_set_notify(pending, pendingNotifyCallback, box, releasePendingCallBox) == 0 {
            Unmanaged<DBusPendingCall>.fromOpaque(box).release()
            pc.releasePending(cancel: true)
            loop.callSoon { pc.finish(.failure(.noMemory)) }
            return
        }
        // Single-threaded, the reply cannot have been processed yet; check anyway (libdbus docs).
        if dbus_pending_call_get_completed(pending) != 0, let reply = dbus_pending_call_steal_reply(pending) {
            enqueue(.reply(pc, DBusMessage(taking: reply)))
        }
    }
}

extension DBusPendingCall {
    /// Drops our reference to the libdbus pending call (cancelling it first if asked).
    ///
    /// The corresponding C functions are `dbus_pending_call_cancel` and `dbus_pending_call_unref`.
    func releasePending(cancel: Bool) {
        connection?.pendingCalls[id] = nil
        guard let p = pending else { return }
        pending = nil
        if cancel { dbus_pending_call_cancel(p) }
        dbus_pending_call_unref(p)
    }
}
