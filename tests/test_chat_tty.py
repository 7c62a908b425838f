#!/usr/bin/env python3
"""tandem chat on a pseudo-terminal and on an open pipe (stdlib only).

Usage: test_chat_tty.py TANDEM TARGET DRAFT [EDIT]   (EDIT 1: built with libedit)

- terminal: a typed line is answered (the reply, the statistics line with the
  acceptance, the next prompt) while the terminal stays open; /help lists the
  commands; a line ending in '\\' gets the continuation prompt; Ctrl-C during a
  long reply stops it and the next prompt comes, the program alive; /exit ends it
  (exit 0); Ctrl-C at an empty prompt ends it too (exit 0).  With libedit: the
  up arrow recalls the last line, which Enter sends again.
- pipe: a line written to a pipe that stays open is answered, the reply equal to
  what `generate --messages` gives for the same conversation.
"""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time

TANDEM, TARGET, DRAFT = sys.argv[1:4]
EDIT = len(sys.argv) > 4 and sys.argv[4] == "1"
FAILS = 0


def check(ok, what, detail=""):
    global FAILS
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else ": " + detail), flush=True)
    if not ok:
        FAILS += 1


class Tty:
    """tandem chat ARGS in a pseudo-terminal; out is everything it wrote so far."""

    def __init__(self, args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(TANDEM, [TANDEM, "chat"] + args)
        self.out = b""

    def expect(self, pattern, timeout, start=0):
        """Reads until pattern (bytes) occurs in out after offset start; its end, or -1."""
        end = time.monotonic() + timeout
        while True:
            i = self.out.find(pattern, start)
            if i >= 0:
                return i + len(pattern)
            left = end - time.monotonic()
            if left <= 0:
                return -1
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    b = os.read(self.fd, 4096)
                except OSError:
                    b = b""
                if not b:
                    return self.out.find(pattern, start) if pattern in self.out[start:] else -1
                self.out += b

    def send(self, data):
        os.write(self.fd, data)

    def alive(self):
        return os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def wait(self, timeout):
        """The exit status, or None when it did not end in time (then killed)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.expect(b"\x00never", 0.1)  # drain the output
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(st)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None


def tail(t, n=600):
    return repr(t.out[-n:])


def stop_reply(t, line, p):
    """Sends line, and Ctrl-C once 20 bytes of the reply have come; where "[reply
    stopped]" and the statistics' ", cancelled]" end after offset p (-1: not seen)."""
    t.send(line + b"\r")
    q = t.expect(line + b"\r\n", 30, p)  # the echo
    end = time.monotonic() + 30
    while q >= 0 and len(t.out) < q + 20 and time.monotonic() < end:
        t.expect(b"\x00never", 0.05, q)
    t.send(b"\x03")
    s = t.expect(b"[reply stopped]", 30, p)
    return s, t.expect(b", cancelled]", 10, max(s, p))


def terminal():
    t = Tty(["-m", TARGET, "-d", DRAFT, "--chat-template", "chatml", "-n", "8"])
    p = t.expect(b"> ", 60)
    check(p >= 0, "tty: the first prompt", tail(t))
    t0 = time.monotonic()
    t.send(b"def add(a, b):\r")
    s = t.expect(b" tokens, ", 60, p)
    e = t.expect(b"]", 5, s) if s >= 0 else -1
    stats = t.out[s:e].decode(errors="replace") if e >= 0 else ""
    check(s >= 0, "tty: a typed line is answered before the end of input (%.1f s)" % (time.monotonic() - t0),
          tail(t))
    check("acceptance " in stats, "tty: the statistics line shows the acceptance", stats)
    p = t.expect(b"> ", 10, max(s, 0))
    check(p >= 0, "tty: the next prompt", tail(t))
    if EDIT:
        t.send(b"\x1b[A\r")
        s = t.expect(b" tokens, ", 60, p)
        check(s >= 0 and t.out[p:s].count(b"def add(a, b):") >= 1,
              "tty: the up arrow recalls the last line (history)", tail(t))
        p = t.expect(b"> ", 10, max(s, p))
    t.send(b"/help\r")
    p2 = t.expect(b"/reset", 10, p)
    check(p2 >= 0, "tty: /help lists the commands", tail(t))
    p = t.expect(b"> ", 10, max(p2, p))
    t.send(b"first \\\r")
    p2 = t.expect(b"... ", 10, p)
    check(p2 >= 0, "tty: a line ending in '\\' gets the continuation prompt", tail(t))
    t.send(b"second\r")
    s = t.expect(b" tokens, ", 60, p2)
    check(s >= 0 and t.out.count(b" tokens, ") == 2 + EDIT, "tty: the continued message is answered once", tail(t))
    p = t.expect(b"> ", 10, max(s, p2))
    t.send(b"/exit\r")
    rc = t.wait(30)
    check(rc == 0, "tty: /exit ends the chat with 0", "exit %r; %s" % (rc, tail(t)))

    # Ctrl-C during a long reply: the reply stops, the prompt comes back.
    t = Tty(["-m", TARGET, "--chat-template", "chatml", "-n", "100000", "--temp", "1.5", "--seed", "3"])
    p = t.expect(b"> ", 60)
    s, e = stop_reply(t, b"Write a long Python module with many classes.", p)
    check(s >= 0, "tty: Ctrl-C during a reply stops it", tail(t))
    check(e >= 0, "tty: the stopped reply's statistics say cancelled", tail(t))
    p = t.expect(b"> ", 10, max(e, s, p))
    check(p >= 0 and t.alive(), "tty: after Ctrl-C the next prompt comes and the program is alive", tail(t))
    s, e = stop_reply(t, b"import os", p)
    check(e >= 0, "tty: the conversation goes on after Ctrl-C (a second reply, stopped too)", tail(t))
    p = t.expect(b"> ", 10, max(e, s, p))
    t.send(b"\x03")
    rc = t.wait(30)
    check(rc == 0, "tty: Ctrl-C at an empty prompt ends the chat with 0", "exit %r; %s" % (rc, tail(t)))


def pipe():
    args = ["-m", TARGET, "-d", DRAFT, "--chat-template", "chatml", "-n", "12"]
    with tempfile.TemporaryDirectory() as tmp:
        msgs = os.path.join(tmp, "m.json")
        with open(msgs, "w") as f:
            json.dump([{"role": "user", "content": "def add(a, b):"}], f)
        r = subprocess.run([TANDEM, "generate", "-m", TARGET, "--messages", msgs, "--chat-template", "chatml",
                            "-n", "12", "--json"], capture_output=True, text=True, check=True)
        want = (json.loads(r.stdout)["text"] + "\n").encode()
    proc = subprocess.Popen([TANDEM, "chat"] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(b"def add(a, b):\n")
    proc.stdin.flush()
    got, end = b"", time.monotonic() + 60
    while len(got) < len(want) and time.monotonic() < end:
        r, _, _ = select.select([proc.stdout], [], [], end - time.monotonic())
        if not r:
            break
        b = os.read(proc.stdout.fileno(), 4096)
        if not b:
            break
        got += b
    check(got == want and proc.poll() is None, "pipe: a line is answered while the pipe stays open",
          "got %r, want %r" % (got, want))
    proc.stdin.write(b"/exit\n")
    proc.stdin.close()
    rc = proc.wait(30)
    check(rc == 0, "pipe: /exit ends it with 0", "exit %r" % rc)


terminal()
pipe()
print("%d failed" % FAILS)
sys.exit(1 if FAILS else 0)
