"""ctest's check of the peer fork server: a peer run through it gets the
caller's arguments, working directory, environment, standard streams and
exit status, exactly as a direct run would, and really ran in the server
(its imports were already there).

    peer_server_check.py SOCKET   waits up to 180 s for the server to answer
"""

import os
import subprocess
import sys
import tempfile
import time

sock = sys.argv[1]
run_peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_peer.py")
deadline = time.time() + 180
while not os.path.exists(sock):
    if time.time() > deadline:
        sys.exit(f"no peer server answered on {sock} within 180 s (see {sock}.log)")
    time.sleep(1)

code = """
import os, sys
print("out", sys.argv[1:], os.getcwd(), os.environ["PEER_CHECK"], sys.stdin.read().strip(),
      "transformers" in sys.modules)
print("err", file=sys.stderr)
sys.exit(7)
"""
with tempfile.TemporaryDirectory() as cwd:
    env = dict(os.environ, TIGHTFIT_PEER_SERVER=sock, PEER_CHECK="env-value")
    r = subprocess.run([sys.executable, "-S", run_peer, "-c", code, "a", "b c"], cwd=cwd, env=env,
                       input="from stdin", capture_output=True, text=True)
    want = f"out ['a', 'b c'] {os.path.realpath(cwd)} env-value from stdin True\n"
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert r.stdout == want, (r.stdout, want)
    assert r.stderr == "err\n", r.stderr
    # A script that raises fails with its traceback, as python itself does.
    script = os.path.join(cwd, "raises.py")
    with open(script, "w") as f:
        f.write("raise ValueError('from the peer')\n")
    r = subprocess.run([sys.executable, "-S", run_peer, script], cwd=cwd, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "ValueError: from the peer" in r.stderr, (r.returncode, r.stderr)
print("the peer server forwards arguments, folder, environment, streams and exit status")
