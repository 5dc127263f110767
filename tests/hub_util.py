"""A loopback stand-in for the Hugging Face Hub, enough for ``huggingface_hub``'s downloads.

It answers the Hub's own routes with the Hub's own headers, so the real client runs unchanged against
``HF_ENDPOINT=http://127.0.0.1:PORT``:

- ``GET /api/models/ORG/NAME[/revision/REV]``: the repo's id, commit and file list.
- ``GET /api/models/ORG/NAME/tree/REV``: the files with sizes and LFS sha256s.
- ``HEAD``/``GET /ORG/NAME/resolve/REV/PATH``: a file, with ``X-Repo-Commit``, ``ETag`` and
  ``X-Linked-Etag``/``X-Linked-Size`` for LFS files.

Errors carry ``X-Error-Code`` as the Hub sends it: ``RepoNotFound`` (401 to an anonymous caller,
404 to one with a token), ``RevisionNotFound`` and ``EntryNotFound`` (404), ``GatedRepo`` (401
without the repo's token). Every request is recorded in ``requests`` as ``(method, path)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_LFS_MIN = 10_000  # files at least this big are LFS files, as on the Hub


@dataclass
class Revision:
    """One commit of a repo: file path in the repo -> its content (bytes or a local file)."""

    files: dict[str, bytes | Path]
    sha: str = ""

    def __post_init__(self) -> None:
        if not self.sha:
            names = json.dumps(sorted(self.files)).encode()
            self.sha = hashlib.sha1(names).hexdigest()


@dataclass
class Repo:
    """A repo: revisions by ref name (``main`` first), and the token a gated repo asks for."""

    revisions: dict[str, Revision]
    token: str | None = None
    _digests: dict[tuple[str, str], str] = field(default_factory=dict)

    def find(self, ref: str) -> Revision | None:
        for name, rev in self.revisions.items():
            if ref in (name, rev.sha):
                return rev
        return None


class FakeHub:
    """Serves ``repos`` (id -> :class:`Repo`) on 127.0.0.1 until :meth:`close`."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self.auth_headers: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloads(self) -> list[str]:
        """The paths of files fetched with GET, in order."""
        return [p for m, p in self.requests if m == "GET" and "/resolve/" in p]

    # --- routes --------------------------------------------------------------------------------------

    def _answer(self, req: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        self.requests.append((req.command, path))
        self.auth_headers.append(req.headers.get("Authorization", ""))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            rest = parts[4:]
            if rest[:1] == ["tree"] and len(rest) >= 2:
                return self._tree(req, repo_id, rest[1], body)
            ref = rest[1] if rest[:1] == ["revision"] and len(rest) >= 2 else "main"
            return self._info(req, repo_id, ref, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(req, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        self._error(req, 404, "", "not a Hub route", body)

    def _lookup(self, req: BaseHTTPRequestHandler, repo_id: str, ref: str, body: bool) -> Revision | None:
        repo = self.repos.get(repo_id)
        if repo is None:  # the Hub answers 401 to an anonymous caller, 404 to one with a token
            status = 404 if req.headers.get("Authorization") else 401
            self._error(req, status, "RepoNotFound", "Repository not found", body)
            return None
        rev = repo.find(ref)
        if rev is None:
            self._error(req, 404, "RevisionNotFound", "Invalid rev id: " + ref, body)
        return rev

    def _info(self, req: BaseHTTPRequestHandler, repo_id: str, ref: str, body: bool) -> None:
        rev = self._lookup(req, repo_id, ref, body)
        if rev is None:
            return
        repo = self.repos[repo_id]
        info = {
            "id": repo_id,
            "sha": rev.sha,
            "private": False,
            "gated": "manual" if repo.token else False,
            "siblings": [{"rfilename": name} for name in sorted(rev.files)],
        }
        self._send(req, 200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)

    def _tree(self, req: BaseHTTPRequestHandler, repo_id: str, ref: str, body: bool) -> None:
        rev = self._lookup(req, repo_id, ref, body)
        if rev is None:
            return
        entries = []
        for name in sorted(rev.files):
            size, digest = self._meta(repo_id, rev, name)
            entry: dict[str, object] = {"type": "file", "path": name, "size": size, "oid": digest[:40]}
            if size >= _LFS_MIN:
                entry["lfs"] = {"oid": digest, "size": size, "pointerSize": 134}
            entries.append(entry)
        self._send(req, 200, {"Content-Type": "application/json"}, json.dumps(entries).encode(), body)

    def _file(self, req: BaseHTTPRequestHandler, repo_id: str, ref: str, name: str, body: bool) -> None:
        rev = self._lookup(req, repo_id, ref, body)
        if rev is None:
            return
        repo = self.repos[repo_id]
        if repo.token is not None and req.headers.get("Authorization") != f"Bearer {repo.token}":
            msg = "Access to model is restricted. You must have access to it and be authenticated."
            return self._error(req, 401, "GatedRepo", msg, body)
        if name not in rev.files:
            return self._error(req, 404, "EntryNotFound", f"{name} does not exist", body)
        size, digest = self._meta(repo_id, rev, name)
        headers = {"X-Repo-Commit": rev.sha, "ETag": f'"{digest}"', "Content-Length": str(size)}
        if size >= _LFS_MIN:
            headers |= {"X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(size)}
        content = rev.files[name]
        req.send_response(200)
        for k, v in headers.items():
            req.send_header(k, v)
        req.end_headers()
        if not body:
            return
        if isinstance(content, bytes):
            req.wfile.write(content)
            return
        with open(content, "rb") as f:
            while chunk := f.read(1 << 20):
                req.wfile.write(chunk)

    def _meta(self, repo_id: str, rev: Revision, name: str) -> tuple[int, str]:
        repo = self.repos[repo_id]
        key = (rev.sha, name)
        content = rev.files[name]
        if key not in repo._digests:
            digest = hashlib.sha256()
            if isinstance(content, bytes):
                digest.update(content)
            else:
                with open(content, "rb") as f:
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
            repo._digests[key] = digest.hexdigest()
        size = len(content) if isinstance(content, bytes) else content.stat().st_size
        return size, repo._digests[key]

    def _error(self, req: BaseHTTPRequestHandler, status: int, code: str, message: str, body: bool) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(req, status, headers, json.dumps({"error": message}).encode(), body)

    def _send(
        self, req: BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes, body: bool
    ) -> None:
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if body:
            req.wfile.write(data)
