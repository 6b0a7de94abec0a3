"""Issue 16 figures (not a test): what hostile IPC/RPC clients cost an in-process daemon.

1. RSS growth after N unique "ctxt" registrations (default 100,000; capped at 4096 kept);
2. INFO log bytes written for N/2 polls with unique keys (rate-limited "registered" lines);
3. getStatus answers out of 10 while 100 slow-loris connections trickle one byte every 0.5 s.

    python benchmarks/bench_daemon_limits.py [N]
    PYTHONPATH=<another checkout> python benchmarks/bench_daemon_limits.py   # compare
"""

from __future__ import annotations

import io
import logging
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid

from kinetoscope.daemon.daemon import Daemon, DaemonOptions
from kinetoscope.protocol import wire


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    sockdir = tempfile.mkdtemp(prefix="ksl", dir="/tmp")
    root = tempfile.mkdtemp()
    log_buf = io.StringIO()
    logger = logging.getLogger("kinetoscope")
    logger.addHandler(logging.StreamHandler(log_buf))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    d = Daemon(
        DaemonOptions(
            port=0, ipc_socket_dir=sockdir, trace_root=root + "/t", metrics_port=None, gpu_metrics=False
        )
    )
    d.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client.bind(os.path.join(sockdir, "c" + uuid.uuid4().hex[:8]))
    client.settimeout(5)
    addr = os.path.join(sockdir, "dynolog")

    def send(datagram: bytes) -> None:
        client.sendto(datagram, addr)
        client.recv(4096)

    try:
        r0 = rss_mb()
        for pid in range(1, n + 1):
            send(wire.pack_context(pid % 8, pid, 7))
        print(f"ctxt: {n} unique registrations -> RSS +{rss_mb() - r0:.1f} MB")
        b0 = len(log_buf.getvalue())
        for pid in range(10**6, 10**6 + n // 2):
            send(wire.pack_request(3, 0, [pid]))
        print(f"polls: {n // 2} unique keys -> {(len(log_buf.getvalue()) - b0) / 2**20:.2f} MB of INFO log")
        print(f"slow-loris (100 connections): getStatus answered {slow_loris(d.rpc_port)}/10")
    finally:
        client.close()
        d.stop()


def slow_loris(port: int) -> int:
    """100 connections claim 100 KB and send one byte every 0.5 s; how many of 10 getStatus answer."""
    socks = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(struct.pack("=i", 100_000))
        socks.append(s)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.5):
            for s in socks:
                try:
                    s.send(b" ")
                except OSError:
                    pass

    threading.Thread(target=trickle, daemon=True).start()
    time.sleep(1.0)
    ok = 0
    try:
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(wire.frame_rpc(b'{"fn":"getStatus"}'))
                try:
                    ok += wire.read_rpc_frame(s) == b'{"status":1}'
                except (OSError, wire.FrameError):
                    pass
    finally:
        stop.set()
        for s in socks:
            s.close()
    return ok


if __name__ == "__main__":
    main()
