"""A loopback HTTP server that replays a recorded llama-server SSE answer with fixed gaps between writes.

It knows the true send time of every content chunk (``time.perf_counter()`` just before the ``sendall`` that
carries it; on Linux that is CLOCK_MONOTONIC, one clock for every process on the machine), so a client's
lateness for each chunk is measurable directly: the client's receive time minus the send time. That removes the
server's own variation, which dominates when clients are compared on different requests to a real server.

Run by ``bench.py`` as a separate process (so it never competes with the client for the GIL):

    python benchmarks/replay.py --recording events.json --interval-ms 10 [--framing chunked|close]

It prints ``PORT <n>`` once listening. Endpoints:

* ``POST /v1/chat/completions`` — writes the headers at once, waits ``--first-ms``, then writes the first two
  events together (the role-only chunk and the first content chunk, as llama-server does), then one event per
  write every ``--interval-ms``, then ``data: [DONE]``. The request body is read and ignored.
* ``GET /health`` — ``{"status":"ok"}`` (clients warm their pooled connection with it, as against the real server).
* ``GET /sendtimes`` — JSON ``{"content_send_s": [...], "request": n}`` for the last POST: the absolute send time
  of the write that carried each content chunk.

``--framing chunked`` (default) frames the body as llama-server does: HTTP/1.1 chunked, one HTTP chunk per write.
``--framing close`` sends no length and closes the connection at the end (a body delimited by the close, as
some proxies and servers do): a client that reads fixed-size blocks then waits for a full block.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import sys
import threading
import time
from typing import Any

STATE_LOCK = threading.Lock()


def is_content(event: bytes) -> bool:
    line = event.strip()
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        return False
    try:
        data = json.loads(line[6:])
    except ValueError:
        return False
    choices = data.get("choices") or []
    if not choices:
        return False
    content = (choices[0].get("delta") or {}).get("content")
    return isinstance(content, str) and content != ""


class ReplayState:
    def __init__(self, events: list[bytes], interval_s: float, first_s: float, framing: str) -> None:
        self.events = events
        self.interval_s = interval_s
        self.first_s = first_s
        self.framing = framing
        self.content = [is_content(e) for e in events]
        self.last_send: list[float] = []
        self.requests = 0
        # llama-server writes the role-only chunk and the first content chunk together: group them the same way.
        first_content = next((i for i, c in enumerate(self.content) if c), 0)
        self.writes: list[list[int]] = [list(range(first_content + 1))]
        self.writes += [[i] for i in range(first_content + 1, len(events))]


class Handler(socketserver.BaseRequestHandler):
    state: ReplayState

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            while len(buf) < length:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            keep = headers.get("connection", "").lower() != "close"
            if method == "POST":
                if not self.replay(sock, keep):
                    return
            elif path.startswith("/sendtimes"):
                with STATE_LOCK:
                    body = json.dumps({"content_send_s": self.state.last_send, "request": self.state.requests})
                self.simple(sock, 200, body.encode(), keep)
            elif path.startswith("/health"):
                self.simple(sock, 200, b'{"status":"ok"}', keep)
            else:
                self.simple(sock, 404, b'{"error":{"code":404,"message":"not found"}}', keep)
            if not keep:
                return

    @staticmethod
    def simple(sock: socket.socket, status: int, body: bytes, keep: bool) -> None:
        reason = "OK" if status == 200 else "Not Found"
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        sock.sendall(head.encode() + body)

    def replay(self, sock: socket.socket, keep: bool) -> bool:
        st = self.state
        chunked = st.framing == "chunked"
        head = "HTTP/1.1 200 OK\r\nServer: voice-llm-replay\r\nContent-Type: text/event-stream\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else "Connection: close\r\n"
        head += "\r\n"
        sends: list[float] = []
        try:
            # llama-server sends its headers at once, in a write of their own, and the first chunk when the first
            # token is ready: do the same, so a client's header parsing is not part of its first-chunk time.
            sock.sendall(head.encode())
            time.sleep(st.first_s)
            next_at = time.perf_counter()
            for n, group in enumerate(st.writes):
                payload = b"".join(st.events[i] for i in group)
                frame = (b"%x\r\n" % len(payload)) + payload + b"\r\n" if chunked else payload
                if n:
                    next_at += st.interval_s
                    delay = next_at - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                t = time.perf_counter()
                sock.sendall(frame)
                sends.extend(t for i in group if st.content[i])
        except OSError:
            return False
        finally:
            # Published before [DONE] goes out, so a client that stops at [DONE] finds its send times.
            with STATE_LOCK:
                st.last_send = sends
                st.requests += 1
        tail = b"data: [DONE]\n\n"
        try:
            sock.sendall((b"%x\r\n" % len(tail)) + tail + b"\r\n0\r\n\r\n" if chunked else tail)
        except OSError:
            return False
        if not chunked:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return False
        return keep


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def load_events(path: str) -> list[bytes]:
    with open(path, encoding="utf-8") as fh:
        data: Any = json.load(fh)
    events = [e.encode("utf-8") for e in data["events"]]
    # [DONE] is sent by the replay itself, after the timed events.
    return [e if e.endswith(b"\n\n") else e.rstrip(b"\n") + b"\n\n" for e in events if e.strip() != b"data: [DONE]"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", required=True, help='JSON {"events": ["data: {...}\\n\\n", ...]}')
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--first-ms", type=float, default=20.0)
    parser.add_argument("--framing", choices=("chunked", "close"), default="chunked")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    Handler.state = ReplayState(load_events(args.recording), args.interval_ms / 1000.0, args.first_ms / 1000.0,
                                args.framing)
    with Server(("127.0.0.1", args.port), Handler) as srv:
        print(f"PORT {srv.server_address[1]}", flush=True)
        srv.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
