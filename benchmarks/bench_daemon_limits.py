"""Issue 16 figures (not a test): what hostile IPC/RPC clients cost an in-process daemon.

1. RSS growth after N unique "ctxt" registrations (default 100,000; capped at 4096 kept);
2. INFO log bytes written for N/2 polls with unique keys (rate-limited "registered" lines);
3. getStatus answers out of 10 while 100 slow-loris connections trickle one byte every 0.5 s.

    python benchmarks/bench_daemon_limits.py [N]
    PYTHONPATH=<another checkout> python benchmarks/bench_daemon_limits.py   # compare

Issue 32 figures (``planted`` mode): what a traced process's planted trace file and a flooding
local user cost, each against a baseline measured in the same run:

4. per planted file (symlink to /dev/zero, FIFO, 1 GiB sparse file, 63 MiB of ``[{},{},...]``):
   seconds for the first ``kscopeTraceStatus`` (ratio to a 1 MiB real trace's), daemon RSS
   growth and peak (VmHWM) growth; then 16 concurrent status calls on the 63 MiB file;
5. ``kscope trace --wait --timeout 5`` (the CLI, a subprocess) with a FIFO planted: seconds;
6. one user registering 16,384 fake processes x 11 pids: how many were kept, and a real rank's
   poll round trip (p50/p99) while 4 threads list processes, against the same without the flood;
   bytes of one listing answer;
7. failed token attempts per second from one sequential client.

    python benchmarks/bench_daemon_limits.py planted [--kinds devzero,fifo,sparse,array]
    (on a checkout before issue 32, leave out devzero and fifo: they hang or exhaust memory)
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


# ------------------------------------------------------------------ issue 32
def _status_mem() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def _rpc(port: int, req: dict, timeout: float = 30.0) -> tuple[dict | None, int]:
    import orjson

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(wire.frame_rpc(orjson.dumps(req)))
            body = wire.read_rpc_frame(s)
            return orjson.loads(body), len(body)
    except (OSError, wire.FrameError):
        return None, 0


def _plant(kind: str, path: str) -> None:
    if kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    elif kind == "array":
        with open(path, "wb") as f:
            f.write(b"[" + b"{}," * (21 << 20) + b"{}]")  # 63 MiB
    elif kind == "baseline":
        with open(path, "wb") as f:
            f.write(b'{"traceEvents": [' + b'{"ph": "X", "ts": 1, "dur": 2, "name": "k"},' * 23000 + b"{}]}")


def planted(kinds: list[str]) -> None:
    import subprocess

    sockdir = tempfile.mkdtemp(prefix="ksp", dir="/tmp")
    root = tempfile.mkdtemp() + "/t"
    d = Daemon(
        DaemonOptions(port=0, ipc_socket_dir=sockdir, trace_root=root, metrics_port=None, gpu_metrics=False)
    )
    d.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client.bind(os.path.join(sockdir, "c" + uuid.uuid4().hex[:8]))
    client.settimeout(5)
    addr = os.path.join(sockdir, "dynolog")

    def poll(pids: list[int], job: int = 7) -> float:
        t0 = time.perf_counter()
        client.sendto(wire.pack_request(3, job, pids), addr)
        client.recv(4096)
        return time.perf_counter() - t0

    try:
        poll([4242, 1])
        base_s = None
        for i, kind in enumerate(["baseline", *kinds]):
            tid = f"b32-{i}-{kind}"
            res, _ = _rpc(
                d.rpc_port, {"fn": "kscopeTrace", "trace_id": tid, "pids": [4242], "duration_ms": 100}
            )
            assert res and res.get("triggered") == 1, res
            poll([4242, 1])  # picked up: the next request is not "busy"
            _plant(kind, res["matched"][0]["path"])
            _reset_peak()
            rss0, hwm0 = _status_mem()
            t0 = time.perf_counter()
            st, _ = _rpc(d.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": tid}, timeout=30)
            took = time.perf_counter() - t0
            rss1, hwm1 = _status_mem()
            base_s = base_s or took
            f = (st or {}).get("files", [{}])[0]
            print(
                f"planted {kind:>8}: status in {took:.3f} s ({took / base_s:.1f}x the 1 MiB trace's), "
                f"RSS +{rss1 - rss0:.1f} MB, peak +{hwm1 - hwm0:.1f} MB; complete={f.get('complete')} "
                f"reason={f.get('reason')!r}"
                if st
                else f"planted {kind:>8}: no answer within 30 s"
            )
            if kind == "array":
                _reset_peak()
                rss0, hwm0 = _status_mem()
                t0 = time.perf_counter()
                threads = [
                    threading.Thread(
                        target=_rpc, args=(d.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": tid})
                    )
                    for _ in range(16)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                print(
                    f"planted    array: 16 concurrent status calls in {time.perf_counter() - t0:.3f} s, "
                    f"peak RSS +{_status_mem()[1] - hwm0:.1f} MB"
                )
        if "fifo" in kinds:
            tdir = os.path.join(root, "cli-fifo")
            os.makedirs(tdir)
            host = d.hostname.replace(".", "_")
            os.mkfifo(os.path.join(tdir, f"{host}_4242.pt.trace.json"))
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "kinetoscope.cli.main", "trace", "--host", f"127.0.0.1:{d.rpc_port}",
                 "--pids", "4242", "--duration-ms", "100", "--trace-id", "cli-fifo", "--wait", "--timeout", "5",
                 "--no-catalog"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            print(f"kscope trace --wait --timeout 5, FIFO planted: returned in {time.perf_counter() - t0:.1f} s "
                  f"(exit {proc.returncode})")  # fmt: skip
        flood(d, client, addr, poll)
        tokens()
    finally:
        client.close()
        d.stop()


def _poll_times(poll, n: int = 200) -> tuple[float, float]:
    times = sorted(poll([4242, 1]) for _ in range(n))
    return times[n // 2] * 1000, times[int(n * 0.99)] * 1000


def flood(d: Daemon, client: socket.socket, addr: str, poll) -> None:
    stop = threading.Event()

    def lister() -> None:
        while not stop.is_set():
            _rpc(d.rpc_port, {"fn": "kscopeListProcesses"})

    def with_listers() -> tuple[float, float]:
        stop.clear()
        threads = [threading.Thread(target=lister, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            return _poll_times(poll)
        finally:
            stop.set()
            for t in threads:
                t.join()

    base = with_listers()
    t0 = time.perf_counter()
    for i in range(16384):
        client.sendto(wire.pack_request(3, 9, [50_000 + i, *range(2, 12)]), addr)
        client.recv(4096)
    took = time.perf_counter() - t0
    flooded = with_listers()
    _, size = _rpc(d.rpc_port, {"fn": "kscopeListProcesses"})
    print(
        f"flood: 16384 fake processes x 11 pids from one user in {took:.1f} s -> {len(d.registry)} registered; "
        f"a rank's poll with 4 listing callers p50/p99 {flooded[0]:.2f}/{flooded[1]:.2f} ms "
        f"(before the flood {base[0]:.2f}/{base[1]:.2f} ms); one listing answer {size / 2**20:.2f} MB"
    )


def tokens(seconds: float = 5.0) -> None:
    sockdir = tempfile.mkdtemp(prefix="kst", dir="/tmp")
    d = Daemon(
        DaemonOptions(port=0, ipc_socket_dir=sockdir, trace_root=tempfile.mkdtemp() + "/t", metrics_port=None,
                      gpu_metrics=False, token="s3cret")
    )  # fmt: skip
    d.start()
    logging.getLogger("kinetoscope").setLevel(logging.ERROR)
    try:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            _rpc(d.rpc_port, {"fn": "getStatus", "token": f"guess{n}"})
            n += 1
        print(f"failed token attempts from one sequential client: {n / (time.perf_counter() - t0):.1f}/s")
    finally:
        d.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "planted":
        chosen = "devzero,fifo,sparse,array"
        if "--kinds" in sys.argv:
            chosen = sys.argv[sys.argv.index("--kinds") + 1]
        planted([k for k in chosen.split(",") if k])
    else:
        main()
