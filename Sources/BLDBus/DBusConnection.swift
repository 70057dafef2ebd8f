#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
internal import CDBus
internal import CLinux
import BLCommand

/// A private connection to a message bus, driven by a BLCommand ``EventLoop``.
///
/// ## Threading and dispatch
/// Everything happens on the loop's thread. libdbus is wired into the loop with watch functions,
/// timeout functions (so pending-call timeouts fire) and a dispatch-status function
/// (bluez-notes §6.2). Dispatching never happens inside a libdbus callback: it runs as a
/// ``EventLoop/callSoon(_:)`` block.
///
/// **User code never runs inside `dbus_connection_dispatch`.** libdbus's own callbacks (reply
/// notifications, the filter that sees signals, the object-path handler that sees method calls)
/// only queue the message; the queue is then drained once libdbus has returned. libdbus forbids
/// dispatching a connection from inside its own dispatch, so this is what makes nested waits work:
/// a method handler, a reply callback or a signal handler may call ``callAndWait(_:timeout:)``,
/// and the nested loop keeps serving this connection, including calls the peer makes back into
/// us before it replies (the RegisterApplication pattern, bluez-notes fact 7).
///
/// ## Lifetime
/// The connection keeps its ``EventLoop`` alive; the loop holds only weak references back.
/// Dropping the last reference closes the connection (`dbus_connection_close`, then
/// `dbus_connection_unref`); pending calls are then cancelled without calling their callbacks. Use
/// ``close()`` to close it with the callbacks still receiving an error.
///
/// ## Example
/// ```swift
/// let loop = EventLoop()
/// let bus = try DBusConnection.system(loop: loop)
/// bus.onDisconnect = { loop.stop() }
/// let objects = try bus.callAndWait(destination: "org.bluez", path: "/",
///                                   interface: "org.freedesktop.DBus.ObjectManager",
///                                   member: "GetManagedObjects")[0].managedObjects ?? [:]
/// let token = try bus.subscribePropertiesChanged(sender: "org.bluez", pathNamespace: "/org/bluez/hci0") {
///     path, interface, changed, invalidated in ...
/// }
/// loop.run()
/// ```
/// Handlers stored by the connection (subscriptions, exported methods, reply callbacks) that
/// capture the connection strongly form a reference cycle; capture it `unowned` or `weak` when
/// the connection should be able to go away.
///
/// Not `Sendable`.
public final class DBusConnection {
    let raw: OpaquePointer
    /// The loop this connection is wired into.
    public let loop: EventLoop

    /// Called once when the connection to the bus is lost (the bus exited, or the socket broke),
    /// on the loop. Never called after ``close()``. The process does **not** exit: libdbus's
    /// exit-on-disconnect is turned off. Pending calls fail with Disconnected just before, and
    /// NameOwnerChanged subscribers are told their names are gone.
    public var onDisconnect: (() -> Void)?

    // Loop integration (DBusConnectionLoop.swift).
    var watchTokens: [OpaquePointer: WatchToken] = [:]
    var timeoutTokens: [OpaquePointer: TimerToken] = [:]
    var dispatchScheduled = false
    var dispatching = false
    var dispatchBlock: (() -> Void)?

    /// Messages taken from libdbus callbacks, handled after `dbus_connection_dispatch` returned.
    enum InboxItem {
        case reply(DBusPendingCall, DBusMessage)
        case signal(DBusMessage)
        case call(ExportedObjectTree, DBusMessage)
    }
    // A queue with absolute indices, so that nested drains (from nested loop runs) can share it.
    var inbox: [InboxItem?] = []
    var inboxFirst = 0
    var inboxNext = 0

    var pendingCalls: [UInt64: DBusPendingCall] = [:]
    var subscriptions: [Subscription] = []
    var nameOwners: [String: NameOwnerEntry] = [:]
    var trees: [String: ExportedObjectTree] = [:]
    var closedByUser = false
    var disconnectReported = false
    private var nextID: UInt64 = 1

