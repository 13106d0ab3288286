#!/usr/bin/env python3
"""Mutation testing: does the suite notice when a check in the code is broken?

Reads the list of mutations (tests/mutations.tsv; its header says the format), applies each in turn to a scratch
copy of the tree (never the working tree), rebuilds incrementally there (a copy of the build directory, so only the
mutated object recompiles and the binaries relink), runs the Criterion suites the mutation names under a time
limit, and restores the file. A mutation is killed when a suite fails or runs out of time, survives when they
pass, and is explained when it survives and the list gives the reason it is equivalent. Prints each survivor and
the totals; exits 1 when the unexplained survivors exceed 5% of the mutations run, or when a mutation's text no
longer occurs exactly once in its file (the list must follow the code).

Driven by `make mutate` (which passes the build directory and the test environment); see docs/testing.md.
Environment: MUTATE_LIST, MUTATE_SAMPLE=N (run N of them), MUTATE_SEED (picks which), MUTATE_TIMEOUT (seconds per
mutation's suites), MUTATE_BUILD (the build directory to copy), MUTATE_BASELINE=0 (skip the unmutated run),
MUTATE_KEEP=1 (leave the scratch tree), and the suite's DJINN_DATA.
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))
SURVIVOR_LIMIT = 0.05  # unexplained survivors allowed, as a fraction of the mutations run


class Mutation:
    def __init__(self, lineno, file, find, repl, suites, reason):
        self.lineno, self.file, self.find, self.repl, self.suites, self.reason = lineno, file, find, repl, suites, reason
        self.src_line = 0  # the line of `find` in its file, once located

    def where(self):
        return f'{self.file}:{self.src_line}'

    def change(self):
        return f'`{self.find}` -> `{self.repl}`'


def unescape(s):
    # The list's fields are single lines; \t, \n and \\ spell a tab, a newline and a backslash.
    out, i = [], 0
    while i < len(s):
        if s[i] == '\\' and i + 1 < len(s) and s[i + 1] in 'tn\\':
            out.append({'t': '\t', 'n': '\n', '\\': '\\'}[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return ''.join(out)


def parse(path):
    muts, errors = [], []
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip('\n')
            if not line.strip() or line.startswith('#'):
                continue
            parts = line.split('\t')
            if len(parts) not in (4, 5) or not all(p.strip() for p in parts[:4]):
                errors.append(f'{path}:{n}: expected 4 or 5 tab-separated fields (file, text, replacement, suites'
                              f'[, reason]), found {len(parts)}')
                continue
            file, find, repl, suites = parts[0].strip(), unescape(parts[1]), unescape(parts[2]), parts[3].split()
            reason = parts[4].strip() if len(parts) == 5 else ''
            if find == repl:
                errors.append(f'{path}:{n}: the replacement equals the text')
                continue
            muts.append(Mutation(n, file, find, repl, suites, reason))
    return muts, errors


def locate(muts, root, list_path):
    """Each mutation's text must occur exactly once in its file; returns the complaints."""
    errors, cache = [], {}
    for m in muts:
        p = os.path.join(root, m.file)
        if m.file not in cache:
            try:
                with open(p, encoding='utf-8') as f:
                    cache[m.file] = f.read()
            except OSError as err:
                cache[m.file] = None
                errors.append(f'{list_path}:{m.lineno}: {m.file}: {err.strerror}')
        text = cache[m.file]
        if text is None:
            continue
        count = text.count(m.find)
        if count != 1:
            errors.append(f'{list_path}:{m.lineno}: {m.file}: `{m.find}` occurs {count} times (must be exactly once)')
        else:
            m.src_line = text[:text.index(m.find)].count('\n') + 1
    return errors


def copy_tree(dst, build):
    """The tracked and untracked-but-not-ignored files, then the build directory with its timestamps."""
    files = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split('\0')
    for rel in files:
        src = os.path.join(ROOT, rel)
        if not rel or not os.path.isfile(src):  # a deleted but still tracked file
            continue
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))
    subprocess.run(['cp', '-a', os.path.join(ROOT, build), os.path.join(dst, build)], check=True)


def build_targets(build):
    return [f'{build}/run_tests', f'{build}/bin/djinn', f'{build}/bin/convert', f'{build}/bin/repeat_layers']


def make(tree, build, log):
    r = subprocess.run(['make', '-s', '-j2', f'BUILD={build}'] + build_targets(build), cwd=tree,
                       stdout=log, stderr=subprocess.STDOUT)
    return r.returncode == 0


