#!/usr/bin/env python3
"""cli_fuzz.py DJINN CONVERT DATA [RUNS] [SEED]: random command lines for djinn on the CPU engine (black-box).

Converts stories260K from DATA to f16 and q4 in a scratch folder, then runs RUNS random command lines (default 300):
options with edge values (negative, NaN, infinite, huge, empty, not a number), prompts from nothing to past the
context, and files that are garbage, empty, text, wrong-sized or NaN steering vectors, folders, /dev/null, the
model itself, as inputs and outputs of --perplexity, --logits, --dump-act, --steer, --save-session,
--load-session, -f and --check, and in about a third of the runs one file as both an input and an output. A run
fails the fuzzer when djinn dies of a signal, exits other than 0-3, hangs
(60 s), reports a sanitizer error, or fails without a 'djinn' line on stderr; or when a file it was only given to
read changed. With a sanitizer build (build-san/bin/djinn) memory errors count too.
"""
import hashlib
import os
import shutil
import subprocess
import sys

import blackbox


def digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def main():
    dj, conv, data, runs, rng, w = blackbox.setup(__doc__, 300, "cli_fuzz")
    models = [blackbox.stories(conv, data, w, dt) for dt in ("f16", "q4")]
    def put(name, data):
        with open(os.path.join(w, name), "wb") as f:
            f.write(data)
        return os.path.join(w, name)
    inputs = {"garbage": put("garbage", bytes(rng.randrange(256) for _ in range(3000))), "empty": put("empty", b""),
              "text": put("text", b"Once upon a time there was a cat. " * 50),
              "vec": put("vec", b"\x00\x00\x80\x3f" * 64), "vec_short": put("vec_short", b"\x00\x00\x80\x3f" * 63),
              "vec_nan": put("vec_nan", b"\x00\x00\xc0\x7f" * 64)}
    files = list(inputs.values()) + [os.path.join(w, "absent"), "", "/dev/null", w, models[0]]
    outs = [os.path.join(w, n) for n in ("out_a", "out_b", "sess")] + [inputs["text"], models[0], w, "/nonexistent/x"]
    vals = ["0", "1", "-1", "2", "0.5", "1e309", "-0", "nan", "inf", "-inf", "4096", "99999999999999999999", "", "abc",
            "0x10", "1e-9", "513", "16", "3.", ".5", "1,2", " 1", "auto", "0.95", "0.96"]
    flags = ["-n", "-t", "--top-p", "--top-k", "--min-p", "--repeat-penalty", "--repeat-last-n", "--presence-penalty",
             "--frequency-penalty", "-s", "-c", "--threads", "--stop", "--draft-max", "--draft-p-min", "--tol",
             "--trace-steps", "--cpu-share", "--ring-gb"]
    before = {p: digest(p) for p in list(inputs.values()) + models}
    bad = 0
    for it in range(runs):
        m = rng.choice(models)
        args = [dj, m, "--cpu", "-n", rng.choice(["0", "1", "3", "8"])]
        for _ in range(rng.randint(0, 4)):
            f = rng.choice(flags)
            args += [f, rng.choice(vals)] if rng.random() < 0.95 else [f]
        for op in rng.sample(range(9), rng.randint(0, 3)):
            args += [
                ["--perplexity", rng.choice(files), "-c", rng.choice(["16", "64", "2", "1", "0"])],
                ["--logits", rng.choice(outs)],
                ["--dump-act", rng.choice(["0", "all", "0,1", "5", "-1", "0,,1", "a", "4"]), rng.choice(outs)],
                ["--steer", rng.choice(["0:", "1:" + inputs["vec"], "0:" + inputs["vec_short"], "0:" + inputs["vec_nan"]
                                        + ":2", "9:" + inputs["vec"], "0:" + inputs["vec"] + ":nan", "x",
                                        "0:" + inputs["vec"] + ":1:2", ":" + inputs["vec"]])],
                ["--save-session", rng.choice(outs)],
                ["--load-session", rng.choice(files + [os.path.join(w, "sess")])],
                ["-p", rng.choice(["Once", "", "\u00e9\u4e2d", "<s></s>", "a" * 2000])],
                ["-f", rng.choice(files + ["-"])],
                ["--check", rng.choice(files)],
            ][op]
        if rng.random() < 0.3:  # one file as an input and an output of an otherwise valid run
            args = [dj, m, "--cpu", "-n", "2"]
            args += rng.choice([["-f", inputs["text"]], ["--perplexity", inputs["text"], "-c", "16"],
                                ["--steer", "0:" + inputs["vec"]], ["--load-session", os.path.join(w, "sess")]])
            x = args[-1].split(":")[-1] if args[-2] == "--steer" else args[-3] if args[-2] == "-c" else args[-1]
            args += rng.choice([["--logits", x], ["--stats-json", x], ["--dump-act", "0", x], ["--save-session", x]])
        try:
            r = subprocess.run(args, capture_output=True, timeout=60, input=b"Once upon")
        except subprocess.TimeoutExpired:
            print("cli_fuzz: HANG", args)
            bad += 1
            continue
        err = r.stderr.decode(errors="replace")
        if r.returncode not in (0, 1, 2, 3) or "Sanitizer" in err or "runtime error" in err:
            print("cli_fuzz: exit", r.returncode, args, err[-1500:])
            bad += 1
        elif r.returncode and not any(l.startswith("djinn") for l in err.splitlines()):
            print("cli_fuzz: no error line, exit", r.returncode, args, err[-300:])
            bad += 1
        # a file this run was given to read never changes; one it was given only to write may
        named_out = {a for i, a in enumerate(args) if i and (args[i - 1] in ("--logits", "--save-session",
                                                                                "--stats-json") or
                                                             (i >= 2 and args[i - 2] == "--dump-act"))}
        named_in = {m} | {a for i, a in enumerate(args) if i and args[i - 1] in ("-f", "--perplexity", "--check",
                                                                                "--load-session")}
        named_in |= {a.split(":")[1] for i, a in enumerate(args) if i and args[i - 1] == "--steer" and ":" in a}
        for p, h in before.items():
            now = digest(p)
            if now != h and (p in named_in or p not in named_out):
                print("cli_fuzz: an input changed:", p, args)
                bad += 1
            before[p] = now
    shutil.rmtree(w, ignore_errors=True)
    print(f"cli_fuzz: {runs} runs, {bad} failures")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
