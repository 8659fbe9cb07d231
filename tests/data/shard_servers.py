"""Servers on 127.0.0.1 that tests start themselves: a plain HTTP server over a shard folder (byte
ranges, a log of the paths asked for, injected faults) and moto's S3 server with a bucket of shards.
No test traffic goes to any other address."""

from __future__ import annotations

import http.server
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

# fake credentials of the local S3 server: a run must never write them anywhere
S3_KEY, S3_SECRET = "vlptestkeyAKIA0000", "vlptestsecret0000000000000000000000000000"


@dataclass
class Fault:
    """What the HTTP server does to the GETs of paths ending with ``suffix``: ``kind`` is ``reset``
    (the body is cut after ``after`` bytes and the connection closed), ``500``/``503`` (an error
    status), ``delay`` (the whole response, after ``seconds``), ``stall`` (``after`` bytes, then
    ``seconds`` of silence, then the connection closed), ``trickle`` (the body in
    pieces of ``step`` bytes, one every ``seconds``), ``wrong_range`` (a 206 for the bytes ``after``
    past those asked for, labelled as such) or ``endless`` (a 200 whatever the range: the file's
    bytes without a tar's end-of-archive blocks, then tar directory headers without end, until
    ``after`` bytes (default 128 MiB) were sent; chunked, or with ``Content-Length: claim`` when
    ``claim`` is set; ``sized=False``: its HEAD has no Content-Length either); ``times``: how many
    requests it hits (then the path is served normally; -1: all)."""

    suffix: str
    kind: str
    after: int = 0
    times: int = -1
    seconds: float = 0.0
    step: int = 512
    claim: int = 0
    sized: bool = True


@dataclass
class ShardServer:
    """A running HTTP server over ``root``: ``url`` is its base, ``log`` the requests (``GET /path``,
    ``HEAD /path``, in order), ``faults`` what it injects, ``most_at_once`` the most requests it
    was serving at one time, ``sent`` the body bytes it wrote per path (into the socket: what the
    client read, plus what the kernel's buffers held when it stopped)."""

    root: Path
    url: str = ""
    log: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    most_at_once: int = 0
    sent: dict[str, int] = field(default_factory=dict)
    _serving: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def serving(self) -> Iterator[None]:
        with self._lock:
            self._serving += 1
            self.most_at_once = max(self.most_at_once, self._serving)
        try:
            yield
        finally:
            with self._lock:
                self._serving -= 1

    def fault_for(self, path: str, count: bool = True) -> Optional[Fault]:
        for f in self.faults:
            if path.endswith(f.suffix) and f.times != 0:
                f.times -= count and f.times > 0
                return f
        return None

    def count(self, path: str, n: int) -> None:
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + n


