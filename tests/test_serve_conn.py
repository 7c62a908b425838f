"""test_serve_conn.py - `tandem serve`'s connections and its stopping, on loopback.

usage: python3 test_serve_conn.py TANDEM [full|reduced]

  - slow and idle clients (slowloris): hundreds of silent and trickling connections
    from several loopback addresses (127.0.0.2-7) and from 127.0.0.1 itself; /health
    and a completion are still answered, a flood from one address is held to its
    per-address limit, every one of them is closed after --read-timeout although the
    tricklers keep sending; a kept-alive connection lives past --read-timeout until
    --idle-timeout
  - a client that half-closes its side after its request gets its answer, whole or
    streamed
  - framing: conflicting Content-Length headers get 400 and the connection closed;
    HEAD is GET without the body
  - SIGTERM: a client sending its body slowly does not hold the server past the grace
    period (exit within grace + 1 s); requests cut at the end keep their text
    (finish_reason "abort", whole and streamed), those not started get 503 with
    Retry-After (whole and streamed)
  - SIGTERM during the model load (a 324 MB synthetic model, made once in the build
    directory): /health says loading with its progress, the server exits within 2 s
    without getting ready
  - --log-file: refused at startup on a read-only file system; on a full one (a 64 KiB
    tmpfs, as root; skipped when mount fails) the server keeps serving, says on stderr
    that lines are lost, the file holds only whole lines, and writing resumes (with the
    count lost) once there is room
Every loop is bounded; all sockets are on loopback.  Prints 'N passed, N failed'.
"""
import errno
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import HOST, TARGET, Checks, Server, free_port, metrics, post, request, wait_until  # noqa: E402

TANDEM = sys.argv[1]
REDUCED = len(sys.argv) > 2 and sys.argv[2] == "reduced"
C = "/v1/completions"
PROMPT = "def fibonacci(n):"
c = Checks()


def connect(src="127.0.0.1", port=None, timeout=5):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect((HOST, port))
    return s


def closed_by_peer(s):
    """True when the server closed s (EOF or reset), without blocking."""
    try:
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False
        s.setblocking(False)
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def http_raw(port, data, src="127.0.0.1", timeout=10, half_close=False):
    """Sends bytes, reads until the server closes: (status, headers, body)."""
    s = connect(src, port, timeout)
    s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except OSError:
        pass
    s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    st = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    hd = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return st, hd, body


def try_request(port, method, path, body=None, timeout=5):
    """request(), with a refused or dropped connection as status None."""
    try:
        return request(port, method, path, body, timeout=timeout)
    except OSError as e:
        return None, {}, str(e).encode()


def health_status(port):
    return try_request(port, "GET", "/health", timeout=2)[0]


def post_bytes(body, extra=b"", close=True):
    b = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n"
            % (C.encode(), len(b), extra, b"Connection: close\r\n" if close else b"")) + b


def sse_events(body):
    """The data of each event of a (chunked) SSE body."""
    out = []
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("data: "):
            out.append(line[6:])
    return out


# ---------------------------------------------------------------- slow and idle clients
N_PER_ADDR, N_ADDRS = (30, 6) if REDUCED else (100, 6)
MAX_CONN = 100 if REDUCED else 512  # (the default in full mode)
PER_IP = 128
READ_S, IDLE_S = 1.0, 3.0
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--read-timeout", str(READ_S), "--idle-timeout", str(IDLE_S)]
             + (["--max-connections", str(MAX_CONN)] if REDUCED else []))
port = srv.port

attack, tricklers = [], []
stop_trickle = threading.Event()
t_attack = time.time()
for a in range(N_ADDRS):
    src = "127.0.0.%d" % (a + 2)
    for i in range(N_PER_ADDR):
        try:
            s = connect(src, port)
        except OSError:
            continue
        attack.append(s)
        if i % 2:  # half of them trickle a request's headers, a byte at a time
            try:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                tricklers.append(s)
            except OSError:
                pass