    func makeID() -> UInt64 {
        defer { nextID += 1 }
        return nextID
    }

    // MARK: - Opening

    private init(raw: OpaquePointer, loop: EventLoop) {
        self.raw = raw
        self.loop = loop
        // Off from the start with dbus_connection_open_private(): a lost bus must not _exit the
        // process.
        dbus_connection_set_exit_on_disconnect(raw, 0)
        dispatchBlock = { [weak self] in self?.dispatchNow() }
        installLoopIntegration()
    }

    /// The system bus's address when `DBUS_SYSTEM_BUS_ADDRESS` is not set: libdbus's own
    /// default on Debian and other systemd systems (the D-Bus specification's `/var/run` is a
    /// link to `/run` there).
    public static let systemBusDefaultAddress = "unix:path=/run/dbus/system_bus_socket"

    /// The system bus's address: `DBUS_SYSTEM_BUS_ADDRESS` unless it is empty or unset, or the
    /// process runs with raised privileges (both as libdbus decides), else the default.
    public static var systemBusAddress: String {
        guard let value = cl_secure_getenv("DBUS_SYSTEM_BUS_ADDRESS"), value.pointee != 0 else { return systemBusDefaultAddress }
        return String(cString: value)
    }

    /// Opens a private connection to the system bus and registers with it. See
    /// ``init(address:loop:timeout:opened:)``.
    public static func system(loop: EventLoop, timeout: Double = 25,
                              opened: (() -> Void)? = nil) throws(DBusError) -> DBusConnection {
        try DBusConnection(address: systemBusAddress, loop: loop, timeout: timeout, opened: opened)
    }

    /// Opens a private connection to the bus at `address` (e.g. `unix:path=/run/x/bus`) and
    /// registers with it: `Hello`, waited for through the loop as any ``callAndWait(_:timeout:)``
    /// (not libdbus's blocking `dbus_bus_register`), so that a bus that takes the connection and
    /// then says nothing gives NoReply after `timeout` seconds, and a signal stopping the loop
    /// ends the wait (Interrupted) instead of waiting behind a blocked signal.
    ///
    /// `opened` runs once the socket is connected, before `Hello`: libdbus's `connect()` blocks
    /// (while the bus's queue of connections is full), so a tool starts watching its signals
    /// there, leaving them their default action until then.
    ///
    /// The corresponding C functions are `dbus_connection_open_private` and
    /// `dbus_bus_set_unique_name` (manual registration).
    public convenience init(address: String, loop: EventLoop, timeout: Double = 25,
                            opened: (() -> Void)? = nil) throws(DBusError) {
        _ = LibDBus.initialized
        try LibDBus.require(!address.utf8.contains(0), "invalid bus address")
        let raw = try LibDBus.check { e in dbus_connection_open_private(address, e) }
        // From here on a failure closes and releases `raw` (deinit).
        self.init(raw: raw, loop: loop)
        opened?()
        let reply = try busCall("Hello", [], timeout: timeout)
        guard case .string(let name)? = reply.first, !name.isEmpty else {
            throw DBusError(name: DBusError.Name.failed, message: "the bus answered Hello without a name")
        }
        guard dbus_bus_set_unique_name(raw, name) != 0 else { throw DBusError.noMemory }
    }

    deinit {
        tearDown()
    }

    // MARK: - State

    /// This connection's unique name on the bus, e.g. `:1.42`.
    ///
    /// The corresponding C function is `dbus_bus_get_unique_name`.
    public var uniqueName: String {
        dbus_bus_get_unique_name(raw).map { String(cString: $0) } ?? ""
    }

    /// True if file descriptors (`h`) can be sent on this connection (unix-socket buses).
    ///
    /// The corresponding C function is `dbus_connection_can_send_type(conn, DBUS_TYPE_UNIX_FD)`.
    public var canSendFDs: Bool {
        dbus_connection_can_send_type(raw, CDBus_TYPE_UNIX_FD) != 0
    }

