"""``vlp serve``'s HTTP side: a :class:`SearchServer` (the standard library's threading HTTP server)
answering the page (``vlp/serve/static/``, package data) and its JSON API from one
:class:`~vlp.serve.app.SearchApp`.

    GET /                      the page (static/index.html); /static/NAME its script and style
    GET /api/info              the index and the model: {index, count, checkpoint, heatmap, ...}
    GET /api/search?q=&top=&rerank=   the hits of ``vlp search INDEX Q --top T --rerank-itm K --json``
    GET /api/similar?row=&top=        the hits of ``vlp search INDEX --image FILE_OF_ROW --top T --json``
    GET /api/heatmap?row=&q=          PNG: ``vlp explain``'s per-word Grad-CAM grid of Q over that image
    GET /image?row=                   the file of an index row: no other file of the disk is served

An error is JSON ``{"error": "one line"}`` with a 4xx status (5xx: a fault of vlp, logged with its
traceback, never sent). Bound to 127.0.0.1 by default, the server also refuses a request whose
``Host`` is not a loopback name (a web page elsewhere reaching it through DNS rebinding).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import os
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

from vlp.errors import ConfigError
from vlp.serve.app import ApiError, SearchApp

logger = logging.getLogger(__name__)

#: the page's own files (package data of vlp.serve) and their content types
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}
#: what the page may load: its own server only (nothing from the internet), blob: heat maps, data: (its icon)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files, ``vlp/serve/static/*`` read through :mod:`importlib.resources` (so from an
    installed wheel too): name -> (bytes, content type)."""
    folder = resources.files("vlp.serve").joinpath("static")
    out = {}
    for f in folder.iterdir():
        suffix = os.path.splitext(f.name)[1]
        if f.is_file() and suffix in STATIC_TYPES:
            out[f.name] = (f.read_bytes(), STATIC_TYPES[suffix])
    return out


class SearchServer(ThreadingHTTPServer):
    """The HTTP server of one :class:`SearchApp` (``app``, set once loaded) and the page's files."""

    daemon_threads = True

    def __init__(self, host: str, port: int, load: Callable[[], SearchApp]) -> None:
        """Listen on ``host``:``port`` (a port that cannot be had: :class:`~vlp.errors.ConfigError`),
        then ``app = load()`` (the socket closed again when that raises)."""
        if ":" in host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((host, port), SearchHandler)
        except OSError as e:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
        try:
            self.static = static_files()
            self.loopback = host in LOOPBACK_NAMES
            self.app = load()
        except BaseException:
            self.server_close()
            raise

    @property
    def url(self) -> str:
        """The page's address (the port the system chose for port 0)."""
        host, port = self.socket.getsockname()[:2]
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def serve_until_interrupted(self) -> None:
        """Answer requests until Ctrl-C or SIGTERM (a ``kill``, a service manager; from the main
        thread both become ``KeyboardInterrupt``); then close the socket and return."""
        on_main = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
        try:
            self.serve_forever()
        except KeyboardInterrupt:
            logger.info("vlp serve: stopped")
        finally:
            self.server_close()
            if before is not None:
                signal.signal(signal.SIGTERM, before)


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl-C: the server's clean stop."""
    raise KeyboardInterrupt


class SearchHandler(BaseHTTPRequestHandler):
    """One request of the page (the module doc's routes)."""

    server: SearchServer
    server_version = "vlp-serve"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        """Route the request; an :class:`ApiError` or a fault becomes a JSON error."""
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if self.server.loopback and not self._loopback_host():
                raise ApiError(
                    403, f"Host {self.headers.get('Host')!r}: vlp serve on 127.0.0.1 answers loopback names only"
                )
            self._route(url.path, params)
        except ApiError as e:
            self._json(e.status, {"error": e.message})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away
        except Exception as e:  # a fault of vlp: the traceback in the log, one line on the page
            logger.exception(f"vlp serve: {self.path}")
            self._json(500, {"error": f"internal error ({type(e).__name__}: {e}); the server's log has the details"})

    def _route(self, path: str, params: dict[str, str]) -> None:
        app = self.server.app
        api: dict[str, Callable[[dict[str, str]], Any]] = {
            "/api/info": lambda p: app.info(),
            "/api/search": app.search,
            "/api/similar": app.similar,
        }
        if path in ("/", "/index.html"):
            self._static("index.html")
        elif path.startswith("/static/"):
            self._static(path[len("/static/") :])
        elif path in api:
            self._json(200, api[path](params))
        elif path == "/api/heatmap":
            self._send(200, app.heatmap(params), "image/png")
        elif path == "/image":
            file = app.image(params)
            kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            self._send(200, file.read_bytes(), kind)
        else:
            raise ApiError(404, f"{path}: no such page")

    def _loopback_host(self) -> bool:
        host = (self.headers.get("Host") or "").strip()
        name = host[1:].split("]")[0] if host.startswith("[") else host.rsplit(":", 1)[0]
        return name in LOOPBACK_NAMES

    def _static(self, name: str) -> None:
        if name not in self.server.static:  # a fixed set of names: no path reaches another file
            raise ApiError(404, f"/static/{name}: no such file")
        body, kind = self.server.static[name]
        self._send(200, body, kind)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        """Requests go to the debug log, not stderr (``VLP_LOG_LEVEL=DEBUG`` shows them)."""
        logger.debug(f"{self.address_string()} {format % args}")


def open_server(
    index: str | os.PathLike,
    checkpoint: Optional[str] = None,
    device: Optional[str] = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    layer: Optional[int] = None,
) -> SearchServer:
    """``vlp serve``: the server of ``index`` (searched with ``checkpoint``, default the index's own,
    on ``device``; Grad-CAM at fusion layer ``layer``) listening on ``host``:``port`` (0: a free
    port; ``.url`` says which). The port is taken first, then the index and the model are loaded;
    a bad index, checkpoint, layer or port raises the user error. Serve with
    :meth:`SearchServer.serve_until_interrupted`."""
    return SearchServer(host, port, lambda: SearchApp.open(index, checkpoint, device, layer=layer))