def trickle():
    for _ in range(40):  # (4 s at most)
        if stop_trickle.wait(0.1):
            return
        for s in tricklers:
            try:
                s.send(b"X")
            except OSError:
                pass


th = threading.Thread(target=trickle, daemon=True)
th.start()
c.check(len(attack) == N_PER_ADDR * N_ADDRS and len(attack) > MAX_CONN,
        "%d silent and trickling connections from %d addresses (over max_connections %d)"
        % (len(attack), N_ADDRS, MAX_CONN), len(attack))
st, _, data = try_request(port, "GET", "/health")
c.check(st == 200, "under the flood /health is answered", (st, data[:100]))
st, _, data = try_request(port, "POST", C, {"prompt": PROMPT, "max_tokens": 4}, timeout=20)
c.check(st == 200 and json.loads(data)["usage"]["completion_tokens"] == 4, "under the flood a completion is answered",
        (st, data[:100]))

# one address flooding alone is held to its per-address limit (the oldest of its own give way)
flood = []
for i in range(PER_IP + 40):
    try:
        flood.append(connect("127.0.0.8", port))
    except OSError:
        break
ok = wait_until(lambda: sum(not closed_by_peer(s) for s in flood) <= PER_IP, 2)
c.check(len(flood) == PER_IP + 40 and ok, "one address's flood is held to --max-connections-per-ip %d" % PER_IP,
        (len(flood), sum(not closed_by_peer(s) for s in flood)))
c.check(health_status(port) == 200, "and /health is still answered")

# every silent or trickling connection is closed after --read-timeout (1 s), the
# tricklers although they keep sending
everyone = attack + flood
ok = wait_until(lambda: all(closed_by_peer(s) for s in everyone), READ_S + 2)
t_closed = time.time() - t_attack
stop_trickle.set()
th.join()
c.check(ok, "every slow connection is closed after --read-timeout (all by %.1f s)" % t_closed,
        "%d of %d still open" % (sum(not closed_by_peer(s) for s in everyone), len(everyone)))
for s in everyone:
    s.close()
m = metrics(port)
c.check(m.get('tandem_http_connections_closed_total{reason="read_timeout"}', 0) > 0
        and m.get('tandem_http_connections_closed_total{reason="evicted"}', 0) > 0,
        "/metrics counts the connections closed (read_timeout, evicted)",
        {k: v for k, v in m.items() if "connections" in k})

keep = connect(port=port)  # a kept-alive connection, idle from its answer
keep.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
resp = keep.recv(4096)
t_keep = time.time()
c.check(b"200 OK" in resp, "a kept-alive connection gets /health", resp[:80])

# half-closed clients get their answers
st, hd, body = http_raw(port, post_bytes({"prompt": PROMPT, "max_tokens": 48}), half_close=True, timeout=30)
ok = st == 200 and json.loads(body)["usage"]["completion_tokens"] == 48
c.check(ok, "a client that half-closes after its request gets the whole answer", (st, body[:200]))
st, hd, body = http_raw(port, post_bytes({"prompt": PROMPT, "max_tokens": 48, "stream": True}), half_close=True,
                        timeout=30)
ev = sse_events(body)
c.check(st == 200 and ev[-1:] == ["[DONE]"] and '"finish_reason": "length"' in body.decode(errors="replace"),
        "a client that half-closes after a streamed request gets the whole stream", (st, body[-200:]))

# framing
st, hd, body = http_raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n"
                        b"Content-Length: 40\r\n\r\n{\"prompt\": 1}")
c.check(st == 400 and b"Content-Length" in body and hd.get("connection") == "close",
        "two different Content-Length headers: 400, connection closed", (st, hd, body[:200]))
