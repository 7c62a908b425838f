"""serve_util.py - helpers of the `tandem serve` tests (test_serve.py, test_serve_nginx.py).

Starts servers on loopback ports (--port 0: the server prints the port it got), sends
raw HTTP requests with the standard library, and counts checks; every loop is bounded
in count and time and every process started is killed at exit.
"""
import atexit
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

MODELS = os.environ.get("TDM_MODELS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
TARGET = os.path.join(MODELS, "pycode-target-f16.gguf")
DRAFT = os.path.join(MODELS, "pycode-draft-xs-f16.gguf")
HOST = "127.0.0.1"

_procs = []


def _kill_all():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_kill_all)


class Checks:
    """Named checks; the closing line is 'N passed, N failed'."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print("ok   - " + what, flush=True)
        else:
            self.failed += 1
            print("FAIL - %s%s" % (what, (": " + str(detail)[:600]) if detail else ""), flush=True)
        return ok

    def finish(self, skipped_reason=None):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        if self.failed:
            sys.exit(1)
        if skipped_reason:
            print("skipped in part: " + skipped_reason, flush=True)
            sys.exit(77)
        sys.exit(0)


class Server:
    """A `tandem serve` process; its stderr is collected in self.log."""

    def __init__(self, tandem, args, port=0, timeout=60, wait=True):
        """wait: until it says it is ready (else return at once: give the port)."""
        self.args = [tandem, "serve", "--host", HOST, "--port", str(port)] + list(args)
        self.log = []
        self.port = port or None
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        _procs.append(self.proc)
        self._ready = threading.Event()
        self._listening = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if wait and not self._ready.wait(timeout):
            self.proc.kill()
            raise RuntimeError("tandem serve did not get ready: " + "".join(self.log)[-2000:])

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://[^ ]*:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self._listening.set()
            if line.startswith("serve: ready"):
                self._ready.set()
        self._ready.set()  # (exited: the caller sees the log)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends sig and waits; the exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def request(port, method, path, body=None, headers=None, timeout=60):
    """(status, headers dict (lower-case names), body bytes); body: dict/list (JSON), str or bytes."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if body is not None:
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def post(port, path, body, headers=None, timeout=60):
    return request(port, "POST", path, body, headers, timeout)


def metrics(port):
    """GET /metrics as {name{labels}: value}."""
    st, _, data = request(port, "GET", "/metrics")
    out = {}
    if st != 200:
        return out
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_until(cond, timeout, step=0.05):
    t_end = time.time() + timeout
    while time.time() < t_end:
        if cond():
            return True
        time.sleep(step)
    return cond()
