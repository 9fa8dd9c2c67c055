#!/usr/bin/env python3
"""Runs every ```sh block of README.md and docs/*.md, so that what the docs tell a reader
to type works as written.

usage: run_doc_commands.py REPO BUILD [FILE...]

Each block runs with bash in a scratch directory that holds links to the repository's
top-level entries and `build` -> BUILD, so relative paths work and anything a command
writes stays out of the tree. Blocks of one file share that directory, in order, so a
later block may use what an earlier one made. An HTML comment on the line before a fence
changes how it runs:

  <!-- doc-test: skip REASON -->   not run (a GPU, the internet, or the test run itself)
  <!-- doc-test: last-command -->  only the part after the last `&&` runs (set-up steps
                                   that the test build has already done come before it)

A block whose command starts `lmhost serve` runs in the background until the end of its
file; the next block waits for its /health on the port the block gives with --port, else
on lmhost's default, 5413, which must be free (the test does not run beside others). Output: one line per block, then `N run, N skipped,
N failed`; the exit status is 1 if any block failed.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

BLOCK_TIMEOUT = 300  # seconds: quantizing or benchmarking a test model takes a few
MARK = re.compile(r"<!--\s*doc-test:\s*([a-z-]+)\s*(.*?)\s*-->")


def blocks(path):
    """(line, marker, argument, text) of each ```sh block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() in ("```sh", "```bash"):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            prev = next((lines[j] for j in range(start - 2, -1, -1) if lines[j].strip()), "")
            m = MARK.search(prev)
            out.append((start, m.group(1) if m else None, m.group(2) if m else "",
                        "\n".join(body)))
        i += 1
    return out


def wait_health(port, proc, seconds=120):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def scratch(repo, build):
    d = tempfile.mkdtemp(prefix="doc-test-")
    for name in os.listdir(repo):
        if name in (".git", "build") or name.startswith("build-"):
            continue
        os.symlink(os.path.join(repo, name), os.path.join(d, name))
    os.symlink(os.path.abspath(build), os.path.join(d, "build"))
    return d


def run_file(repo, build, path, counts):
    rel = os.path.relpath(path, repo)
    work = scratch(repo, build)
    servers = []
    env = dict(os.environ, PATH=os.path.join(work, "build") + os.pathsep + os.environ["PATH"])
    try:
        for line, mark, arg, text in blocks(path):
            where = f"{rel}:{line}"
            if mark == "skip":
                counts["skipped"] += 1
                print(f"skip {where}: {arg}")
                continue
            if mark not in (None, "last-command"):
                counts["failed"] += 1
                print(f"FAIL {where}: unknown doc-test marker '{mark}'")
                continue
            if mark == "last-command":
                text = text.split("&&")[-1].strip()
            if re.match(r"\s*(build/)?lmhost serve\b", text):
                m = re.search(r"--port[= ](\d+)", text)
                port = int(m.group(1)) if m else 5413
                log = open(os.path.join(work, f"serve-{line}.log"), "w")
                proc = subprocess.Popen(["bash", "-c", "exec " + text.strip()], cwd=work,
                                        env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                servers.append(proc)
                if wait_health(port, proc):
                    counts["run"] += 1
                    print(f"ok   {where} (serving on {port})")
                else:
                    counts["failed"] += 1
                    print(f"FAIL {where}: the server did not come up")
                    print(open(log.name).read()[-3000:])
                continue
            try:
                r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=work,
                                   env=env, capture_output=True, text=True,
                                   timeout=BLOCK_TIMEOUT)
                ok, out = r.returncode == 0, r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:
                ok, out = False, f"timed out after {BLOCK_TIMEOUT} s\n{e.stdout or ''}"
            if ok:
                counts["run"] += 1
                print(f"ok   {where}")
            else:
                counts["failed"] += 1
                print(f"FAIL {where}:\n{text}\n--- output ---\n{out[-3000:]}")
    finally:
        for p in servers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


def main():
    repo, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    files = sys.argv[3:] or [os.path.join(repo, "README.md")] + sorted(
        os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs"))
        if f.endswith(".md"))
    counts = {"run": 0, "skipped": 0, "failed": 0}
    for f in files:
        run_file(repo, build, os.path.abspath(f), counts)
    print(f"{counts['run']} run, {counts['skipped']} skipped, {counts['failed']} failed")
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
