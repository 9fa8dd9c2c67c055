#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub over HTTPS, for lmhost's download tests.

Serves each folder ROOT/ORG/NAME/ as a model repository with one commit (a hash of its
files), answering the two requests huggingface_hub makes:
  GET /api/models/ORG/NAME/revision/REV?blobs=true   commit, files, sizes, hashes (JSON)
  GET /ORG/NAME/resolve/REV/PATH                      a file; *.safetensors (LFS) redirect
                                                      to /cdn/SHA256 on the other host name
                                                      (localhost <-> 127.0.0.1), as the hub
                                                      redirects to its CDN
with Range requests (206). Faults for the tests: --token (every /api and /resolve request
needs "Authorization: Bearer TOKEN"; a token sent on to /cdn is logged as a leak),
--cut-after N (the first /cdn answer stops after N bytes and closes), --stall-after N (every
/cdn answer stops after N bytes and waits), --corrupt (/cdn answers have a byte flipped).
Logs one line a request to --log: "METHOD PATH range=VALUE auth=yes|no".
"""

import argparse
import hashlib
import http.server
import json
import os
import ssl
import sys
import threading
import time

args = None
repos = {}  # "ORG/NAME" -> (commit, {path: (data, sha256 or None, git sha1)})
lock = threading.Lock()
cdn_answers = 0


def load(root):
    for org in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, org))):
            top = os.path.join(root, org, name)
            files = {}
            for dp, _, fns in os.walk(top):
                for fn in fns:
                    full = os.path.join(dp, fn)
                    rel = os.path.relpath(full, top)
                    with open(full, "rb") as f:
                        data = f.read()
                    git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                    lfs = hashlib.sha256(data).hexdigest() \
                        if rel.endswith(".safetensors") else None
                    files[rel] = (data, lfs, git)
            commit = hashlib.sha1("".join(
                p + files[p][2] for p in sorted(files)).encode()).hexdigest()
            repos[org + "/" + name] = (commit, files)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def record(self):
        with open(args.log, "a") as f:
            f.write("%s %s range=%s auth=%s\n" % (
                self.command, self.path, self.headers.get("Range", "-"),
                "yes" if self.headers.get("Authorization") else "no"))

    def send(self, code, body=b"", ctype="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def authorized(self):
        if not args.token:
            return True
        if self.headers.get("Authorization") == "Bearer " + args.token:
            return True
        self.send(401, b'{"error": "Invalid credentials in Authorization header"}')
        return False

    def send_data(self, data, etag, extra=(), faults=False):
        global cdn_answers
        start = 0
        rng = self.headers.get("Range")
        code = 200
        if rng:
            if not rng.startswith("bytes=") or not rng.endswith("-"):
                return self.send(400, b'{"error": "only bytes=N- ranges"}')
            start = int(rng[6:-1])
            if start >= len(data):
                return self.send(416, b"", extra=[
                    ("Content-Range", "bytes */%d" % len(data))])
            code = 206
        body = data[start:]
        if faults and args.corrupt and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"%s"' % etag)
        self.send_header("Accept-Ranges", "bytes")
        if code == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (
                start, len(data) - 1, len(data)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        limit = None
        if faults:
            with lock:
                cdn_answers += 1
                first = cdn_answers == 1
            if args.cut_after is not None and first:
                limit = args.cut_after
            if args.stall_after is not None:
                limit = args.stall_after
        if limit is None:
            self.wfile.write(body)
            return
        self.wfile.write(body[:limit])
        self.wfile.flush()
        if args.stall_after is not None:
            time.sleep(120)
        self.close_connection = True
        self.connection.shutdown(2)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self.record()
        path, _, query = self.path.partition("?")
        parts = path.split("/")
        if path.startswith("/cdn/"):
            if args.token and self.headers.get("Authorization"):
                with open(args.log, "a") as f:
                    f.write("LEAK token sent to the CDN\n")
            sha = parts[2]
            for commit, files in repos.values():
                for data, lfs, git in files.values():
                    if lfs == sha:
                        return self.send_data(data, sha, faults=True)
            return self.send(404, b'{"error": "no such object"}')
        if path.startswith("/api/models/") and len(parts) >= 7 and \
                parts[5] == "revision":
            if not self.authorized():
                return
            repo = parts[3] + "/" + parts[4]
            rev = "/".join(parts[6:])
            if repo not in repos:
                return self.send(404, b'{"error": "Repository not found"}')
            commit, files = repos[repo]
            if rev not in ("main", commit):
                return self.send(404, b'{"error": "Invalid rev id: %s"}' % rev.encode())
            sib = []
            for p in sorted(files):
                data, lfs, git = files[p]
                e = {"rfilename": p}
                if "blobs=true" in query:
                    e["blobId"] = git
                    e["size"] = len(data)
                    if lfs:
                        e["lfs"] = {"sha256": lfs, "size": len(data),
                                    "pointerSize": 134}
                sib.append(e)
            body = json.dumps({"_id": "x", "id": repo, "sha": commit,
                               "siblings": sib}).encode()
            return self.send(200, body)
        if len(parts) >= 6 and parts[3] == "resolve":
            if not self.authorized():
                return
            repo = parts[1] + "/" + parts[2]
            rev, fp = parts[4], "/".join(parts[5:])
            if repo not in repos or rev not in ("main", repos[repo][0]):
                return self.send(404, b'{"error": "Entry not found"}')
            commit, files = repos[repo]
            if fp not in files:
                return self.send(404, b'{"error": "Entry not found"}')
            data, lfs, git = files[fp]
            hdrs = [("X-Repo-Commit", commit)]
            if lfs:
                host = self.headers.get("Host", "")
                other = host.replace("127.0.0.1", "localhost") \
                    if "127.0.0.1" in host else host.replace("localhost", "127.0.0.1")
                return self.send(302, b"", extra=hdrs + [
                    ("Location", "https://%s/cdn/%s" % (other, lfs)),
                    ("X-Linked-Etag", '"%s"' % lfs),
                    ("X-Linked-Size", str(len(data)))])
            return self.send_data(data, git, extra=hdrs)
        return self.send(404, b'{"error": "not a hub route"}')


def main():
    global args
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--token")
    ap.add_argument("--cut-after", type=int)
    ap.add_argument("--stall-after", type=int)
    ap.add_argument("--corrupt", action="store_true")
    args = ap.parse_args()
    load(args.root)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(args.port_file + ".tmp", args.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