    /// False once the connection is closed or lost.
    ///
    /// The corresponding C function is `dbus_connection_get_is_connected`.
    public var isConnected: Bool {
        dbus_connection_get_is_connected(raw) != 0
    }

    /// Closes the connection. Pending calls then fail with Disconnected (on the next loop turn);
    /// ``onDisconnect`` is not called. Further sends fail with Disconnected.
    ///
    /// The corresponding C function is `dbus_connection_close`.
    public func close() {
        if closedByUser { return }
        closedByUser = true
        dbus_connection_close(raw)
        scheduleDispatch()
    }

    /// Blocks until every queued outgoing message is written (e.g. before the process exits),
    /// for at most `timeout` seconds: a bus that takes nothing (stopped, or far behind) must
    /// not keep a process that is ending from ending.
    ///
    /// The corresponding C functions are `dbus_connection_read_write` and
    /// `dbus_connection_has_messages_to_send` (`dbus_connection_flush` has no time limit).
    public func flush(timeout: Double = 2) {
        let deadline = MonotonicClock.seconds() + timeout
        while isConnected && dbus_connection_has_messages_to_send(raw) != 0 {
            let left = deadline - MonotonicClock.seconds()
            if left <= 0 { break }
            if dbus_connection_read_write(raw, Int32(min(left, 0.1) * 1000) + 1) == 0 { break }
        }
        // Unlike dbus_connection_flush, read_write does not report the dispatch status: what it
        // read (or a disconnect it met) would wait for the next read.
        dispatchIfNeeded()
    }

    // MARK: - Sending

    /// Queues a message (a signal, or a reply built by hand) for sending; the loop writes it.
    ///
    /// - Returns: the serial assigned to the message.
    /// - Throws: Disconnected when the connection is closed, NotSupported if the message carries
    ///   descriptors and the connection can't pass them.
    ///
    /// The corresponding C function is `dbus_connection_send`.
    @discardableResult
    public func send(_ message: DBusMessage) throws(DBusError) -> UInt32 {
        try checkSendable(message)
        var serial: UInt32 = 0
        guard dbus_connection_send(raw, message.raw, &serial) != 0 else { throw DBusError.noMemory }
        return serial
    }

    private func checkSendable(_ message: DBusMessage) throws(DBusError) {
        guard isConnected else {
            throw DBusError(name: DBusError.Name.disconnected, message: "Not connected to the bus")
        }
        if dbus_message_contains_unix_fds(message.raw) != 0, !canSendFDs {
            throw DBusError(name: DBusError.Name.notSupported, message: "This connection cannot pass file descriptors")
        }
    }

    static func timeoutMilliseconds(_ timeout: Double?) -> Int32 {
        guard let timeout else { return DBUS_TIMEOUT_USE_DEFAULT }
        let ms = (timeout * 1000).rounded(.up)
        if !(ms < Double(DBUS_TIMEOUT_INFINITE)) { return DBUS_TIMEOUT_INFINITE }
        // A deadline already past (or absurdly far back) expires at once.
        return ms < 1 ? 1 : Int32(ms)
    }

    /// Sends a method call; `reply` is called once on the loop with the reply message, or with the
    /// error (an error reply, NoReply on timeout or disconnection, NotSupported for descriptors on a
    /// connection that can't pass them). Never called synchronously from `call`.
    ///
    /// - Parameter timeout: seconds; nil means libdbus's default (25 s), `.infinity` none.
    ///
    /// The corresponding C functions are `dbus_connection_send_with_reply` and `dbus_pending_call_set_notify`.
    @discardableResult
    public func call(
        _ message: DBusMessage, timeout: Double? = nil,
        reply: @escaping (Result<DBusMessage, DBusError>) -> Void
    ) -> DBusPendingCall {
        let pc = DBusPendingCall(id: makeID(), connection: self, reply: reply)
        do {
            try checkSendable(message)
        } catch {
            failSoon(pc, error)
            return pc
        }
        var pending: OpaquePointer? = nil
        guard dbus_connection_send_with_reply(raw, message.raw, &pending, Self.timeoutMilliseconds(timeout)) != 0 else {
            failSoon(pc, .noMemory)
            return pc
        }
        guard let pending else {
            failSoon(pc, DBusError(name: DBusError.Name.disconnected, message: "Not connected to the bus"))
            return pc
        }
        pc.pending = pending
        pendingCalls[pc.id] = pc
        attachNotify(pc, pending)
        return pc
    }

