"""test_serve_nginx.py - nginx balancing two `tandem serve` replicas, on loopback.

usage: python3 test_serve_nginx.py TANDEM [full|reduced]

nginx (Debian's package) runs in the foreground with a config, prefix, pid file and
temporary directories of its own under a temporary directory, on a free loopback
port, in front of two replicas with passive health checks (max_fails, fail_timeout,
proxy_next_upstream).  Three phases, each a bounded load (full: 200 requests 16 at a
time, max_tokens 8; reduced, for the sanitizer build: 60 requests 8 at a time):
  1. both replicas up: every request succeeds, both take traffic;
  2. replica A is killed (SIGKILL) in the middle: requests in flight on it may fail,
     none started after it died does;
  3. A is restarted on its port: every request succeeds and A takes traffic again.
Prints 'N passed, N failed'; exits 77 when nginx is not installed.
"""
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import HOST, TARGET, Checks, Server, _procs, free_port, post, request, wait_until  # noqa: E402

TANDEM = sys.argv[1]
REDUCED = len(sys.argv) > 2 and sys.argv[2] == "reduced"
N_REQ, CONC = (60, 8) if REDUCED else (200, 16)
PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
           "def parse_args():"]

nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
if not nginx:
    print("skipped: nginx is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

c = Checks()
REPLICA_ARGS = ["-m", TARGET, "-t", "1", "--max-batch", "8", "--max-queue", "256"]
a = Server(TANDEM, REPLICA_ARGS)
b = Server(TANDEM, REPLICA_ARGS)
port_a, port_b = a.port, b.port

tmp = tempfile.mkdtemp(prefix="tandem-nginx.")
lb_port = free_port()
conf = """
worker_processes 1;
daemon off;
pid {t}/nginx.pid;
error_log {t}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log {t}/access.log;
    client_body_temp_path {t}/body;
    proxy_temp_path {t}/proxy;
    fastcgi_temp_path {t}/fastcgi;
    uwsgi_temp_path {t}/uwsgi;
    scgi_temp_path {t}/scgi;
    upstream tandem {{
        server {h}:{a} max_fails=1 fail_timeout=2s;
        server {h}:{b} max_fails=1 fail_timeout=2s;
    }}
    server {{
        listen {h}:{lb};
        location / {{
            proxy_pass http://tandem;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_next_upstream error timeout http_502 http_503;
            proxy_next_upstream_tries 2;
            proxy_connect_timeout 1s;
            proxy_read_timeout 60s;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
""".format(t=tmp, h=HOST, a=port_a, b=port_b, lb=lb_port)
with open(os.path.join(tmp, "nginx.conf"), "w") as f:
    f.write(conf)
ng = subprocess.Popen([nginx, "-p", tmp, "-c", os.path.join(tmp, "nginx.conf"), "-e", os.path.join(tmp, "error.log")],
                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
_procs.append(ng)


def lb_up():
    try:
        return request(lb_port, "GET", "/health", timeout=2)[0] == 200
    except OSError:
        return False


if not wait_until(lb_up, 10):
    ng.kill()
    print("nginx did not start: %s" % (ng.stderr.read().decode(errors="replace")[-1000:]))
    c.check(False, "nginx starts")
    c.finish()


def one(i):
    """(start, end, status, upstream, completion_tokens) of request i through nginx."""
    t0 = time.time()
    try:
        st, hd, data = post(lb_port, "/v1/completions",
                            {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8, "temperature": 0}, timeout=60)
        n = json.loads(data)["usage"]["completion_tokens"] if st == 200 else -1
        return t0, time.time(), st, hd.get("x-upstream", ""), n
    except (OSError, ValueError, KeyError) as e:
        return t0, time.time(), "exception %s" % e, "", -1


def load(n, on_count=None):
    done = []
    lock = threading.Lock()

    def run(i):
        r = one(i)
        with lock:
            done.append(r)
            k = len(done)
        if on_count:
            on_count(k)
        return r

    with concurrent.futures.ThreadPoolExecutor(CONC) as ex:
        return list(ex.map(run, range(n)))


def ok(r):
    return r[2] == 200 and r[4] == 8


def by(res, port):
    return sum(1 for r in res if r[3].endswith(":%d" % port))


# phase 1: both up
t = time.time()
res = load(N_REQ)
bad = [r for r in res if not ok(r)]
c.check(not bad, "both replicas: %d requests, %d at a time, none failed (%.1f s)" % (N_REQ, CONC, time.time() - t),
        bad[:3])
c.check(by(res, port_a) > 0 and by(res, port_b) > 0,
        "both replicas take traffic (%d / %d)" % (by(res, port_a), by(res, port_b)))

# phase 2: A killed in the middle
killed = {}


def maybe_kill(k):
    if k == N_REQ // 3 and not killed:
        killed["t0"] = time.time()
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        killed["t1"] = time.time()


res = load(N_REQ, maybe_kill)
failed = [r for r in res if not ok(r)]
late = [r for r in failed if r[0] > killed.get("t1", 0)]
c.check("t1" in killed, "replica A was killed in the middle of the load")
c.check(not late, "A killed: no request started after it died failed (%d in flight on it failed)" % len(failed),
        late[:3])
after = [r for r in res if r[0] > killed.get("t1", 0)]
c.check(after and all(r[3].endswith(":%d" % port_b) or "," in r[3] for r in after if ok(r)),
        "A killed: the later requests went to B (%d of them)" % len(after))

# phase 3: A restarted on its port
a2 = Server(TANDEM, REPLICA_ARGS, port=port_a)
time.sleep(2.5)  # (fail_timeout: nginx tries A again after it)
res = load(N_REQ)
bad = [r for r in res if not ok(r)]
c.check(not bad, "A restarted: %d requests, none failed" % N_REQ, bad[:3])
c.check(by(res, port_a) > 0, "A restarted takes traffic again (%d / %d)" % (by(res, port_a), by(res, port_b)))

for s in (a2, b):
    c.check(s.stop() == 0, "replica on port %d: SIGTERM, exit 0" % s.port, "".join(s.log)[-300:])
ng.send_signal(signal.SIGQUIT)
try:
    ng.wait(10)
except subprocess.TimeoutExpired:
    ng.kill()
shutil.rmtree(tmp, ignore_errors=True)
c.finish()
