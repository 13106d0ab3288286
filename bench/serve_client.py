#!/usr/bin/env python3
"""bench/serve_client.py: load for `djinn serve` (standard library only), driven by bench/serve_bench.sh.

  serve_client.py load   PORT N MAX_TOKENS OUT.json   N concurrent greedy completions of MAX_TOKENS at once
        (ignore_eos: no end token cuts one short): total tokens/s
  serve_client.py agents PORT N TURNS ANSWER WAIT_S OUT.json
        N agents, each a session of TURNS chat turns: an answer of ANSWER tokens (greedy), then WAIT_S seconds away
        (a tool call) and a new user message of about 100 tokens; every agent parks its session while it waits.
        Reports each turn's latency (p50, p99), the server's parking figures (/metrics) and whether anything was
        lost: a failed request or a dropped cache (a session that had to prefill again). That a restored cache
        continues exactly is tested on stories260K (tests/test_server.c, gpu_sessions_...): here, on random
        weights, a batched pass and a lone one round differently and flip greedy near-ties, so texts are not compared.
"""
import http.client
import json
import sys
import threading
import time


def post(port, path, body, timeout=3600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k.replace("djinn_", "")] = float(v)
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else 0.0


def run_threads(th):
    """Starts every thread, waits for all; the seconds it took."""
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join()
    return time.time() - t0


def load(port, n, max_tokens, out):
    post(port, "/v1/completions", {"prompt": "Warm up", "max_tokens": 4, "temperature": 0})
    m0 = metrics(port)
    res, errs = [None] * n, []

    def one(i):
        t0 = time.time()
        try:
            # ignore_eos: every answer max_tokens long, so both dtypes' runs do the same work (the random weights'
            # greedy answers end at an end token in some requests of one dtype and not the other's)
            r = post(port, "/v1/completions", {"prompt": f"Story number {i}: once upon a time", "max_tokens": max_tokens,
                                               "temperature": 0, "ignore_eos": True})
            res[i] = (t0, time.time(), r["usage"]["completion_tokens"])
        except Exception as ex:  # reported, not hidden
            errs.append(str(ex))

    wall = run_threads([threading.Thread(target=one, args=(i,)) for i in range(n)])
    m1 = metrics(port)
    done = [r for r in res if r]
    toks = sum(r[2] for r in done)
    steps = m1.get("decode_steps_total", 0) - m0.get("decode_steps_total", 0)
    rows = m1.get("decode_rows_total", 0) - m0.get("decode_rows_total", 0)
    dec_s = m1.get("decode_seconds_total", 0) - m0.get("decode_seconds_total", 0)
    rep = {"concurrency": n, "max_tokens": max_tokens, "requests_ok": len(done), "errors": errs[:5],
           "completion_tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall if wall > 0 else 0,
           "decode_steps": steps, "rows_per_step": rows / steps if steps else 0,
           "decode_step_ms": 1e3 * dec_s / steps if steps else 0,
           "decode_tokens_per_s": rows / dec_s if dec_s > 0 else 0,
           "latency_p50_s": pct([r[1] - r[0] for r in done], 50), "latency_p99_s": pct([r[1] - r[0] for r in done], 99),
           "pcie_gb_per_s": m1.get("pcie_gb_per_second", 0)}
    json.dump(rep, open(out, "w"), indent=1)
    print(f"  {n:3d} concurrent: {toks} tokens in {wall:.1f} s = {rep['tokens_per_s']:.1f} tok/s "
          f"({rep['rows_per_step']:.1f} rows a step, {rep['decode_step_ms']:.1f} ms a step), {len(errs)} errors")


TOOL = ("The tool returned the following report about the weather, the roads and the trains in the region, "
        "with a list of every town that was checked and the time it took to reach it by car and by train. ")


def agent_turns(port, i, turns, answer, wait, lat, errs, answers, park):
    msgs = [{"role": "user", "content": f"Agent {i}: plan the trip number {i} step by step."}]
    mine = []
    for k in range(turns):
        body = {"messages": msgs, "max_tokens": answer, "temperature": 0, "session": f"agent{i}", "park": park}
        t0 = time.time()
        try:
            r = post(port, "/v1/chat/completions", body)
        except Exception as ex:
            errs.append(f"agent {i} turn {k}: {ex}")
            return
        lat.append(time.time() - t0)
        # random weights generate any token, NUL included, which a request may not carry back
        text = r["choices"][0]["message"]["content"].replace("\x00", "")
        mine.append(text)
        msgs = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": TOOL * 3 + f"(call {k})"}]
        if k + 1 < turns:
            time.sleep(wait)
    answers[i] = mine


def agents(port, n, turns, answer, wait, out):
    m0 = metrics(port)
    lat, errs, answers = [], [], [None] * n
    wall = run_threads([threading.Thread(target=agent_turns, args=(port, i, turns, answer, wait, lat, errs, answers, True))
                        for i in range(n)])
    m1 = metrics(port)
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
    rep = {"agents": n, "turns": turns, "answer_tokens": answer, "wait_s": wait, "wall_s": wall,
           "turns_ok": len(lat), "errors": errs[:5], "latency_p50_s": pct(lat, 50), "latency_p99_s": pct(lat, 99),
           "parks": d.get("parks_total", 0), "restores": d.get("restores_total", 0),
           "cache_drops": d.get("cache_drops_total", 0),
           "park_bytes": d.get("gpu_park_bytes_total", 0), "restore_bytes": d.get("gpu_restore_bytes_total", 0),
           "park_device_s": d.get("gpu_park_seconds_total", 0), "restore_device_s": d.get("gpu_restore_seconds_total", 0),
           "generated_tokens": d.get("generated_tokens_total", 0), "prompt_tokens_cached": d.get("prompt_tokens_cached_total", 0),
           "prefill_tokens": d.get("prefill_tokens_total", 0), "metrics_delta": d}
    for kind in ("park", "restore"):
        s, b = rep[f"{kind}_device_s"], rep[f"{kind}_bytes"]
        rep[f"{kind}_gb_per_s"] = b / 1e9 / s if s > 0 else 0
    json.dump(rep, open(out, "w"), indent=1)
    print(f"  {n} agents x {turns} turns: {len(lat)} turns ok, {len(errs)} errors, {rep['cache_drops']:.0f} caches "
          f"dropped; turn latency p50 {rep['latency_p50_s']:.2f} s p99 "
          f"{rep['latency_p99_s']:.2f} s; {rep['parks']:.0f} parks {rep['park_bytes'] / 1e9:.2f} GB at "
          f"{rep['park_gb_per_s']:.1f} GB/s, {rep['restores']:.0f} restores {rep['restore_bytes'] / 1e9:.2f} GB at "
          f"{rep['restore_gb_per_s']:.1f} GB/s; wall {wall:.1f} s")


if __name__ == "__main__":
    a = sys.argv
    if len(a) == 6 and a[1] == "load":
        load(int(a[2]), int(a[3]), int(a[4]), a[5])
    elif len(a) == 8 and a[1] == "agents":
        agents(int(a[2]), int(a[3]), int(a[4]), int(a[5]), float(a[6]), a[7])
    else:
        sys.exit(__doc__)
