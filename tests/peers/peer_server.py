"""A fork server for the test suite's Python peers.

Most of a peer's time is spent importing torch, transformers, PEFT and TRL
(about 10 s each time on CI's two cores) before it computes a few
milliseconds of reference numbers, and the suite starts a peer more than a
hundred times. This server imports them once and forks a child per request,
which runs the peer script with the caller's arguments, working directory,
environment and standard streams, and returns its exit status.

    peer_server.py start SOCKET   spawn a detached server (ctest's setup fixture):
                                  it listens on SOCKET once its imports are done
    peer_server.py stop SOCKET    stop it (ctest's cleanup fixture)
    peer_server.py serve SOCKET   the server itself, in the foreground

Callers go through run_peer.py, which runs the script with the project's
Python directly whenever no server answers: the server only saves time,
it never changes what a peer computes. It exits after an hour without a
request, so a suite that was killed does not leave it behind for long.
"""

import os
import signal
import socket
import struct
import subprocess
import sys

IDLE_SECONDS = 3600


def preload():
    """Imports what the peers import (each one optional), running no op: a
    parent that had started torch's or tokenizers' thread pools would hand
    its children pools whose threads do not exist."""
    import importlib

    for name in (
        "numpy",
        "torch",
        "safetensors.torch",
        "tokenizers",
        "sentencepiece",
        "gguf",
        "datasets",
        "transformers",
        "peft",
        "trl",
    ):
        try:
            importlib.import_module(name)
        except Exception as e:  # a missing peer library fails its own test, not the server
            print(f"peer server: import {name}: {e}", file=sys.stderr)
    # transformers and TRL import their classes lazily: touch the ones the peers use.
    for module, names in (
        ("transformers", ["AutoModelForCausalLM", "AutoTokenizer", "LlamaForCausalLM",
                          "Qwen2ForCausalLM", "GPT2LMHeadModel", "PreTrainedTokenizerFast"]),
        ("trl", ["DPOTrainer", "CPOTrainer", "ORPOTrainer", "KTOTrainer", "SFTTrainer"]),
        ("peft", ["PeftModel"]),
    ):
        try:
            m = importlib.import_module(module)
            for n in names:
                getattr(m, n)
        except Exception as e:
            print(f"peer server: {module}: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()


def read_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("the caller went away")
        data += chunk
    return data


def run_request(conn):
    """In the forked child: become the caller's process and run its script."""
    import json
    import runpy
    import traceback

    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    if len(head) != 4 or len(fds) != 3:
        os._exit(2)
    request = json.loads(read_exactly(conn, struct.unpack("!I", head)[0]))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    sys.argv = argv
    if argv[0] == "-c":
        sys.argv = ["-c"] + argv[2:]
        sys.path[0] = ""
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    status = 0
    try:
        if argv[0] == "-c":
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        import atexit

        atexit._run_exitfuncs()  # temporary folders and the like, as at a normal exit
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    conn.sendall(struct.pack("!i", status))
    os._exit(status & 0xFF)


def serve(path):
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pending = f"{path}.{os.getpid()}"
    listener.bind(pending)
    listener.listen(16)
    os.replace(pending, path)  # callers find the socket only once the imports are done
    identity = os.stat(path).st_ino

    def leave(*_):
        try:
            if os.stat(path).st_ino == identity:
                os.unlink(path)
        except OSError:
            pass
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener.settimeout(IDLE_SECONDS)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            leave()
        try:
            if os.stat(path).st_ino != identity:  # another server took the path over
                conn.close()
                leave()
        except OSError:
            conn.close()
            leave()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the script's own subprocesses
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            listener.close()
            conn.settimeout(None)
            try:
                run_request(conn)
            finally:
                os._exit(3)
        conn.close()


def pid_file(path):
    return path + ".pid"


def stop(path):
    try:
        with open(pid_file(path)) as f:
            os.kill(int(f.read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for p in (path, pid_file(path)):
        try:
            os.unlink(p)
        except OSError:
            pass


def start(path):
    stop(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives this setup test
        )
    with open(pid_file(path), "w") as f:
        f.write(str(server.pid))
    print(f"peer server {server.pid} importing; it answers on {path} when done")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop", "serve"):
        sys.exit(__doc__)
    {"start": start, "stop": stop, "serve": serve}[sys.argv[1]](sys.argv[2])