    /// Sends a method call built from its parts; `reply` receives the reply's arguments.
    /// See ``call(_:timeout:reply:)``. With `autoStart` false, the bus does not start a
    /// destination that is not running (it answers ServiceUnknown instead).
    @discardableResult
    public func call(
        destination: String?, path: String, interface: String?, member: String,
        args: [DBusValue] = [], timeout: Double? = nil, autoStart: Bool = true,
        reply: @escaping (Result<[DBusValue], DBusError>) -> Void
    ) -> DBusPendingCall {
        let message: DBusMessage
        do {
            message = try DBusMessage.methodCall(destination: destination, path: path, interface: interface, member: member)
            message.autoStart = autoStart
            try message.append(args)
        } catch {
            let pc = DBusPendingCall(id: makeID(), connection: self) { result in reply(result.map(\.arguments)) }
            failSoon(pc, error)
            return pc
        }
        return call(message, timeout: timeout) { result in reply(result.map(\.arguments)) }
    }

    /// Sends a method call and runs the loop until its reply arrives; the loop keeps serving
    /// everything else meanwhile, including calls the peer makes into our exported objects
    /// before it answers. Safe to call from any handler (nested waits).
    ///
    /// This never uses `dbus_connection_send_with_reply_and_block`, which would deadlock when the
    /// peer calls back into us (bluez-notes fact 7).
    ///
    /// - Throws: the error reply; NoReply on timeout; Interrupted (``DBusError/Name/interrupted``)
    ///   if the loop is stopped while waiting.
    public func callAndWait(_ message: DBusMessage, timeout: Double? = nil) throws(DBusError) -> DBusMessage {
        var result: Result<DBusMessage, DBusError>?
        let pc = call(message, timeout: timeout) { result = $0 }
        // libdbus's own timeout answers first; this is only a backstop.
        let effective = timeout ?? 25
        let backstop: Double? = effective.isFinite && effective < 1e9 ? effective + 5 : nil
        let done = loop.run(until: { result != nil }, timeout: backstop)
        if !done {
            pc.cancel()
            if loop.isStopping {
                throw DBusError(name: DBusError.Name.interrupted, message: "Interrupted while waiting for a reply")
            }
            throw DBusError(name: DBusError.Name.noReply, message: "No reply within \(backstop ?? 0) s")
        }
        return try result!.get()
    }

    /// Sends a method call built from its parts and waits for its reply's arguments.
    /// See ``callAndWait(_:timeout:)``.
    public func callAndWait(
        destination: String?, path: String, interface: String?, member: String,
        args: [DBusValue] = [], timeout: Double? = nil
    ) throws(DBusError) -> [DBusValue] {
        let message = try DBusMessage.methodCall(destination: destination, path: path, interface: interface, member: member)
        try message.append(args)
        return try callAndWait(message, timeout: timeout).arguments
    }

    private func failSoon(_ pc: DBusPendingCall, _ error: DBusError) {
        loop.callSoon { pc.finish(.failure(error)) }
    }

    // MARK: - Bus driver

    static let busName = "org.freedesktop.DBus"
    static let busPath = "/org/freedesktop/DBus"

