#!/usr/bin/python3
"""Waits, in one process, until a file has grown to SIZE bytes or contains TEXT, then prints the
wall-clock time it saw that (nanoseconds, as `date +%s%N` prints) and exits 0; exits 1 at the
timeout, or with --stall, once the file has stopped growing for that long after it began (bytes
were lost: waiting on is pointless). Tests use it instead of a shell loop, whose `stat`/`grep`
runs cost the VM more CPU than the transfer they wait for. (Benchmarks read a FIFO instead: this
polls every 10 ms, which costs the emulated CPUs a tenth of one.)

  wait_output.py PATH --size SIZE [--timeout S] [--stall S]
  wait_output.py PATH --text TEXT [--timeout S]"""
import argparse
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--size", type=int)
    group.add_argument("--text")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--stall", type=float)
    args = parser.parse_args()
    last_size, last_change = 0, time.monotonic()
    needle = args.text.encode() if args.text is not None else None
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            if needle is None:
                size = os.stat(args.path).st_size
                reached = size >= args.size
                now = time.monotonic()
                if size != last_size:
                    last_size, last_change = size, now
                elif args.stall and size > 0 and now - last_change >= args.stall:
                    return 1
            else:
                with open(args.path, "rb") as f:
                    reached = needle in f.read()
        except FileNotFoundError:
            reached = False
        if reached:
            print(time.time_ns(), flush=True)
            return 0
        time.sleep(0.01)
    return 1


if __name__ == "__main__":
    sys.exit(main())