st_get, hd_get, body_get = http_raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
st, hd, body = http_raw(port, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
c.check(st == 200 and body == b"" and hd.get("content-length") == str(len(body_get)) and st_get == 200,
        "HEAD /health: GET's status and length, no body", (st, hd, body[:100]))
st, hd, _ = http_raw(port, b"HEAD /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
c.check(st == 405 and hd.get("allow") == "POST", "HEAD on a POST endpoint: 405 with Allow: POST", (st, hd))

# the kept-alive connection outlives --read-timeout; it closes at --idle-timeout
time.sleep(max(0.0, t_keep + READ_S + 0.5 - time.time()))
alive = not closed_by_peer(keep)
c.check(alive, "a kept-alive connection is not closed at --read-timeout (%.1f s idle)" % (time.time() - t_keep))
ok = wait_until(lambda: closed_by_peer(keep), IDLE_S + 2)
t_idle = time.time() - t_keep
c.check(ok and IDLE_S - 0.2 < t_idle < IDLE_S + 1.5, "a kept-alive connection is closed at --idle-timeout (%.1f s)"
        % t_idle)
keep.close()
c.check(srv.stop() == 0, "SIGTERM: exit 0", "".join(srv.log)[-500:])

# ---------------------------------------------------------------- SIGTERM: slow clients, cut requests
GRACE = 0.3  # (short: the 1,000-token requests must still be running when it ends)
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--max-batch", "2", "--shutdown-grace", str(GRACE)])
port = srv.port
results = {}


def run(name, body):
    results[name] = http_raw(port, post_bytes(body), timeout=30)


long_req = {"prompt": PROMPT, "max_tokens": 1000, "temperature": 0}
threads = [threading.Thread(target=run, args=("cut", long_req), daemon=True)]
threads[0].start()
# ("cut" runs before the stream is sent, and both before the queued ones are: the
# threads' requests could otherwise reach the server in any order)
wait_until(lambda: metrics(port).get("tandem_requests_running", 0) >= 1, 10)
sc = connect(port=port, timeout=30)  # a running stream, read here
sc.sendall(post_bytes(dict(long_req, stream=True)))
first = sc.recv(65536)
wait_until(lambda: metrics(port).get("tandem_requests_running", 0) == 2, 10)
for name, body in (("queued", long_req), ("queued_stream", dict(long_req, stream=True))):
    threads.append(threading.Thread(target=run, args=(name, body), daemon=True))
    threads[-1].start()
ok = wait_until(lambda: metrics(port).get("tandem_requests_waiting", 0) == 2, 10)
c.check(ok and b"200 OK" in first, "two requests run, two wait", metrics(port).get("tandem_requests_waiting"))
slow = connect(port=port, timeout=30)  # headers and part of a body, then nothing
slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
time.sleep(0.2)
t0 = time.time()
rc = srv.stop(timeout=GRACE + 15)
t_exit = time.time() - t0
# (the server's part is the grace + 1 s; the process's teardown comes on top)
c.check(rc == 0 and t_exit < GRACE + (2.5 if REDUCED else 1.5),
        "SIGTERM with a slow client: exit 0 within the grace + 1 s (%.1f s)" % t_exit, (rc, "".join(srv.log)[-600:]))
for t in threads:
    t.join(5)
stream = first
try:
    while True:
        b = sc.recv(65536)
        if not b:
            break
        stream += b
except OSError:
    pass
st, hd, body = results.get("cut", (0, {}, b""))
ch = json.loads(body)["choices"][0] if st == 200 else {}
c.check(st == 200 and ch.get("finish_reason") == "abort" and len(ch.get("text", "")) > 0,
        "a request cut at shutdown keeps its text, finish_reason abort", (st, body[:300]))
text = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(stream) if e.startswith("{"))
c.check('"finish_reason": "abort"' in stream.decode(errors="replace") and sse_events(stream)[-1:] == ["[DONE]"]
        and len(text) > 0, "a stream cut at shutdown keeps its text, ends with finish_reason abort and [DONE]",
        stream[-300:])
for name in ("queued", "queued_stream"):
    st, hd, body = results.get(name, (0, {}, b""))
    c.check(st == 503 and hd.get("retry-after") == "1" and b"shutting down" in body,
            "a %s request shutdown cancelled before it started: 503 with Retry-After" % name.replace("_", " "),
            (st, hd, body[:300]))
c.check(closed_by_peer(slow) or wait_until(lambda: closed_by_peer(slow), 1), "the slow client's connection is closed")
sc.close()
slow.close()

# ---------------------------------------------------------------- SIGTERM during the load
slow_model = os.path.join(os.path.dirname(os.path.abspath(TANDEM)), "serve-slow-load.gguf")
if not os.path.exists(slow_model):
    subprocess.run([TANDEM, "synth", "--shape", "llama-160m", "--type", "f16", "--force", slow_model],
                   capture_output=True, timeout=120)
p_port = free_port()
proc = subprocess.Popen([TANDEM, "serve", "-m", slow_model, "-t", "1", "--host", HOST, "--port", str(p_port)],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
health = None
t_end = time.time() + 20
while time.time() < t_end and proc.poll() is None:
    try:
        st, _, data = request(p_port, "GET", "/health", timeout=2)
        h = json.loads(data)
        if st == 503 and h.get("status") == "loading" and 0 < h.get("progress", 0) < 1:
            health = h
            break
    except (OSError, ValueError):
        pass
    time.sleep(0.005)
t0 = time.time()
proc.send_signal(signal.SIGTERM)
try:
    rc = proc.wait(10)
except subprocess.TimeoutExpired:
    proc.kill()
    rc = None
t_exit = time.time() - t0
log = proc.stderr.read()
c.check(health is not None, "while loading: /health is 503 {status: loading, progress}", health)
c.check(rc == 0 and t_exit < 2 and "SIGTERM during the load: stopped" in log and "serve: ready" not in log,
        "SIGTERM during the load: exit 0 within 2 s, never ready (%.2f s)" % t_exit, (rc, log[-400:]))

# ---------------------------------------------------------------- one log line per request, text or JSON
srv = Server(TANDEM, ["-m", TARGET, "-t", "1"])
st, _, data = post(srv.port, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 3})
n_gen = json.loads(data)["usage"]["completion_tokens"] if st == 200 else -1
request(srv.port, "GET", "/nothing")
srv.stop()
text_lines = [ln for ln in srv.log if ' "POST /v1/completions" ' in ln]
c.check(st == 200 and len(text_lines) == 1 and
        re.match(r'^serve: 127\.0\.0\.1 "POST /v1/completions" 200 \d+\.\d{3} s, %d tokens$' % n_gen, text_lines[0]),
        "text log: one line for the request: client, method, path, status, time, tokens", text_lines)
c.check(any(re.match(r'^serve: 127\.0\.0\.1 "GET /nothing" 404 \d+\.\d{3} s, 0 tokens$', ln) for ln in srv.log),
        "text log: a 404 with 0 tokens", srv.log[-4:])
p_port = free_port()
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--log-format", "json"], port=p_port, wait=False)
ok = wait_until(lambda: health_status(p_port) == 200, 30)
st, _, _ = post(p_port, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 3, "stream": True})
rc = srv.stop()
objs = []
for ln in srv.log:
    try:
        objs.append(json.loads(ln))
    except ValueError:
        objs.append(None)