def run_suites(tree, build, suites, timeout, log):
    """'killed', 'survived' or 'timeout': every suite runs under one shared time limit and stops at its first
    failure."""
    env = dict(os.environ, DJINN_BIN=os.path.join(tree, build, 'bin'), DJINN_TESTS=os.path.join(tree, 'tests'),
               ASAN_OPTIONS='protect_shadow_gap=0:detect_leaks=1', UBSAN_OPTIONS='print_stacktrace=1')
    deadline = time.monotonic() + timeout
    for s in suites:
        left = deadline - time.monotonic()
        if left <= 0:
            return 'timeout'
        # its own process group, so that a timeout ends the tests' children (servers, the CLI) with it
        p = subprocess.Popen([os.path.join(tree, build, 'run_tests'), '--fail-fast', '--filter', s], cwd=tree,
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            return 'timeout'
        if rc != 0:
            return 'killed'
    return 'survived'


def main():
    list_path = os.environ.get('MUTATE_LIST', os.path.join(ROOT, 'tests', 'mutations.tsv'))
    build = os.environ.get('MUTATE_BUILD', 'build')
    timeout = float(os.environ.get('MUTATE_TIMEOUT', '180'))
    sample = int(os.environ.get('MUTATE_SAMPLE', '0') or 0)
    seed = os.environ.get('MUTATE_SEED', '')
    baseline = os.environ.get('MUTATE_BASELINE', '1') != '0'
    if not os.environ.get('DJINN_DATA'):
        sys.exit('mutate: DJINN_DATA is not set: run it through `make mutate` (DATA=/work/shared in a worktree)')
    if not os.path.isfile(os.path.join(ROOT, build, 'run_tests')):
        sys.exit(f'mutate: no {build}/run_tests: run it through `make mutate`, which builds it first')

    muts, errors = parse(list_path)
    errors += locate(muts, ROOT, list_path)
    if errors:
        print('\n'.join(errors), file=sys.stderr)
        sys.exit(f'mutate: {len(errors)} mutation(s) do not apply: update {os.path.relpath(list_path, ROOT)} to '
                 f'the code')
    chosen = muts
    if 0 < sample < len(muts):
        chosen = random.Random(seed).sample(muts, sample)
        print(f'mutate: a sample of {sample} of the {len(muts)} mutations (seed {seed!r})')
    chosen.sort(key=lambda m: (m.file, m.lineno))  # one file's mutations together: fewer recompiles

    tree = tempfile.mkdtemp(prefix='djinn-mutate-')
    log_path = os.path.join(tree, 'mutate.log')
    results = {'killed': [], 'timeout': [], 'survived': [], 'explained': [], 'broken': []}
    t0 = time.monotonic()
    try:
        copy_tree(tree, build)
        with open(log_path, 'w') as log:
            if not make(tree, build, log):
                sys.exit(f'mutate: the unmutated scratch tree does not build (see {log_path}); MUTATE_KEEP=1 keeps it')
            if baseline:
                suites = sorted({s for m in chosen for s in m.suites})
                for s in suites:
                    if run_suites(tree, build, [s], timeout, log) != 'survived':
                        os.environ['MUTATE_KEEP'] = '1'
                        sys.exit(f'mutate: suite {s} fails (or exceeds {timeout:.0f} s) without any mutation: fix '
                                 f'that first (log: {log_path})')
                print(f'mutate: baseline passes ({len(suites)} suite filters, {time.monotonic() - t0:.0f} s)')
            # the pristine object of each mutated file, put back after its mutation so that restoring the source
            # (with its old timestamp) recompiles nothing
            pristine = {}
            for m in chosen:
                obj = os.path.join(tree, build, m.file[:-2] + '.o') if m.file.endswith('.c') else None
                if obj and os.path.isfile(obj) and m.file not in pristine:
                    keep = obj + '.pristine'
                    shutil.copy2(obj, keep)
                    pristine[m.file] = (obj, keep)
            for i, m in enumerate(chosen, 1):
                path = os.path.join(tree, m.file)
                st = os.stat(path)
                with open(path, encoding='utf-8') as f:
                    text = f.read()
                t1 = time.monotonic()
                print(f'==== [{i}/{len(chosen)}] {m.where()}: {m.change()} ({" ".join(m.suites)})', file=log,
                      flush=True)
                try:
                    with open(path, 'w', encoding='utf-8') as f:
                        f.write(text.replace(m.find, m.repl, 1))
                    if not make(tree, build, log):
                        outcome = 'broken'
                    else:
                        outcome = run_suites(tree, build, m.suites, timeout, log)
                        if outcome == 'survived' and m.reason:
                            outcome = 'explained'
                finally:
                    with open(path, 'w', encoding='utf-8') as f:
                        f.write(text)
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
                    if m.file in pristine:  # its object as it was, newer than the binaries linked with the mutant
                        obj, keep = pristine[m.file]
                        shutil.copyfile(keep, obj)
                        os.utime(obj)
                results[outcome].append(m)
                print(f'==== {outcome} ({time.monotonic() - t1:.0f} s)', file=log, flush=True)
                print(f'mutate: [{i}/{len(chosen)}] {outcome:9s} {m.where()}: {m.change()} '
                      f'({time.monotonic() - t1:.0f} s)', flush=True)
    finally:
        if os.environ.get('MUTATE_KEEP') == '1':
            print(f'mutate: scratch tree kept in {tree}', file=sys.stderr)
        else:
            shutil.rmtree(tree, ignore_errors=True)

    for m in results['explained']:
        print(f'explained  {m.where()}: {m.change()}: {m.reason}')
    for m in results['broken']:
        print(f'no build   {m.where()}: {m.change()}')
    for m in results['survived']:
        print(f'SURVIVED   {m.where()}: {m.change()} (suites {" ".join(m.suites)})')
    reasoned_but_killed = [m for m in results['killed'] + results['timeout'] if m.reason]
    for m in reasoned_but_killed:
        print(f'note: {os.path.relpath(list_path, ROOT)}:{m.lineno}: killed, yet the list calls it equivalent: '
              f'drop its reason')
    n, killed = len(chosen), len(results['killed']) + len(results['timeout'])
    print(f'mutate: {n} mutations in {time.monotonic() - t0:.0f} s: killed {killed} (by the time limit '
          f'{len(results["timeout"])}), survived {len(results["survived"])}, explained-equivalent '
          f'{len(results["explained"])}, broken-build {len(results["broken"])}')
    if len(results['survived']) > SURVIVOR_LIMIT * n:
        print(f'mutate: FAILED: {len(results["survived"])} unexplained survivors, over {SURVIVOR_LIMIT:.0%} of {n}: '
              f'write a test that kills each, or give the list its reason', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
