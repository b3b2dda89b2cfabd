"""A fault-injecting HTTP proxy for an S3 server, run as its own process on loopback:
`python fault_proxy.py PORT UPSTREAM_PORT CONTROL_FILE`. Per request it forwards, answers
503 SlowDown or 500 InternalError, cuts the connection halfway through the request body
(after forwarding that half upstream) or the response body, answers 403 AccessDenied for a
denied key prefix, or — during an outage — closes every connection at once.

The faults come from CONTROL_FILE (JSON, re-read when it changes): `error_rate` (of the
`error_codes` given, default SlowDown and InternalError), `cut_rate`,
`deny_prefix`, `outage` (true/false) and `outage_after` (requests forwarded before an outage
starts by itself). Counts of what was done go to CONTROL_FILE + ".stats".
"""

from __future__ import annotations

import json
import os
import random
import socket
import socketserver
import sys
import threading
from pathlib import Path

ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error>"
)
ERRORS = [
    (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
]


class Control:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.mtime = None
        self.settings: dict = {}
        self.stats = {"requests": 0, "forwarded": 0, "errors": 0, "cut_requests": 0}
        self.stats.update({"cut_responses": 0, "denied": 0, "outage_closed": 0})
        self.random = random.Random(int(os.environ.get("FAULT_SEED", "7")))

    def current(self) -> dict:
        mtime = self.path.stat().st_mtime_ns
        if mtime != self.mtime:
            self.settings = json.loads(self.path.read_text())
            self.mtime = mtime
            self.forwarded_since_load = 0
        return self.settings

    def error_kinds(self) -> list[tuple[int, str, str, str]]:
        codes = self.settings.get("error_codes")
        return [kind for kind in ERRORS if codes is None or kind[2] in codes]

    def decide(self, target: str, has_body: bool) -> str:
        with self.lock:
            settings = self.current()
            self.stats["requests"] += 1
            after = settings.get("outage_after")
            if settings.get("outage") or (after is not None and self.forwarded_since_load >= after):
                return self._count("outage_closed", "outage")
            prefix = settings.get("deny_prefix")
            if prefix and target.split("?")[0].startswith(prefix):
                return self._count("denied", "deny")
            draw = self.random.random()
            if draw < settings.get("error_rate", 0):
                return self._count("errors", "error")
            if draw < settings.get("error_rate", 0) + settings.get("cut_rate", 0):
                if has_body and self.random.random() < 0.5:
                    return self._count("cut_requests", "cut_request")
                return "cut_response"  # counted when a body was actually cut
            self.forwarded_since_load += 1
            return self._count("forwarded", "forward")

    def _count(self, name: str, decision: str) -> str:
        self.stats[name] += 1
        self._save()
        return decision

    def count(self, name: str) -> None:
        with self.lock:
            self.stats[name] += 1
            self._save()

    def _save(self) -> None:
        temp = self.path.with_name(self.path.name + ".stats.tmp")
        temp.write_text(json.dumps(self.stats))
        os.replace(temp, self.path.with_name(self.path.name + ".stats"))


def read_head(stream) -> tuple[bytes, dict[str, str]] | None:
    lines = []
    while True:
        line = stream.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line)
    if not lines:
        return None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return b"".join(lines), headers


def read_body(stream, headers: dict[str, str]) -> bytes:
    """The raw body (chunked bodies kept as chunks)."""
    if "content-length" in headers:
        return stream.read(int(headers["content-length"]))
    if "chunked" in headers.get("transfer-encoding", ""):
        raw = b""
        while True:
            size_line = stream.readline()
            raw += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:
                    trailer = stream.readline()
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return raw
            raw += stream.read(size + 2)
    return b""


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        control: Control = self.server.control
        while True:
            head = read_head(self.rfile)
            if head is None:
                return
            raw_head, headers = head
            method, target = raw_head.split(b" ", 2)[:2]
            if headers.get("expect", "").lower() == "100-continue":
                # Answered here (the server would answer upstream, before its response).
                raw_head = b"".join(
                    line + b"\r\n"
                    for line in raw_head.split(b"\r\n")
                    if line and not line.lower().startswith(b"expect:")
                )
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.wfile.flush()
            has_body = int(headers.get("content-length", "0") or 0) > 1
            decision = control.decide(target.decode("latin-1"), has_body)
            if decision == "outage":
                return  # connection closed at once
            if decision == "cut_request":
                body = read_body(self.rfile, headers)
                self._forward_part(raw_head, body[: len(body) // 2])
                return
            body = read_body(self.rfile, headers)
            if decision in ("error", "deny"):
                status, reason, code, message = (
                    (403, "Forbidden", "AccessDenied", "Access Denied")
                    if decision == "deny"
                    else control.random.choice(control.error_kinds())
                )
                body = ERROR_BODY.format(code=code, message=message)
                self._answer(status, reason, body, with_body=method != b"HEAD")
                continue
            response_head, response_body = self._forward(raw_head, body, method == b"HEAD")
            if decision == "cut_response" and len(response_body) > 1:
                control.count("cut_responses")
                self.wfile.write(response_head + response_body[: len(response_body) // 2])
                self.wfile.flush()
                return
            self.wfile.write(response_head + response_body)
            self.wfile.flush()

    def _answer(self, status: int, reason: str, body: str, with_body: bool) -> None:
        data = body.encode()
        self.wfile.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + (data if with_body else b"")  # a HEAD answer has no body
        )
        self.wfile.flush()

    def _upstream(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.server.upstream_port), timeout=60)

    def _forward_part(self, raw_head: bytes, partial_body: bytes) -> None:
        """Half a request reaches the server, then the connection drops."""
        with self._upstream() as upstream:
            upstream.sendall(raw_head + b"\r\n" + partial_body)

    def _forward(self, raw_head: bytes, body: bytes, is_head: bool) -> tuple[bytes, bytes]:
        with self._upstream() as upstream:
            upstream.sendall(raw_head + b"\r\n" + body)
            stream = upstream.makefile("rb")
            head = read_head(stream)
            if head is None:
                return b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n", b""
            response_head, headers = head
            response_body = b"" if is_head else read_body(stream, headers)
            return response_head + b"\r\n", response_body


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    port, upstream_port, control_file = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    server = Server(("127.0.0.1", port), Handler)
    server.control = Control(control_file)
    server.upstream_port = upstream_port
    server.serve_forever()


if __name__ == "__main__":
    main()
