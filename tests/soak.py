#!/usr/bin/env python3
"""soak.py: `djinn serve` under a bounded mix of clients, well-behaved and not, on loopback (make soak; CI runs it
against the sanitized build). Well-behaved clients ask for greedy completions, streamed and not, and must get the
command line's text, each within BOUND_S; one holds two-turn conversations in sessions (named by `session` or by
`user`, parked between the turns or not, deleted after or left to the LRU), its second turn the command line's text
for the whole conversation; beside them clients pipeline hundreds of requests, trickle a head byte by byte, stop
reading, leave mid-stream, reset, send half a body and go, knock without the key, and open sessions by the dozen. After a warm-up
round and after the measured rounds, with every client gone, the server's memory (VmRSS) is read: the second may
exceed the first by at most GROWTH_MB. The server then stops on SIGTERM with exit 0 (under ASan: no leak).

usage: soak.py DJINN CONVERT MODEL_DIR WORKDIR [SECONDS]"""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

BOUND_S = 20.0      # a well-behaved request is answered within this (a sanitized build on two busy cores)
GROWTH_MB = 48.0    # the memory the measured rounds may add to the warm-up's (allocator caches, ASan's quarantine)
KEY = "soak-key"
PROMPTS = ["Once upon a time", "The little dog", "Tom and Lily went to", "One day, a cat", "The sun was"]
THEN = " The end. Then"  # a session's second turn: the first turn's prompt and answer, then this
SESSIONS = 64        # the server's --sessions: what the session spammers fill, the LRU making room
# The KV cache small (-c 128, --kv-gb 0.01: about 125 slots): a new session takes the least recently used free slot,
# one never used first (batch.c's take_slot), so the sessions' churn writes every slot in turn and VmRSS grows to the
# whole cache (a quarter of host memory by default on the CPU) without any leak; a small cache bounds that.


def fail(msg):
    print("soak: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def connect(port, timeout=BOUND_S):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def read_all(s):
    out = b""
    while True:
        try:
            d = s.recv(1 << 16)
        except (ConnectionResetError, socket.timeout):
            break
        if not d:
            break
        out += d
    return out


def request(method, path, fields=None, key=KEY):
    """A request with a JSON body of `fields` (escaped as JSON: prompts hold quotes and newlines), closing."""
    body = json.dumps(fields).encode() if fields is not None else b""
    head = "%s %s HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % (
        method, path, key, len(body))
    return head.encode() + body


def completion_req(prompt, n, stream):
    return request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream})


def exchange(port, req):
    """req sent on a connection of its own; the whole answer (OSError where the connection fails)."""
    s = connect(port)
    s.sendall(req)
    raw = read_all(s)
    s.close()
    return raw


def text_of(raw, stream):
    if not raw.startswith(b"HTTP/1.1 200"):
        return None
    body = raw.split(b"\r\n\r\n", 1)[1].decode("utf-8", "replace")
    if not stream:
        try:
            return json.loads(body)["choices"][0]["text"]
        except (ValueError, KeyError, IndexError):
            return None
    if not body.rstrip().endswith("data: [DONE]"):
        return None
    out = ""
    for line in body.split("\n"):
        if line.startswith("data: {"):
            try:
                out += json.loads(line[6:])["choices"][0]["text"]
            except (ValueError, KeyError, IndexError):
                return None
    return out