def _handler(server: ShardServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as real servers set it: the headers and the body go out as two writes, and with
        # Nagle's algorithm the body waited for the client's delayed ACK (about 40 ms a request)
        disable_nagle_algorithm = True

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            with server.serving():
                self._serve(body=False)

        def do_GET(self) -> None:
            with server.serving():
                self._serve(body=True)

        def _serve(self, body: bool) -> None:
            server.log.append(f"{self.command} {self.path}")
            f = server.root / self.path.lstrip("/")
            if not f.is_file():
                self.send_error(404)
                return
            data = f.read_bytes()
            fault = server.fault_for(self.path) if body else None
            if fault is not None and fault.kind == "delay":
                time.sleep(fault.seconds)
                fault = None
            if fault is not None and fault.kind in ("500", "503"):
                self.send_error(int(fault.kind))
                return
            if fault is not None and fault.kind == "endless":
                self._endless(data, fault)
                return
            head = None if body else server.fault_for(self.path, count=False)
            if head is not None and head.kind == "endless" and not head.sized:
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                return
            start, end = 0, len(data)
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                a, _, b = rng[len("bytes=") :].partition("-")
                start, end = int(a), min(len(data), int(b) + 1 if b else len(data))
            if fault is not None and fault.kind == "wrong_range":
                start, end = min(start + fault.after, len(data)), min(end + fault.after, len(data))
                fault = None
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            chunk = data[start:end]
            server.count(self.path, len(chunk))
            if fault is not None and fault.kind == "trickle":
                self._trickle(chunk, fault)
                return
            if fault is not None:
                self.wfile.write(chunk[: fault.after])
                self.wfile.flush()
                time.sleep(fault.seconds)
                self.close_connection = True
                return
            self.wfile.write(chunk)

        def _endless(self, data: bytes, fault: Fault) -> None:
            self.send_response(200)
            if fault.claim:
                self.send_header("Content-Length", str(fault.claim))
            else:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            body = _without_end_blocks(data) if data.endswith(bytes(1024)) else data
            filler = _directory_headers(1 << 16)
            limit, sent, piece = fault.after or 128 << 20, 0, body
            try:
                while sent < limit:
                    piece = piece[: limit - sent]
                    frame = piece if fault.claim else b"%x\r\n%b\r\n" % (len(piece), piece)
                    self.wfile.write(frame)
                    sent += len(piece)
                    server.count(self.path, len(piece))
                    piece = filler
                if not fault.claim:
                    self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the reader had enough and closed the connection
                pass
            self.close_connection = True

        def _trickle(self, chunk: bytes, fault: Fault) -> None:
            try:
                for i in range(0, len(chunk), fault.step):
                    self.wfile.write(chunk[i : i + fault.step])
                    self.wfile.flush()
                    time.sleep(fault.seconds)
            except OSError:  # the reader gave up (its deadline) and closed the connection
                self.close_connection = True

    return Handler


def _without_end_blocks(tar: bytes) -> bytes:
    """A tar's bytes up to the end of its last member (without its end-of-archive zero blocks)."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        last = tf.getmembers()[-1]
    return tar[: last.offset_data + -(-last.size // 512) * 512]


def _directory_headers(n: int) -> bytes:
    """``n`` bytes (rounded up to 512) of tar directory entries: members a shard reader passes over."""
    import tarfile

    out = b""
    while len(out) < n:
        info = tarfile.TarInfo(f"filler{len(out) // 512:08d}")
        info.type = tarfile.DIRTYPE
        out += info.tobuf()
    return out


@contextmanager
def http_server(root: Path) -> Iterator[ShardServer]:
    """An HTTP server over ``root`` on 127.0.0.1 (a free port), stopped on exit."""
    state = ShardServer(root)
    with _serving(state, _handler(state)):
        yield state


@contextmanager
def _serving(state: ShardServer, handler: type) -> Iterator[None]:
    """``handler`` served on 127.0.0.1 (a free port, written to ``state.url``) until the block ends."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def plain_http_server(root: Path) -> Iterator[ShardServer]:
    """Python's own file server over ``root`` on 127.0.0.1 (``python -m http.server``), which ignores
    ``Range:`` and answers every GET with the whole file (200); ``log`` and ``sent`` as for
    :func:`http_server`."""

    state = ShardServer(root)

    class Plain(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, directory=str(root), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            state.log.append(f"GET {self.path}")
            f = root / self.path.lstrip("/")
            state.count(self.path, f.stat().st_size if f.is_file() else 0)
            super().do_GET()

        def do_HEAD(self) -> None:
            state.log.append(f"HEAD {self.path}")
            super().do_HEAD()

    with _serving(state, Plain):
        yield state


@dataclass
class Stalled:
    """A server that accepts connections and never answers: ``url`` its base, ``accepted`` how many
    connections it took."""

    url: str = ""
    accepted: int = 0


@contextmanager
def stalled_server() -> Iterator[Stalled]:
    """A TCP server on 127.0.0.1 that accepts every connection, holds it open and never sends a byte
    (a hung endpoint: HTTP or S3 alike), until the block ends."""
    import socket

    state, held = Stalled(), []
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.1)
    state.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:  # the timeout: look at the stop flag again
                continue
            held.append(conn)
            state.accepted += 1

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        sock.close()


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment that points s3fs (botocore) at the local S3 server with the fake credentials."""
    return {
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }


@contextmanager
def s3_server(monkeypatch: pytest.MonkeyPatch, bucket: str, folder: Path) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with ``bucket`` holding the files of ``folder`` (at its top);
    this process's environment points s3fs at it. Yields the endpoint URL."""
    import boto3
    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for k, v in s3_env(endpoint).items():
        monkeypatch.setenv(k, v)
    fsspec.filesystem("s3").clear_instance_cache()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    for f in sorted(folder.iterdir()):
        client.upload_file(str(f), bucket, f.name)
    try:
        yield endpoint
    finally:
        fsspec.filesystem("s3").clear_instance_cache()
        server.stop()


@contextmanager
def gcs_server(monkeypatch: pytest.MonkeyPatch, bucket: str, folder: Path) -> Iterator[str]:
    """A GCS emulator (gcp-storage-emulator, in memory, a thread) on 127.0.0.1 with ``bucket``
    holding the files of ``folder`` (at its top); this process's environment points gcsfs at it
    (``STORAGE_EMULATOR_HOST``, anonymous: no credentials looked for). gcsfs's default class asks
    GCS's gRPC control plane for each bucket's layout (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``), which
    the emulator does not serve: gs:// is read here by gcsfs's core ``GCSFileSystem``. Yields the
    emulator's URL."""
    import fsspec
    import fsspec.config
    from fsspec.registry import _registry
    from gcp_storage_emulator.server import create_server
    from gcsfs.core import GCSFileSystem

    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
    server.start()  # its thread is not a daemon: stopped below whatever happens, or the process never exits
    try:
        endpoint = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"  # the port it bound (0 asked for)
        env = {
            "STORAGE_EMULATOR_HOST": endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "FSSPEC_GS_TOKEN": "anon",
        }
        for k, v in env.items():  # the environment serves loader worker processes that import gcsfs afresh
            monkeypatch.setenv(k, v)
        monkeypatch.setitem(_registry, "gs", GCSFileSystem)
        monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})
        GCSFileSystem.clear_instance_cache()
        fs = fsspec.filesystem("gs")
        for f in sorted(folder.iterdir()):
            fs.put_file(str(f), f"gs://{bucket}/{f.name}")
        yield endpoint
    finally:
        GCSFileSystem.clear_instance_cache()
        server.stop()
