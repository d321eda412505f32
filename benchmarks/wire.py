"""Timestamps of the server's SSE events as they cross the loopback interface, from the kernel.

Comparing clients on different requests mixes the server's own variation into the result. This sniffer removes
it: an AF_PACKET socket on ``lo`` (root or CAP_NET_RAW, Linux only) sees every TCP segment the server sends, with
a kernel receive timestamp (SO_TIMESTAMPNS). The bytes of each connection are put back in order, and each
``data:`` line that carries content is stamped with the time of the segment that completed it. A client's
lateness for chunk k of a request is then its own receive time minus the wire time of chunk k of that same
request.

Only the copy of each packet on the receiving side is kept (PACKET_HOST: the moment the segment entered the
client host's receive path). Kernel timestamps are CLOCK_REALTIME; they are turned into ``time.perf_counter()``
(CLOCK_MONOTONIC on Linux) with an offset measured at each flush, so drift does not accumulate.

Run by bench.py as a child process, so that the per-packet work never holds the client's GIL:

    python benchmarks/wire.py --port SERVER_PORT

It prints ``READY`` once capturing. Then each line ``FLUSH`` on its stdin makes it decode what it captured since
the last flush and print one JSON line: ``[{"port": client_port, "t": perf_counter_s, "c": content}, ...]``.
Per packet it only stores the bytes (no parsing), to disturb the measured clients as little as possible.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import select
import socket
import struct
import sys
import time
from typing import Any

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
PACKET_IGNORE_OUTGOING = 23
PACKET_HOST = 0
SOL_PACKET = 263
SO_ATTACH_FILTER = 26


def clock_offset(samples: int = 50) -> float:
    """CLOCK_REALTIME minus perf_counter, from the pair read closest together."""
    best = None
    for _ in range(samples):
        a = time.perf_counter_ns()
        r = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) / 2)
    assert best is not None
    return best[1] / 1e9


def attach_filter(sock: socket.socket, port: int) -> Any:
    """Classic BPF for ``ip and tcp src port PORT`` (as ``tcpdump -dd`` writes it), so the kernel wakes this
    process only for the server's segments, not for every loopback packet on the machine."""
    insns = [
        (0x28, 0, 0, 12),            # ldh [12]            ethertype
        (0x15, 0, 8, 0x0800),        # jeq IPv4 else drop
        (0x30, 0, 0, 23),            # ldb [23]            IP protocol
        (0x15, 0, 6, 6),             # jeq TCP else drop
        (0x28, 0, 0, 20),            # ldh [20]            fragment offset
        (0x45, 4, 0, 0x1FFF),        # jset -> drop (a fragment has no TCP header)
        (0xB1, 0, 0, 14),            # ldxb 4*([14]&0xf)  IP header length
        (0x48, 0, 0, 14),            # ldh [x+14]          TCP source port
        (0x15, 0, 1, port),          # jeq PORT else drop
        (0x06, 0, 0, 0x40000),       # ret whole packet
        (0x06, 0, 0, 0),             # ret 0: drop
    ]
    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in insns))
    fprog = struct.pack("HL", len(insns), ctypes.addressof(program))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    return program  # the kernel copies it, but keep it alive until setsockopt is done anyway


def open_socket(port: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    if port is not None:
        try:
            attach_filter(sock, port)
        except OSError:
            pass  # unfiltered still works: decode() keeps only the server's segments
    sock.bind(("lo", 0))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernels: the outgoing copies are dropped below by their packet type
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    return sock


def available() -> str | None:
    """None if a capture can be opened here, else why not."""
    if not sys.platform.startswith("linux"):
        return "needs Linux (AF_PACKET)"
    try:
        open_socket().close()
    except PermissionError:
        return "needs root or CAP_NET_RAW"
    except OSError as exc:
        return f"cannot capture on lo: {exc}"
    return None


class Stream:
    """One server->client TCP byte stream, reassembled by sequence number, cut into lines."""

    def __init__(self) -> None:
        self.next_seq: int | None = None
        self.line = b""
        self.pending: dict[int, tuple[float, bytes]] = {}

    def add(self, seq: int, t: float, payload: bytes, out: list[dict], port: int) -> None:
        if self.next_seq is None:
            self.next_seq = seq
        self.pending[seq] = (t, payload)
        progressed = True
        while progressed:
            progressed = False
            for start in list(self.pending):
                behind = (self.next_seq - start) % (1 << 32)  # how far this segment starts before next_seq
                if behind >= (1 << 31):
                    continue  # it starts after a gap: wait for the missing bytes
                t_seg, data = self.pending.pop(start)
                if behind < len(data):  # skip bytes already seen (a retransmission overlaps)
                    data = data[behind:]
                    self.next_seq = (self.next_seq + len(data)) % (1 << 32)
                    self.feed(t_seg, data, out, port)
                progressed = True
                break

    def feed(self, t: float, data: bytes, out: list[dict], port: int) -> None:
        self.line += data
        while True:
            end = self.line.find(b"\n")
            if end < 0:
                return
            text, self.line = self.line[:end].rstrip(b"\r"), self.line[end + 1:]
            if not text.startswith(b"data: ") or text == b"data: [DONE]":
                continue
            try:
                obj = json.loads(text[6:])
            except ValueError:
                continue
            choices = obj.get("choices") if isinstance(obj, dict) else None
            if not choices:
                continue
            content = (choices[0].get("delta") or {}).get("content")
            if isinstance(content, str) and content:
                out.append({"port": port, "t": t, "c": content})


def decode(packets: list[tuple[float, bytes]], server_port: int, streams: dict[int, Stream], offset: float) -> list[dict]:
    out: list[dict] = []
    for t_real, frame in packets:
        if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":  # IPv4 only (the server listens on 127.0.0.1)
            continue
        ip = frame[14:]
        ihl = (ip[0] & 15) * 4
        if ip[9] != 6:
            continue
        total = struct.unpack("!H", ip[2:4])[0]
        sport, dport, seq = struct.unpack("!HHI", ip[ihl:ihl + 8])
        if sport != server_port:
            continue
        flags = ip[ihl + 13]
        data_off = (ip[ihl + 12] >> 4) * 4
        payload = ip[ihl + data_off:total]
        if flags & 0x02:  # SYN: a new connection on this client port
            streams[dport] = Stream()
            streams[dport].next_seq = (seq + 1) % (1 << 32)
            continue
        if not payload:
            continue
        stream = streams.setdefault(dport, Stream())
        stream.add(seq, t_real - offset, payload, out, dport)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="the server's TCP port")
    args = parser.parse_args(argv)
    sock = open_socket(args.port)
    sock.setblocking(False)
    packets: list[tuple[float, bytes]] = []
    streams: dict[int, Stream] = {}
    stdin = sys.stdin.buffer
    print("READY", flush=True)

    def drain() -> None:
        while True:
            try:
                data, anc, _flags, addr = sock.recvmsg(65600, 64)
            except BlockingIOError:
                return
            if addr[2] != PACKET_HOST:
                continue
            t_real = None
            for _lvl, kind, val in anc:
                if kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", val[:16])
                    t_real = sec + nsec / 1e9
            packets.append((t_real if t_real is not None else time.time(), data))

    while True:
        ready, _, _ = select.select([sock, stdin], [], [])
        if sock in ready:
            drain()
        if stdin in ready:
            line = stdin.readline()
            if not line:
                return 0
            if line.strip() == b"FLUSH":
                drain()  # what the kernel already holds
                events = decode(packets, args.port, streams, clock_offset())
                packets = []
                sys.stdout.write(json.dumps(events) + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