    func busCall(_ member: String, _ args: [DBusValue], timeout: Double? = nil) throws(DBusError) -> [DBusValue] {
        try callAndWait(destination: Self.busName, path: Self.busPath, interface: Self.busName, member: member, args: args, timeout: timeout)
    }

    /// Flags for ``requestName(_:flags:)`` (`DBUS_NAME_FLAG_*`).
    public struct RequestNameFlags: OptionSet, Sendable {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }
        public static let allowReplacement = RequestNameFlags(rawValue: 1)
        public static let replaceExisting = RequestNameFlags(rawValue: 2)
        public static let doNotQueue = RequestNameFlags(rawValue: 4)
    }

    /// The answer to ``requestName(_:flags:)`` (`DBUS_REQUEST_NAME_REPLY_*`).
    public enum RequestNameReply: UInt32, Sendable {
        case primaryOwner = 1
        case inQueue = 2
        case exists = 3
        case alreadyOwner = 4
    }

    /// The unique name that owns `name` now; nil when nobody does, or the bus did not answer
    /// within `timeout` seconds (waits on the loop).
    ///
    /// The corresponding bus method is `org.freedesktop.DBus.GetNameOwner`.
    public func nameOwner(_ name: String, timeout: Double = 5) -> String? {
        (try? busCall("GetNameOwner", [.string(name)], timeout: timeout))?.first?.string
    }

    /// Asks the bus for a well-known name (waits on the loop for the answer).
    ///
    /// The corresponding bus method is `org.freedesktop.DBus.RequestName`.
    @discardableResult
    public func requestName(_ name: String, flags: RequestNameFlags = [.doNotQueue]) throws(DBusError) -> RequestNameReply {
        let reply = try busCall("RequestName", [.string(name), .uint32(flags.rawValue)])
        guard let code = reply.first?.uint32, let r = RequestNameReply(rawValue: code) else {
            throw DBusError.failed("Unexpected RequestName reply")
        }
        return r
    }

    /// Gives a well-known name back (waits on the loop for the answer).
    ///
    /// The corresponding bus method is `org.freedesktop.DBus.ReleaseName`.
    public func releaseName(_ name: String) throws(DBusError) {
        _ = try busCall("ReleaseName", [.string(name)])
    }

    /// Adds a match rule at the bus, waiting for the bus to confirm it (so that signals sent after
    /// this returns are delivered). Prefer ``subscribe(_:_:)``, which also routes the signals.
    ///
    /// The corresponding bus method is `org.freedesktop.DBus.AddMatch` (not `dbus_bus_add_match`,
    /// which blocks without serving the loop).
    public func addMatch(_ rule: String) throws(DBusError) {
        do {
            _ = try busCall("AddMatch", [.string(rule)])
        } catch {
            // Given up before the bus answered (no reply in time, the loop stopping): the bus may
            // still add the rule, and nothing would remove it. It handles one sender's messages
            // in order, so a removal sent now comes after the addition, whenever that happens.
            if error.is(DBusError.Name.noReply) || error.is(DBusError.Name.interrupted) { removeMatch(rule) }
            throw error
        }
    }

    /// Removes a match rule without waiting (errors are ignored).
    ///
    /// The corresponding bus method is `org.freedesktop.DBus.RemoveMatch`.
    public func removeMatch(_ rule: String) {
        guard isConnected,
              let m = try? DBusMessage.methodCall(destination: Self.busName, path: Self.busPath, interface: Self.busName, member: "RemoveMatch"),
              (try? m.append([.string(rule)])) != nil else { return }
        m.noReply = true
        _ = try? send(m)
    }

    // MARK: - Exported objects

    /// Serves `tree` on this connection: every method call to its root path or below goes to the
    /// tree. A tree can be exported on one connection at a time.
    ///
    /// - Throws: ObjectPathInUse if something is already registered at the root.
    ///
    /// The corresponding C function is `dbus_connection_try_register_fallback`.
    public func export(_ tree: ExportedObjectTree) throws(DBusError) {
        if tree.connection != nil {
            throw DBusError(name: DBusError.Name.objectPathInUse, message: "Tree \(tree.root) is already exported")
        }
        tree.connection = self
        do {
            try registerFallback(tree)
        } catch {
            tree.connection = nil
            throw error
        }
        trees[tree.root] = tree
    }

    /// Stops serving `tree`.
    ///
    /// The corresponding C function is `dbus_connection_unregister_object_path`.
    public func unexport(_ tree: ExportedObjectTree) {
        guard let t = trees[tree.root], t === tree else { return }
        _ = dbus_connection_unregister_object_path(raw, tree.root)
        trees[tree.root] = nil
        tree.connection = nil
    }

    // MARK: - Inbox

    func enqueue(_ item: InboxItem) {
        inbox.append(item)
        if !dispatching { scheduleDispatch() }
    }

    func drainInbox() {
        while inboxNext < inboxFirst + inbox.count {
            let index = inboxNext - inboxFirst
            let item = inbox[index]
            inbox[index] = nil
            inboxNext += 1
            if let item { handle(item) }
        }
        if inboxNext == inboxFirst + inbox.count, !inbox.isEmpty {
            inboxFirst = inboxNext
            inbox.removeAll(keepingCapacity: true)
        }
    }

    private func handle(_ item: InboxItem) {
        switch item {
        case .reply(let pc, let message):
            if message.kind == .error {
                pc.finish(.failure(message.error ?? DBusError.failed("Error reply without a name")))
            } else {
                pc.finish(.success(message))
            }
        case .signal(let message):
            routeSignal(message)
        case .call(let tree, let message):
            tree.handle(IncomingCall(message: message, connection: self))
        }
    }

    func handleDisconnected() {
        if disconnectReported { return }
        disconnectReported = true
        // libdbus queues a made-up error for each pending call on disconnection, but it has
        // already detached the calls, so the error reaches the filters instead of the calls'
        // notify functions (dbus-connection.c connection_timeout_and_complete_all_pending_calls_unlocked).
        // Fail them here, in the order they were made.
        let stranded = pendingCalls.values.sorted { $0.id < $1.id }
        let error = DBusError(name: DBusError.Name.disconnected, message: "Disconnected from the bus before the reply arrived")
        for pc in stranded { pc.fail(error) }
        if closedByUser { return }
        // Subscriptions that watch something on the bus (a name's owner) learn it is gone.
        for id in subscriptions.filter({ $0.onBusLost != nil }).map(\.id) {
            if let s = subscriptions.first(where: { $0.id == id }) { s.onBusLost?() }
        }
        onDisconnect?()
    }
}

/// A method call in flight: cancel it, or ask whether it completed.
///
/// The corresponding C type is `DBusPendingCall`.
public final class DBusPendingCall {
    let id: UInt64
    weak var connection: DBusConnection?
    var pending: OpaquePointer?
    var reply: ((Result<DBusMessage, DBusError>) -> Void)?

    init(id: UInt64, connection: DBusConnection, reply: @escaping (Result<DBusMessage, DBusError>) -> Void) {
        self.id = id
        self.connection = connection
        self.reply = reply
    }

    /// True once the reply callback has run or the call was cancelled.
    public var isFinished: Bool { reply == nil }

    /// Drops the call: the reply callback will not be called. No-op once finished.
    ///
    /// The corresponding C function is `dbus_pending_call_cancel`.
    public func cancel() {
        reply = nil
        releasePending(cancel: true)
    }

    /// Fails the call, detaching it from libdbus first.
    func fail(_ error: DBusError) {
        guard let r = reply else { return }
        reply = nil
        releasePending(cancel: true)
        r(.failure(error))
    }

    func finish(_ result: Result<DBusMessage, DBusError>) {
        guard let r = reply else { return }
        reply = nil
        releasePending(cancel: false)
        r(result)
    }
}