class Soak:
    def __init__(self, port, want, want2):
        self.port, self.want, self.want2 = port, want, want2
        self.errors, self.good, self.worst, self.conversations = [], 0, 0.0, 0
        self.lock = threading.Lock()

    def err(self, msg):
        with self.lock:
            self.errors.append(msg)

    # ---- the well-behaved: each answer right, and in time
    def ask(self, what, fields, stream, want):
        """A greedy completion of `fields`, which must answer `want` within BOUND_S; whether it came."""
        t0 = time.time()
        try:
            raw = exchange(self.port, request("POST", "/v1/completions", dict(fields, temperature=0, stream=stream)))
        except OSError as e:
            self.err("a well-behaved request failed: %s" % e)
            return False
        dt = time.time() - t0
        got = text_of(raw, stream)
        if got != want:
            self.err("%s (stream %s): %r, want %r: %r" % (what, stream, got, want, raw[:300]))
        elif dt > BOUND_S:
            self.err("%s answered after %.1f s" % (what, dt))
        with self.lock:
            self.good += 1
            self.worst = max(self.worst, dt)
        return True

    def good_client(self, rng, until):
        while time.time() < until:
            p = rng.choice(PROMPTS)
            self.ask(repr(p), {"prompt": p, "max_tokens": 30}, rng.random() < 0.5, self.want[p])

    # ---- conversations: the second turn's text is the whole conversation's, whatever the cache did
    def session_client(self, rng, tid, until):
        n = 0
        while time.time() < until:
            p, n = rng.choice(PROMPTS), n + 1
            name, by = "conv-%d-%d" % (tid, n), rng.choice(["session", "user"])
            turns = [(p, self.want[p], rng.random() < 0.3), (p + self.want[p] + THEN, self.want2[p], False)]
            for prompt, want, park in turns:
                fields = {"prompt": prompt, "max_tokens": 30, by: name}
                if park:
                    fields["park"] = True
                if not self.ask("conversation %s (%s, park %s)" % (name, by, park), fields, rng.random() < 0.5, want):
                    break
            with self.lock:
                self.conversations += 1
            if rng.random() < 0.5:  # else left to the LRU
                try:
                    raw = exchange(self.port, request("DELETE", "/v1/sessions/" + name))
                    if not raw.startswith(b"HTTP/1.1 200") and not raw.startswith(b"HTTP/1.1 404"):
                        self.err("deleting %s: %r" % (name, raw[:200]))  # (404: the LRU took it first)
                except OSError as e:
                    self.err("deleting %s failed: %s" % (name, e))

    # ---- the others: each act checked only for not hurting the well-behaved
    def pipeliner(self, rng):
        s = connect(self.port)
        s.sendall(b"GET /health HTTP/1.1\r\n\r\n" * rng.randint(50, 400) + completion_req("The sun was", 10, False))
        raw = read_all(s)
        s.close()
        if raw.count(b"HTTP/1.1 200") < 2:
            self.err("a pipeliner got %d answers" % raw.count(b"HTTP/1.1 200"))

    def trickler(self, rng):
        s = connect(self.port)
        for ch in b"POST /v1/completions HTTP/1.1\r\nContent-Le":
            s.send(bytes([ch]))
            time.sleep(0.01)
        read_all(s)  # 408 after --timeout, or nothing
        s.close()

    def deaf(self, rng):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", self.port))
        s.settimeout(BOUND_S)
        try:  # more answers than the sockets' buffers hold, none of them read
            s.sendall(("GET /metrics HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n" % KEY).encode() * 2000)
        except OSError:
            pass
        time.sleep(rng.uniform(0.5, 2.0))
        s.close()

    def leaver(self, rng):
        s = connect(self.port)
        s.sendall(completion_req(rng.choice(PROMPTS), 200, True))
        s.recv(200)
        if rng.random() < 0.5:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()

    def half_body(self, rng):
        s = connect(self.port)
        req = completion_req("Once upon a time", 10, False)
        s.sendall(req[: rng.randint(1, len(req) - 1)])
        s.close()

    def keyless(self, rng):
        s = connect(self.port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 8000000\r\n\r\n")
        raw = read_all(s)
        s.close()
        if not raw.startswith(b"HTTP/1.1 401"):
            self.err("a client without the key got %r" % raw[:60])

    def session_spammer(self, rng):
        """A dozen sessions of fresh names, some parked, one token each: more than --sessions over a round."""
        for _ in range(12):
            fields = {"prompt": rng.choice(PROMPTS), "max_tokens": 1,
                      rng.choice(["session", "user"]): "spam-%016x" % rng.getrandbits(64)}
            if rng.random() < 0.5:
                fields["park"] = True
            exchange(self.port, request("POST", "/v1/completions", fields))

    def hostile(self, seed, until):
        rng = random.Random(seed)
        acts = [self.pipeliner, self.trickler, self.deaf, self.leaver, self.half_body, self.keyless,
                self.session_spammer]
        while time.time() < until:
            try:
                rng.choice(acts)(rng)
            except OSError:
                pass  # the server may refuse or reset any of these

    def round(self, seconds, seed):
        until = time.time() + seconds
        threads = [threading.Thread(target=self.good_client, args=(random.Random(seed + i), until)) for i in range(3)]
        threads += [threading.Thread(target=self.session_client, args=(random.Random(seed + 50), seed, until))]
        threads += [threading.Thread(target=self.hostile, args=(seed + 100 + i, until)) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=seconds + 3 * BOUND_S)
            if t.is_alive():
                fail("a client thread hung")


def metric(port, name):
    s = connect(port)
    s.sendall(("GET /metrics HTTP/1.1\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % KEY).encode())
    raw = read_all(s).decode()
    s.close()
    m = re.search(r"\ndjinn_%s (\S+)" % name, raw)
    return float(m.group(1)) if m else None


def settle(port, proc):
    """Waits until only the metrics request's own connection is open and nothing is held; the server's VmRSS, MB."""
    for _ in range(int(3 * BOUND_S * 10)):
        if metric(port, "connections") == 1 and metric(port, "requests_active") == 0:
            break
        time.sleep(0.1)
    else:
        fail("connections did not close after the round: %s" % metric(port, "connections"))
    with open("/proc/%d/status" % proc.pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024.0


def main():
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    djinn, convert, model_dir, work = sys.argv[1:5]
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "soak.bin")
    subprocess.run([convert, model_dir, model, "--dtype", "f32", "-q"], check=True)
    want, want2 = {}, {}
    for p in PROMPTS:
        out = subprocess.run([djinn, model, "-p", p, "-n", "30", "-t", "0", "--cpu"], check=True,
                             capture_output=True).stdout.decode()
        want[p] = out[len(p):].rstrip("\n")
        whole = p + want[p] + THEN
        out = subprocess.run([djinn, model, "-p", whole, "-n", "30", "-t", "0", "--cpu"], check=True,
                             capture_output=True).stdout.decode()
        want2[p] = out[len(whole):].rstrip("\n")
    err_path = os.path.join(work, "serve.err")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:quarantine_size_mb=16")
    with open(err_path, "w") as err:  # every client is 127.0.0.1: one address, as behind a proxy (--client-share 1)
        proc = subprocess.Popen([djinn, "serve", model, "--cpu", "--port", "0", "--threads", "2", "--timeout", "2",
                                 "--max-conns", "48", "--client-share", "1", "--api-key", KEY, "--sessions",
                                 str(SESSIONS), "-c", "128", "--kv-gb", "0.01", "-q"], stderr=err,
                                env=env)
    port = None
    for _ in range(300):
        m = re.search(r"listening on http://127.0.0.1:(\d+)", open(err_path).read())
        if m:
            port = int(m.group(1))
            break
        if proc.poll() is not None:
            fail("the server exited: " + open(err_path).read())
        time.sleep(0.1)
    if not port:
        fail("the server did not listen")
    for _ in range(600):  # the port comes first, then the model: /health says 503 "loading" until it is in
        try:
            s = connect(port)
            s.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
            if read_all(s).startswith(b"HTTP/1.1 200"):
                break
        except OSError:
            pass
        time.sleep(0.1)
    else:
        fail("the server did not finish loading")
    soak = Soak(port, want, want2)
    try:
        soak.round(seconds / 3, 1)
        rss0 = settle(port, proc)
        soak.round(seconds * 2 / 3, 2)
        rss1 = settle(port, proc)
        parks, restores = metric(port, "parks_total"), metric(port, "restores_total")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=3 * BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "hung"
    log = open(err_path).read()
    for e in soak.errors[:10]:
        print("soak: " + e, file=sys.stderr)
    print("soak: %d well-behaved requests (%d conversations), the slowest %.2f s; %s caches parked, %s restored; VmRSS "
          "%.1f MB after the warm-up, %.1f MB after the rounds; exit %s"
          % (soak.good, soak.conversations, soak.worst, parks, restores, rss0, rss1, rc), file=sys.stderr)
    if soak.errors:
        fail("%d well-behaved requests went wrong" % len(soak.errors))
    if soak.good < 10:
        fail("only %d well-behaved requests were answered" % soak.good)
    if soak.conversations < 2 or not parks or not restores:
        fail("the sessions went untested: %d conversations, %s parks, %s restores" % (soak.conversations, parks,
                                                                                       restores))
    if rss1 - rss0 > GROWTH_MB:
        fail("memory grew by %.1f MB over the rounds" % (rss1 - rss0))
    if rc != 0 or "Sanitizer" in log:
        fail("the server exited %s: %s" % (rc, log[-2000:]))
    print("soak: passed", file=sys.stderr)


if __name__ == "__main__":
    main()