c.check(ok and rc == 0 and objs and all(isinstance(o, dict) and re.match(r"^20\d\d-\d\d-\d\dT[0-9:.]+Z$", o.get("time", ""))
                                        for o in objs),
        "--log-format json: every line a JSON object with its time", srv.log[-4:])
reqs = [o for o in objs if o and o.get("event") == "request" and o.get("path") == "/v1/completions"]
c.check(st == 200 and len(reqs) == 1 and reqs[0]["method"] == "POST" and reqs[0]["status"] == 200 and
        reqs[0]["tokens"] == n_gen and reqs[0]["client"] == "127.0.0.1" and reqs[0]["outcome"] == "completed" and
        isinstance(reqs[0]["seconds"], float), "--log-format json: a streamed request's line", reqs)
c.check(any(o and "serve: ready" in o.get("msg", "") for o in objs), "--log-format json: the server's own lines as msg",
        srv.log[:3])
r = subprocess.run([TANDEM, "serve", "-m", TARGET, "--log-format", "xml"], capture_output=True, text=True, timeout=30)
c.check(r.returncode == 2 and "'xml' is not text or json" in r.stderr, "--log-format xml: a usage error", r.stderr)

# ---------------------------------------------------------------- the log file on a full or read-only disk
mnt = tempfile.mkdtemp(prefix="tandem-serve-log.")
mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], capture_output=True).returncode == 0
ro = tempfile.mkdtemp(prefix="tandem-serve-ro.")
ro_mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", ro],
                            capture_output=True).returncode == 0
