"""blserve_central.py ADAPTER ADDRESS OPS: one seed-client central (bleak) in a process of its own,
running OPS (JSON) in order and printing one JSON line per operation. Run with the bleak venv's
python; blserve_client.run_central() wraps it.

Each central gets its own process because bleak's object cache, once created, can miss the
Connected/ServicesResolved changes of a later connection on this bench (bluez-notes §9.5): a
process whose first bleak call comes after the link is up (blserve_client.link()) always works.

Operations:
  {"op": "request", "code": "T", "body": "<hex>", "timeout": 30} -> {"code": "T", "body": "<hex>", "took": s}
  {"op": "write", "data": "<hex>"}                                -> {"error": null or "<text>"}
  {"op": "read"}                                                  -> {"value": "<hex>"} or {"error": "<text>"}
  {"op": "wait", "seconds": 2}                                    -> {} (stays connected meanwhile)
A request that gets no reply prints {"error": ...} and ends the run with status 1."""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blserve_client import SeedClient, run  # noqa: E402


async def main(adapter, address, ops):
    client = SeedClient(adapter, address)
    await client.connect()
    status = 0
    try:
        for op in ops:
            kind = op["op"]
            if kind == "request":
                start = time.monotonic()
                try:
                    code, body = await client.request(op["code"], bytes.fromhex(op["body"]), op.get("timeout", 30))
                    result = {"code": code, "body": body.hex(), "took": time.monotonic() - start}
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    result = {"error": str(exc)}
                    status = 1
            elif kind == "write":
                error = await client.write_raw(bytes.fromhex(op["data"]))
                result = {"error": None if error is None else str(error)}
            elif kind == "read":
                try:
                    value = await asyncio.wait_for(client.client.read_gatt_char(client.char), 20)
                    result = {"value": bytes(value).hex()}
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    result = {"error": str(exc)}
            elif kind == "wait":
                await asyncio.sleep(op["seconds"])
                result = {}
            else:
                raise SystemExit("unknown operation %r" % kind)
            print(json.dumps(result), flush=True)
            if status:
                break
        if client.errors:
            print(json.dumps({"error": "read errors: %s" % client.errors}), flush=True)
            status = 1
    finally:
        await client.disconnect()
    return status


if __name__ == "__main__":
    sys.exit(run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])), 600))
