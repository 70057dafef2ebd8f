import BLBlueZ
import BLCommand

/// blrecv's job: connect, then either read once or stream notifications until an end condition.
struct Receive {
    let target: CentralTarget
    let options: NotificationReceiver.Options
    let readOnce: Bool
    /// Output held for a slow reader (QueuedOutput's limit).
    let buffer: Int

    func run() throws {
        let loop = EventLoop()
        Tool.queueDiagnostics(on: loop)
        let client = try BlueZClient(loop: loop)
        let interrupted = InterruptWatch(loop: loop)
        try interrupted.guarding { try receive(client, interrupted) }
    }

    private func receive(_ client: BlueZClient, _ interrupted: InterruptWatch) throws {
        let loop = client.loop
        let peer = try target.connect(client)
        defer {
            loop.clearStop()
            peer.disconnect()
        }
        // A second signal does not wait for anything more, but still ends a link made here.
        interrupted.onSecondInterrupt = { _ in peer.disconnectBeforeExit() }
        let characteristic = try peer.characteristic(service: target.service, uuid: target.notifyCharacteristic,
                                                     preferring: readOnce ? ["read"] : ["notify", "indicate"])
        if readOnce {
            let value = try characteristic.read()
            do {
                try FileIO.writeAll(1, value)
            } catch {
                if let failure = ToolError.stdout(error) { throw failure }
            }
            return
        }

        let receiver = NotificationReceiver(characteristic: characteristic, options: options, out: QueuedOutput(fd: 1, loop: loop, limit: buffer))
        var outcome: Result<Void, ToolError>?
        receiver.onFinish = { outcome = $0 }
        try receiver.start()
        receiver.armSilenceTimer()
        // What arrived is written out first (finish flushes; a reader taking nothing for a second
        // is not waited for), then 130 as for the other tools.
        interrupted.onInterrupt = { receiver.finish(.failure(ToolError.quiet(.interrupted))) }
        _ = loop.run(until: { outcome != nil }, timeout: nil)
        receiver.close()
        try (outcome ?? .failure(ToolError.quiet(.interrupted))).get()
    }
}