skipped = None
try:
    if not (mounted and ro_mounted):
        skipped = "the log file checks need root to mount a tmpfs"
    else:
        r = subprocess.run([TANDEM, "serve", "-m", TARGET, "--port", "0", "--log-file", os.path.join(ro, "serve.log")],
                           capture_output=True, text=True, timeout=30)
        c.check(r.returncode == 1 and "cannot open it for appending: Read-only file system" in r.stderr
                and "listening" not in r.stderr, "a log file on a read-only file system: refused at startup",
                r.stderr[-300:])
        logf = os.path.join(mnt, "serve.log")
        p_port = free_port()
        srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--log-file", logf], port=p_port, wait=False)
        ok = wait_until(lambda: health_status(p_port) == 200, 30)
        c.check(ok and srv.log == [], "with --log-file the lines go to the file, not stderr", srv.log[-3:])
        filler = os.path.join(mnt, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)  # the disk full
        full = False
        try:
            for _ in range(1000):
                os.write(fd, b"x" * 1024)
        except OSError as e:
            full = e.errno == errno.ENOSPC
        os.close(fd)
        sts = []  # (the file's last page may hold a few more lines: requests until a write fails)
        for _ in range(300):
            sts.append(health_status(p_port))
            if wait_until(lambda: any("cannot write" in ln for ln in srv.log), 0.01):
                break
        sts += [health_status(p_port) for _ in range(3)]
        c.check(full and set(sts) == {200}, "the disk full: the server goes on answering (%d requests)" % len(sts),
                sts[-10:])
        c.check(any("cannot write (No space left on device)" in ln for ln in srv.log),
                "a failed log write is reported on stderr with its cause", srv.log[-3:])
        os.unlink(filler)
        request(p_port, "GET", "/v1/models")
        ok = wait_until(lambda: any("writing again (" in ln for ln in srv.log), 5)

        def log_text():
            with open(logf, "rb") as f:
                return f.read()
        # (the request's own line may be written after the line that found room again,
        # a held-back /health line: wait for it rather than read once)
        wait_until(lambda: b'"GET /v1/models" 200' in log_text(), 5)
        text = log_text()
        c.check(ok and text.endswith(b"\n") and b"log lines were lost here" in text and b'"GET /v1/models" 200' in text,
                "room again: the log resumes, saying how many lines were lost", (srv.log[-2:], text[-300:]))
        c.check(all(ln.startswith(b"20") and b" serve: " in ln for ln in text.splitlines()),
                "the log file holds whole, time-stamped lines only", text[-400:])
        c.check(srv.stop() == 0, "SIGTERM: exit 0")
finally:
    if srv.proc.poll() is None:  # (its log file keeps the mount busy)
        srv.proc.kill()
        srv.proc.wait()
    for d, m_ in ((mnt, mounted), (ro, ro_mounted)):
        if m_:
            subprocess.run(["umount", d], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
c.finish(skipped)
