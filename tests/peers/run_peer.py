"""Runs a Python peer as `python ARGS...` would, through peer_server.py's
fork server when $TIGHTFIT_PEER_SERVER names one that answers (the imports
already done), else with this Python directly. Start it with -S: it needs
only the standard library, and starts in milliseconds without site.

    python -S run_peer.py script.py ARGS...
    python -S run_peer.py -c CODE ARGS...
"""

import json
import os
import socket
import struct
import sys

args = sys.argv[1:]


def run_directly():
    os.execv(sys.executable, [sys.executable] + args)


path = os.environ.get("TIGHTFIT_PEER_SERVER")
if not path or not args or (args[0].startswith("-") and args[0] != "-c") or args[0] == "-c" and len(args) < 2:
    run_directly()
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(path)
except OSError:
    run_directly()
request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
socket.send_fds(conn, [struct.pack("!I", len(request))], [0, 1, 2])
conn.sendall(request)
status = b""
while len(status) < 4:
    chunk = conn.recv(4 - len(status))
    if not chunk:
        print(f"run_peer: the peer server's child for {args[0]} ended without an exit status "
              f"(its log: {path}.log)", file=sys.stderr)
        sys.exit(1)
    status += chunk
sys.exit(struct.unpack("!i", status)[0] & 0xFF)
