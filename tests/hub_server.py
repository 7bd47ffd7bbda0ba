"""A Hugging Face Hub stand-in on 127.0.0.1 for the real huggingface_hub client (HF_ENDPOINT points at it):
the routes ``snapshot_download`` uses (repo info, the file tree, each file's HEAD and GET under
``/<repo>/resolve/<revision>/<file>``), a gated repo answered as the Hub answers one without access (401 with
``X-Error-Code: GatedRepo``), and a log of every file served, so a test can see that no weight was fetched.
It serves only what the test hands it, and only on the loopback address."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "1" * 40


@dataclass
class Hub:
    repos: Mapping[str, Path]  # repo id -> a folder whose files the repo holds
    gated: frozenset[str] = frozenset()
    served: list[str] = field(default_factory=list)  # "<repo>/<file>" of every GET of a file
    url: str = ""


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes = b"", headers: Mapping[str, str] | None = None) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _repo(self, path: str) -> tuple[str, str] | None:
            for repo in hub.repos:
                if path.startswith(repo + "/"):
                    return repo, path[len(repo) + 1 :]
            return None

        def _refuse(self, repo: str) -> bool:
            if repo in hub.gated:
                self._send(401, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"})
                return True
            return False

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path).lstrip("/")
            if path.startswith("api/models/"):
                found = self._repo(path.removeprefix("api/models/"))
                if found is None:
                    self._send(404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"})
                    return
                repo, rest = found
                if self._refuse(repo):
                    return
                files = sorted(p for p in hub.repos[repo].iterdir() if p.is_file())
                if rest.startswith("revision/"):
                    body = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": p.name} for p in files]}
                else:  # tree/<revision>[/<path>]
                    body = [{"type": "file", "oid": _oid(p), "size": p.stat().st_size, "path": p.name} for p in files]
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                return
            found = self._repo(path)
            if found is None or not found[1].startswith("resolve/"):
                self._send(404, b"", {"X-Error-Code": "RepoNotFound"})
                return
            repo, rest = found
            if self._refuse(repo):
                return
            name = rest.split("/", 2)[2]  # resolve/<revision>/<file>
            file = hub.repos[repo] / name
            if not file.is_file():
                self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                return
            body = file.read_bytes()
            if self.command == "GET":
                hub.served.append(f"{repo}/{name}")
            self._send(200, body, {"X-Repo-Commit": COMMIT, "ETag": f'"{_oid(file)}"'})

    return Handler


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@contextmanager
def serving(repos: Mapping[str, Path], gated: frozenset[str] = frozenset()) -> Iterator[Hub]:
    hub = Hub(repos=dict(repos), gated=gated)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
