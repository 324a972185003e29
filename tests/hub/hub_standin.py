"""A small stand-in for the Hugging Face Hub on loopback, serving what `dory pull` uses:

  GET /api/models/ORG/NAME/revision/main[?blobs=true]   commit sha and siblings (rfilename,
                                                        blobId, size, lfs {sha256, size})
  GET /ORG/NAME/resolve/REV/FILE                        302 to /blobs/HASH (as the Hub sends
                                                        LFS files to its CDN), X-Repo-Commit
  GET /blobs/HASH                                       the bytes, with Range (206)

Repositories are dicts {"files": {name: bytes}, "gated": token or None, "lie": {name: bytes}}:
`lie` serves other bytes than the ones whose hash the API reports (a corrupted download).
`drop_once` names files whose first blob request is cut off halfway (connection closed).
A repository with "cdn": True redirects to its blobs by an absolute URL on another host name
(localhost for 127.0.0.1), as the Hub sends LFS files to its CDN. Every request is logged in
`log` as (method, path, Range header or None, Authorization header or None).
"""
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_FROM = 1024  # files this large or larger are "LFS" files (sha256 named), as on the Hub


def git_blob_sha1(b):
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


class Hub:
    def __init__(self, repos):
        self.repos = repos
        self.log = []
        self.drop_once = set()
        self.blobs = {}  # hash -> bytes to serve
        for repo in repos.values():
            for name, data in repo["files"].items():
                served = repo.get("lie", {}).get(name, data)
                self.blobs[self.blob_name(data)] = served
        hub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, code, body=b"", headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                hub.log.append(("GET", self.path, self.headers.get("Range"), self.headers.get("Authorization")))
                path = self.path.split("?")[0]
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
                    return self.api("/".join(parts[2:4]))
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self.resolve("/".join(parts[:2]), "/".join(parts[4:]))
                if len(parts) == 2 and parts[0] == "blobs":
                    return self.blob(parts[1])
                self.send(404, b"not found")

            def authorized(self, repo):
                tok = hub.repos[repo].get("gated")
                return tok is None or self.headers.get("Authorization") == "Bearer " + tok

            def api(self, repo):
                if repo not in hub.repos:
                    return self.send(404, b'{"error": "Repository not found"}')
                if not self.authorized(repo):
                    return self.send(401, b'{"error": "Access to this model is restricted"}')
                sib = []
                for name, data in hub.repos[repo]["files"].items():
                    s = {"rfilename": name, "blobId": git_blob_sha1(data), "size": len(data)}
                    if len(data) >= LFS_FROM:
                        s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "pointerSize": 134}
                    sib.append(s)
                self.send(200, json.dumps({"id": repo, "sha": COMMIT, "siblings": sib}).encode(),
                          [("Content-Type", "application/json")])

            def resolve(self, repo, name):
                if repo not in hub.repos or name not in hub.repos[repo]["files"]:
                    return self.send(404, b"Entry not found")
                if not self.authorized(repo):
                    return self.send(401, b"restricted")
                data = hub.repos[repo]["files"][name]
                where = "/blobs/" + hub.blob_name(data)
                if hub.repos[repo].get("cdn"):
                    where = "http://localhost:%d%s" % (hub.server.server_address[1], where)
                self.send(302, b"", [("Location", where), ("X-Repo-Commit", COMMIT)])

            def blob(self, h):
                if h not in hub.blobs:
                    return self.send(404, b"no blob")
                data = hub.blobs[h]
                start, code = 0, 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start, code = int(rng[6:-1]), 206
                body = data[start:]
                if h in hub.drop_once:
                    hub.drop_once.discard(h)
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(body)))
                    if code == 206:
                        self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                hdrs = [("Content-Type", "application/octet-stream")]
                if code == 206:
                    hdrs.append(("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data))))
                self.send(code, body, hdrs)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def blob_name(data):
        return hashlib.sha256(data).hexdigest() if len(data) >= LFS_FROM else git_blob_sha1(data)

    def drop_file_once(self, data):
        self.drop_once.add(self.blob_name(data))

    def requests(self, prefix):
        return [r for r in self.log if r[1].startswith(prefix)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
