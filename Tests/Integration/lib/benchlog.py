"""Test output shared by every bench helper and test: timestamped lines and failing checks.

Imports nothing beyond the standard library, so both the python3-dbus helpers (bench.py) and
the bleak ones (blserve_client.py) can use it without pulling in each other's main loops.
"""

import sys
import time

_T0 = time.monotonic()


def log(*parts):
    """Print a line with the seconds since the test started."""
    print("[%7.3f]" % (time.monotonic() - _T0), *parts, flush=True)


def fail(message):
    """Report a failed check and end the test with status 1."""
    log("FAILED:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def payload(size):
    """SIZE bytes that both ends of a benchmark can make (the sender sends, the receiver checks)."""
    import random
    return random.Random(size).randbytes(size)
