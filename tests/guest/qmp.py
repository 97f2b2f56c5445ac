#!/usr/bin/env python3
"""qmp.py - a small QMP client for the guest tests (host side, standard library only).

usage: qmp.py SOCK add JSON         device_add with the JSON object's arguments
       qmp.py SOCK del ID [SECS]    device_del ID, then wait up to SECS (default 60) until QEMU has
                                    removed it (it leaves /machine/peripheral once the guest has
                                    released the slot and QEMU has unplugged it); prints the seconds
       qmp.py SOCK has ID           exit 0 if device ID exists, 1 if not
       qmp.py SOCK cmd NAME [JSON]  any command; prints its "return" as JSON

Exit status: 0 done; 1 QEMU answered with an error, or the device was not removed in time;
2 usage, or the socket could not be used (QEMU gone: connection refused or closed).
"""

import json
import socket
import sys
import time


class QmpError(Exception):
    """QEMU answered a command with an error."""


class Qmp:
    def __init__(self, path, timeout=30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.events = []
        self._read()  # the greeting
        self.command("qmp_capabilities")

    def _read(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("QEMU closed the QMP connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def command(self, name, args=None):
        msg = {"execute": name}
        if args:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self._read()
            if "event" in reply:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise QmpError(f"{name}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    def has_device(self, dev_id):
        props = self.command("qom-list", {"path": "/machine/peripheral"})
        return any(p.get("name") == dev_id for p in props)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, op, rest = argv[1], argv[2], argv[3:]
    try:
        qmp = Qmp(path)
        if op == "add" and len(rest) == 1:
            qmp.command("device_add", json.loads(rest[0]))
        elif op == "del" and len(rest) in (1, 2):
            secs = float(rest[1]) if len(rest) == 2 else 60.0
            t0 = time.monotonic()
            qmp.command("device_del", {"id": rest[0]})
            while qmp.has_device(rest[0]):
                if time.monotonic() - t0 > secs:
                    print(f"qmp: {rest[0]} still present {secs:.0f} s after device_del", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            print(f"{time.monotonic() - t0:.1f}")
        elif op == "has" and len(rest) == 1:
            return 0 if qmp.has_device(rest[0]) else 1
        elif op == "cmd" and len(rest) in (1, 2):
            ret = qmp.command(rest[0], json.loads(rest[1]) if len(rest) == 2 else None)
            print(json.dumps(ret))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except QmpError as e:
        print(f"qmp: {e}", file=sys.stderr)
        return 1
    except (OSError, ConnectionError, ValueError) as e:
        print(f"qmp: {path}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
