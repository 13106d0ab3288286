#!/usr/bin/env python3
"""serve_fuzz.py DJINN CONVERT DATA [REQUESTS] [SEED]: random requests to a running `djinn serve` (black-box).

Converts stories260K from DATA (f16) in a scratch folder and serves it on the CPU (-c 128, --parallel 4, 16
connections, a 2 s timeout, 4 breakpoints). Each request (default 400) is a well-formed completion, stream, chat,
session, park, breakpoint or metrics request, or one mutated at the byte level (bytes changed, cut, repeated,
CRLFs, quotes, NULs, huge numbers inserted), sent whole, in part then closed, twice on one connection, or sent and
left unread; its Content-Length right, short, long or huge. The server must stay up, answer /health at the end,
stop on SIGTERM within 30 s with exit 0, and (a sanitizer build: build-san/bin/djinn) report no error.
"""
import json
import re
import shutil
import socket
import subprocess
import sys
import time

import blackbox


def mutate(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(0, 4)):
        if not b:
            break
        i, op = rng.randrange(len(b)), rng.random()
        if op < 0.3:
            b[i] = rng.randrange(256)
        elif op < 0.5:
            del b[i:i + rng.randint(1, 8)]
        elif op < 0.7:
            b[i:i] = rng.choice([b"\r\n", b"\"", b"{", b"9999999999", b"\x00", b"%", b"\\u0000", b"-1", b"[]"])
        else:
            b[i:i] = b[i:i + rng.randint(1, 30)]
    return bytes(b)


def main():
    dj, conv, data, n, rng, w = blackbox.setup(__doc__, 400, "serve_fuzz")
    model = blackbox.stories(conv, data, w, "f16")
    p = subprocess.Popen([dj, "serve", model, "--cpu", "-q", "--port", "0", "-c", "128", "--timeout", "2",
                          "--max-conns", "16", "--parallel", "4", "--breakpoints", "4"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    port = None
    while port is None:
        line = p.stderr.readline().decode()
        if not line:
            sys.exit("serve_fuzz: the server did not start")
        found = re.search(r"listening on http://[^:]+:(\d+)", line)
        port = int(found.group(1)) if found else None
    bodies = [{"prompt": "Once upon a time", "max_tokens": 8},
              {"prompt": "Once", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}},
              {"prompt": "x", "max_tokens": 3, "session": "s1", "park": True},
              {"prompt": "x", "max_tokens": 3, "session": "s1"},
              {"prompt": "Once upon", "break_after_layer": 1},
              {"prompt": "a b c", "max_tokens": 4, "stop": ["b", "c"], "temperature": 0.5, "seed": 3},
              {"messages": [{"role": "user", "content": "hi"}]},
              {"prompt": "x " * 300, "max_tokens": 2}]
    paths = ["/v1/completions", "/v1/chat/completions", "/health", "/metrics", "/v1/models", "/v1/sessions/s1/park",
             "/v1/sessions/s1", "/v1/sessions/%00", "/nothing", "/v1/completions?x=1"]
    bad = 0
    for _ in range(n):
        body = json.dumps(rng.choice(bodies)).encode()
        clen = len(body) if rng.random() < 0.9 else rng.choice([0, len(body) + 5, max(0, len(body) - 3), 99999999])
        req = (f"{rng.choice(['POST', 'POST', 'GET', 'DELETE', 'PUT'])} {rng.choice(paths)} HTTP/1.1\r\nHost: x\r\n"
               f"Content-Length: {clen}\r\n").encode()
        if rng.random() < 0.2:
            req += b"Connection: close\r\n"
        if rng.random() < 0.1:
            req += b"Expect: 100-continue\r\n"
        req += b"\r\n" + body
        if rng.random() < 0.5:
            req = mutate(rng, req)
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            mode = rng.random()
            if mode < 0.1:  # a part, then gone
                s.sendall(req[:rng.randint(0, len(req))])
            elif mode < 0.15:  # whole, then gone without reading
                s.sendall(req)
            else:
                s.sendall(req + req if mode < 0.2 else req)
                t0 = time.time()
                while time.time() - t0 < 5:
                    try:
                        if not s.recv(65536):
                            break
                    except socket.timeout:
                        break
            s.close()
        except OSError:
            pass  # reset or refused: the server's choice; whether it is still up is checked below
        if p.poll() is not None:
            print("serve_fuzz: the server died, exit", p.returncode, "after", req[:200])
            bad += 1
            break
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if not s.recv(4096).startswith(b"HTTP/1.1 200"):
            print("serve_fuzz: /health did not answer 200")
            bad += 1
        s.close()
    except OSError as ex:
        print("serve_fuzz: /health failed:", ex)
        bad += 1
    p.terminate()
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        print("serve_fuzz: no exit within 30 s of SIGTERM")
        bad += 1
    err = err.decode(errors="replace")
    if "Sanitizer" in err or "runtime error" in err or p.returncode != 0:
        print("serve_fuzz: exit", p.returncode, err[-3000:])
        bad += 1
    shutil.rmtree(w, ignore_errors=True)
    print(f"serve_fuzz: {n} requests, {bad} failures")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
