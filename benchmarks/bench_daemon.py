"""Benchmark of `kscope daemon` (not a test): IPC reply latency, daemon CPU, training overhead.

1. IPC: a real daemon subprocess; 256 simulated libkineto clients in this process, each a bound
   AF_UNIX datagram socket speaking the real protocol ("req" polls). Scenarios:
     * idle      - no clients (the daemon's own background work: GC, host metrics)
     * realistic - every client polls every 5 s (PyTorch's default), phases spread out
     * stressed  - every client polls every 100 ms (50x the default rate)
     * herd      - all 256 poll at the same instant, repeatedly (a job's ranks in lock-step)
   The realistic and herd loads are then replayed against a minimal echo server (calibration:
   the latency this machine allows at best).
   A send that finds the daemon's queue full (EAGAIN, net.unix.max_dgram_qlen) is retried
   after 10, 20, 40 ... ms like kineto's sync_send. Latency = from the successful send to the
   reply, i.e. what kineto's ~90 ms poll window sees. CPU = daemon process CPU time / wall time
   (% of one core, psutil).
2. Step time: a small real CPU training loop (torch, 1 thread) in two long-lived processes, one
   with KINETO_USE_DAEMON=1 (registered with the daemon, polling every 5 s, optimizer step hook)
   and one without; they take turns running 0.5 s blocks (ABBA). Overhead = median over block
   pairs of the ratio of median step times (wall, and training-thread CPU time). The optimizer
   post-hook that KINETO_USE_DAEMON=1 installs is also timed directly.

Targets: every reply < 10 ms; < 2 % of one core at the realistic rate; step overhead < 0.5 %.

    python benchmarks/bench_daemon.py                 # ~2 minutes
    python benchmarks/bench_daemon.py --update-docs   # also rewrite the Daemon section of docs/performance.md
"""

from __future__ import annotations

import argparse
import heapq
import os
import platform
import random
import re
import selectors
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kinetoscope.protocol import wire  # noqa: E402

N_CLIENTS = 256
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESPEC = struct.Struct("=qq")
ANC = socket.CMSG_SPACE(TIMESPEC.size)


# ---------------------------------------------------------------------------------------
# daemon process
# ---------------------------------------------------------------------------------------
DAEMON_NICE = 0  # --daemon-nice: scheduling priority of the daemon process (negative needs root)


def start_daemon(sockdir: str, trace_root: str) -> tuple[subprocess.Popen, dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    nice = DAEMON_NICE
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kinetoscope.cli.main",
            "daemon",
            "--port",
            "0",
            "--ipc-socket-dir",
            sockdir,
            "--trace-root",
            trace_root,
            "--metrics-port",
            "0",
            "--log-level",
            "WARNING",
        ],  # fmt: skip
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    line = p.stdout.readline()
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    if "rpc_port" not in fields:
        p.kill()
        raise SystemExit(f"daemon did not start: {line!r}")
    return p, fields


def daemon_counters(metrics_port: str) -> dict[str, float]:
    """The daemon's own view (its /metrics): polls, reply errors, drops, in-daemon handling time."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {"dropped": 0.0}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        if name == "kscope_daemon_ipc_polls_total":
            out["polls"] = float(value)
        elif name == "kscope_daemon_ipc_reply_errors_total":
            out["reply_errors"] = float(value)
        elif name.startswith("kscope_daemon_ipc_dropped_datagrams_total"):
            out["dropped"] += float(value)
        elif name == 'kscope_daemon_ipc_reply_latency_seconds_bucket{le="0.001"}':
            out["handled_under_1ms"] = float(value)
        elif name == 'kscope_daemon_ipc_reply_latency_seconds_bucket{le="0.0001"}':
            out["handled_under_100us"] = float(value)
        elif name == "kscope_daemon_ipc_reply_latency_seconds_count":
            out["handled"] = float(value)
    return out


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` in ns (schedstat: exact, unlike tick-based stat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass
    return total


def stop_daemon(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


# ---------------------------------------------------------------------------------------
# IPC clients
# ---------------------------------------------------------------------------------------
@dataclass
class ScenarioResult:
    name: str
    rate: str
    polls: int = 0
    lost: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    cpu_pct: float = 0.0
    wall_s: float = 0.0

    @property
    def late(self) -> int:
        """Replies after kineto's ~90 ms poll window: the client would have missed them."""
        return sum(x > 0.09 for x in self.latencies) + self.lost

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] * 1000


class Clients:
    """N bound datagram sockets polling the daemon on a schedule, all on one event loop."""

    def __init__(self, sockdir: str, n: int) -> None:
        self.daemon = os.path.join(sockdir, "dynolog")
        self.socks = []
        self.sel = selectors.DefaultSelector()
        self.base_pid = 100_000
        for i in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(os.path.join(sockdir, f"dynoconfigclient{uuid.uuid4()}"))
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # kernel arrival time of each reply
            s.setblocking(False)
            self.socks.append(s)
            self.sel.register(s, selectors.EVENT_READ, i)
        self.msgs = [wire.pack_request(3, 0, [self.base_pid + i, 99_999]) for i in range(n)]

    def close(self) -> None:
        for s in self.socks:
            path = s.getsockname()
            s.close()
            try:
                os.unlink(path)
            except OSError:
                pass
        self.sel.close()

    def run(self, res: ScenarioResult, period_s: float, duration_s: float, herd: bool = False) -> None:
        """Poll every ``period_s`` per client for ``duration_s``; fills ``res``."""
        n = len(self.socks)
        t0 = time.perf_counter()
        # (due time, client, attempt); herd: all clients due at the same instants
        heap = [(t0 + (0.0 if herd else random.uniform(0, period_s)), i, 0) for i in range(n)]
        heapq.heapify(heap)
        sent_at: dict[int, int] = {}  # client -> CLOCK_REALTIME ns just before its send
        end = t0 + duration_s
        while True:
            # Collect replies that already arrived before sending again (if this loop itself was
            # starved, a waiting reply must not be mistaken for a lost one).
            self._read(self.sel.select(0), res, sent_at)
            now = time.perf_counter()
            while heap and heap[0][0] <= now:
                due, i, attempt = heapq.heappop(heap)
                if due >= end:
                    heap = []
                    break
                if i in sent_at:  # previous poll never answered within the period
                    res.lost += 1
                    del sent_at[i]
                t_send = time.time_ns()
                try:
                    self.socks[i].sendto(self.msgs[i], self.daemon)
                except BlockingIOError:  # daemon queue full: kineto retries with backoff
                    res.retries += 1
                    heapq.heappush(heap, (now + 0.01 * (2**attempt), i, attempt + 1))
                    continue
                sent_at[i] = t_send
                res.polls += 1
                heapq.heappush(heap, (due + period_s, i, 0))
            if not heap and not sent_at:
                break
            timeout = max(0.0, heap[0][0] - time.perf_counter()) if heap else 0.2
            events = self.sel.select(timeout)
            if not events and not heap:
                res.lost += len(sent_at)  # waited 200 ms after the end: unanswered
                break
            self._read(events, res, sent_at)

    def _read(self, events: list, res: ScenarioResult, sent_at: dict[int, int]) -> None:
        for key, _ in events:
            i = key.data
            try:
                data, anc, _flags, _addr = self.socks[i].recvmsg(4096, ANC)
            except BlockingIOError:
                continue
            # The kernel's arrival timestamp, so this loop's own delays are not counted.
            t_rx = next((TIMESPEC.unpack(d) for lvl, _t, d in anc if lvl == socket.SOL_SOCKET), None)
            rx_ns = t_rx[0] * 1_000_000_000 + t_rx[1] if t_rx else time.time_ns()
            if i in sent_at and data[:8] == b"\0" * 8:  # empty "req" reply
                res.latencies.append((rx_ns - sent_at.pop(i)) / 1e9)


FLOOR_SERVER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sys.argv[1])
    print("READY", flush=True)
    reply = b"\\0" * 8 + b"req" + b"\\0" * 29   # an empty "req" reply
    while True:
        data, addr = s.recvfrom(1024)
        s.sendto(reply, addr)
    """
)


def floor_benchmark(quick: bool) -> list[ScenarioResult]:
    """Realistic and herd loads against a 6-line blocking echo server: what this machine allows."""
    sockdir = tempfile.mkdtemp(prefix="ksb", dir="/tmp")
    srv = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, os.path.join(sockdir, "dynolog")],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    clients = None
    out = []
    try:
        srv.stdout.readline()
        clients = Clients(sockdir, N_CLIENTS)
        clients.run(ScenarioResult("warmup", ""), 0.05, 0.2, herd=True)
        for name, rate, period, duration, herd in (
            ("realistic, minimal echo server", f"{N_CLIENTS} x 1/5 s", 5.0, 5 if quick else 10, False),
            (
                "herd, minimal echo server",
                f"{N_CLIENTS} at once, every 250 ms",
                0.25,
                2 if quick else 4,
                True,
            ),
        ):
            res = ScenarioResult(name, rate)
            c0 = cpu_ns(srv.pid)
            w0 = time.perf_counter()
            clients.run(res, period, duration, herd=herd)
            res.wall_s = time.perf_counter() - w0
            res.cpu_pct = 100 * (cpu_ns(srv.pid) - c0) / 1e9 / res.wall_s
            print(f"  {name:<31} {res.polls:>7} polls  p50 {res.pct(50):6.3f} ms  p99 {res.pct(99):6.3f} ms  "
                  f"max {res.pct(100):6.3f} ms  cpu {res.cpu_pct:5.2f} %", flush=True)  # fmt: skip
            out.append(res)
        return out
    finally:
        if clients is not None:
            clients.close()
        srv.kill()
        srv.wait()
        shutil.rmtree(sockdir, ignore_errors=True)


def ipc_benchmark(quick: bool) -> tuple[list[ScenarioResult], dict[str, float]]:
    sockdir = tempfile.mkdtemp(prefix="ksb", dir="/tmp")
    trace_root = tempfile.mkdtemp(prefix="kscope-bench-traces-")
    daemon, fields = start_daemon(sockdir, trace_root)
    results = []
    counters: dict[str, float] = {}
    psutil.cpu_percent(interval=None)  # start the host-busy measurement
    clients = Clients(sockdir, N_CLIENTS)
    try:
        scenarios = [
            ("idle", "no clients", None, 4 if quick else 8, False),
            ("realistic", f"{N_CLIENTS} x 1/5 s", 5.0, 10 if quick else 20, False),
            ("stressed", f"{N_CLIENTS} x 1/100 ms", 0.1, 3 if quick else 6, False),
            ("herd", f"{N_CLIENTS} at once, every 250 ms", 0.25, 2 if quick else 4, True),
        ]
        # register everyone first (the first poll of a process reads /proc once)
        clients.run(ScenarioResult("warmup", ""), 0.05, 0.2, herd=True)
        for name, rate, period, duration, herd in scenarios:
            res = ScenarioResult(name, rate)
            c0 = cpu_ns(daemon.pid)
            w0 = time.perf_counter()
            if period is None:
                time.sleep(duration)
            else:
                clients.run(res, period, duration, herd=herd)
            res.wall_s = time.perf_counter() - w0
            res.cpu_pct = 100 * (cpu_ns(daemon.pid) - c0) / 1e9 / res.wall_s
            results.append(res)
            print(f"  {name:<10} {res.polls:>7} polls  p50 {res.pct(50):6.3f} ms  p99 {res.pct(99):6.3f} ms  "
                  f"max {res.pct(100):6.3f} ms  cpu {res.cpu_pct:5.2f} %", flush=True)  # fmt: skip
        counters = daemon_counters(fields["metrics_port"])
    finally:
        clients.close()
        stop_daemon(daemon)
        shutil.rmtree(sockdir, ignore_errors=True)
        shutil.rmtree(trace_root, ignore_errors=True)
    results.extend(floor_benchmark(quick))
    counters["host_busy_pct"] = psutil.cpu_percent(interval=None)
    counters["load1"] = os.getloadavg()[0]
    return results, counters


# ---------------------------------------------------------------------------------------
# training step overhead
# ---------------------------------------------------------------------------------------
WORKER = textwrap.dedent(
    """
    import statistics, sys, time
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(50):
        step()
    print("READY", flush=True)
    for line in sys.stdin:            # "RUN <seconds>": one measured block; "HOOK <n>"; EOF: quit
        if line.startswith("HOOK"):   # the per-step cost KINETO_USE_DAEMON adds, timed directly
            from torch.profiler import _optimizer_post_hook
            n = int(line.split()[1]); best = float("inf")
            for _ in range(5):
                c = time.thread_time()
                for _ in range(n):
                    _optimizer_post_hook(opt, (), {})
                best = min(best, (time.thread_time() - c) / n)
            print(best, flush=True)
            continue
        wall, cpu = [], []
        end = time.perf_counter() + float(line.split()[1])
        while time.perf_counter() < end:
            t, c = time.perf_counter(), time.thread_time()
            step()
            cpu.append(time.thread_time() - c); wall.append(time.perf_counter() - t)
        print(statistics.median(wall), statistics.median(cpu), len(wall), flush=True)
    """
)


def step_benchmark(pairs: int, block_s: float) -> dict[str, float]:
    """Two long-lived training processes, one with KINETO_USE_DAEMON=1 (and the daemon running),
    one without, take turns running short blocks of steps (ABBA order) while the other waits
    idle on a pipe: both see the same machine conditions, and torch is imported only twice."""
    sockdir = tempfile.mkdtemp(prefix="ksb", dir="/tmp")
    trace_root = tempfile.mkdtemp(prefix="kscope-bench-traces-")
    daemon, fields = start_daemon(sockdir, trace_root)
    port = int(fields["rpc_port"])
    base = {k: v for k, v in os.environ.items() if not k.startswith("KINETO_")}
    envs = {"with": dict(base, KINETO_USE_DAEMON="1", KINETO_IPC_SOCKET_DIR=sockdir), "without": base}
    workers = {
        name: subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        for name, env in envs.items()
    }
    blocks: dict[str, list[tuple[float, float, int]]] = {"with": [], "without": []}
    try:
        for w in workers.values():
            if w.stdout.readline().strip() != "READY":
                raise SystemExit("training worker failed to start")
        registered = _registered_pids(port)
        if workers["with"].pid not in registered or workers["without"].pid in registered:
            raise SystemExit(f"unexpected registrations {registered}: the comparison would be meaningless")
        for i in range(pairs):
            order = ["with", "without"] if i % 2 == 0 else ["without", "with"]
            for name in order:
                w = workers[name]
                w.stdin.write(f"RUN {block_s}\n")
                w.stdin.flush()
                wall, cpu, n = w.stdout.readline().split()
                blocks[name].append((float(wall), float(cpu), int(n)))
        w = workers["with"]
        w.stdin.write("HOOK 20000\n")
        w.stdin.flush()
        hook_s = float(w.stdout.readline())
    finally:
        for w in workers.values():
            w.stdin.close()
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        stop_daemon(daemon)
        shutil.rmtree(sockdir, ignore_errors=True)
        shutil.rmtree(trace_root, ignore_errors=True)
    out: dict[str, float] = {
        "pairs": pairs,
        "steps": sum(b[2] for v in blocks.values() for b in v),
        "hook_us": hook_s * 1e6,
    }
    for idx, key in ((0, ""), (1, "cpu_")):
        with_ = [b[idx] for b in blocks["with"]]
        without = [b[idx] for b in blocks["without"]]
        ratios = [a / b for a, b in zip(with_, without)]
        out[f"{key}with_ms"] = statistics.median(with_) * 1e3
        out[f"{key}without_ms"] = statistics.median(without) * 1e3
        out[f"{key}ratio"] = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4)
        out[f"{key}ratio_q1"], out[f"{key}ratio_q3"] = q[0], q[2]
    out["hook_pct"] = 100 * hook_s / (out["cpu_without_ms"] / 1e3)
    print(f"  {pairs} block pairs: wall ratio {out['ratio']:.4f}, thread-CPU ratio {out['cpu_ratio']:.4f}; "
          f"optimizer hook {out['hook_us']:.2f} us/step = {out['hook_pct']:.3f} %", flush=True)  # fmt: skip
    return out


def _registered_pids(port: int) -> list[int]:
    from kinetoscope.protocol.wire import encode_rpc_json, frame_rpc, read_rpc_frame

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(frame_rpc(encode_rpc_json({"fn": "kscopeListProcesses"})))
        import orjson

        return [p["pid"] for p in orjson.loads(read_rpc_frame(s))["processes"]]


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------
def report(
    ipc: list[ScenarioResult], counters: dict[str, float], step: dict[str, float] | None, cmd: str
) -> str:
    lines = [
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{psutil.cpu_count()} cores, Python {platform.python_version()}; a shared machine, so "
        "absolute numbers are noisy)" + (f"; daemon at nice {DAEMON_NICE}." if DAEMON_NICE else "."),
        "",
        "IPC, 256 simulated libkineto clients (real AF_UNIX datagrams; latency from send to reply):",
        "",
        "| scenario | rate | polls | p50 ms | p99 ms | max ms | > 90 ms or lost | send retries | daemon CPU (% of 1 core) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ipc:
        if r.polls:
            lines.append(
                f"| {r.name} | {r.rate} | {r.polls} | {r.pct(50):.3f} | {r.pct(99):.3f} | {r.pct(100):.3f} "
                f"| {r.late} | {r.retries} | {r.cpu_pct:.2f} |"
            )
        else:
            lines.append(f"| {r.name} | {r.rate} | - | - | - | - | - | - | {r.cpu_pct:.2f} |")
    if counters.get("handled"):
        h = counters["handled"]
        lines += [
            "",
            f"The host's CPUs were {counters['host_busy_pct']:.0f} % busy during these runs (all processes, "
            f"the benchmark's clients included; 1-minute load average {counters['load1']:.1f}).",
            "",
            f"Daemon side (its /metrics, all scenarios): {int(counters.get('polls', 0))} polls, "
            f"{int(counters.get('reply_errors', 0))} replies that could not be sent, "
            f"{int(counters['dropped'])} datagrams dropped; receive-to-reply handling time under 100 us "
            f"for {100 * counters.get('handled_under_100us', 0) / h:.1f} % and under 1 ms for "
            f"{100 * counters.get('handled_under_1ms', 0) / h:.2f} % of replies.",
        ]
    real = next(r for r in ipc if r.name == "realistic")
    worst = max(r.pct(100) for r in ipc if r.polls and "echo" not in r.name)
    lines += [
        "",
        "The last two rows are a calibration: the same loads against a 6-line blocking Python echo "
        "server (no registry, no metrics; its CPU in the last column) show what this machine allows at best.",
        "",
        f"Targets: every reply < 10 ms -> worst {worst:.3f} ms ({'met' if worst < 10 else 'MISSED'}); "
        f"< 2 % of one core at the 5 s poll period -> {real.cpu_pct:.2f} % "
        f"({'met' if real.cpu_pct < 2 else 'MISSED'}).",
    ]
    if step:
        over = (step["ratio"] - 1) * 100
        over_cpu = (step["cpu_ratio"] - 1) * 100
        lines += [
            "",
            f"Training step time, small CPU MLP (torch, 1 thread): two long-lived processes, with and "
            f"without `KINETO_USE_DAEMON=1`, alternate {int(step['pairs'])} pairs of short blocks (ABBA "
            f"order), {int(step['steps'])} measured steps:",
            "",
            "| | median step, wall ms | median step, training-thread CPU ms |",
            "|---|---:|---:|",
            f"| `KINETO_USE_DAEMON=1`, daemon running | {step['with_ms']:.3f} | {step['cpu_with_ms']:.3f} |",
            f"| without `KINETO_USE_DAEMON` | {step['without_ms']:.3f} | {step['cpu_without_ms']:.3f} |",
            f"| ratio: median of per-pair ratios (interquartile range) | {step['ratio']:.4f} "
            f"({step['ratio_q1']:.4f}-{step['ratio_q3']:.4f}) "
            f"| {step['cpu_ratio']:.4f} ({step['cpu_ratio_q1']:.4f}-{step['cpu_ratio_q3']:.4f}) |",
            "",
            f"A/B step overhead: {over:+.2f} % wall, {over_cpu:+.2f} % training-thread CPU; the "
            "interquartile ranges show the run-to-run noise of this machine, larger than the effect.",
            "",
            f"Measured directly: the optimizer post-hook that `KINETO_USE_DAEMON=1` installs (torch's "
            f"`_optimizer_post_hook` -> `KinetoStepTracker.increment_step` -> `_kineto_step()`) costs "
            f"{step['hook_us']:.2f} us per step = **{step['hook_pct']:.3f} %** of this "
            f"{step['cpu_without_ms']:.2f} ms step (target < 0.5 %: "
            f"{'met' if step['hook_pct'] < 0.5 else 'MISSED'}); the poll thread adds one IPC round trip "
            "every 5 s on its own thread.",
        ]
    return "\n".join(lines)


BEGIN, END = "<!-- bench_daemon:begin -->", "<!-- bench_daemon:end -->"


def update_docs(text: str) -> None:
    path = REPO / "docs" / "performance.md"
    block = f"{BEGIN}\n{text}\n{END}"
    doc = path.read_text() if path.exists() else "# Performance\n"
    if BEGIN in doc and END in doc:
        doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: block, doc, flags=re.S)
    else:
        doc = doc.rstrip() + "\n\n## Daemon\n\n" + block + "\n"
    path.write_text(doc)
    print(f"updated {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the benchmark)")
    ap.add_argument("--no-steps", action="store_true", help="skip the torch step-time part")
    ap.add_argument("--pairs", type=int, default=40, help="with/without block pairs for the step time")
    ap.add_argument("--block", type=float, default=0.5, help="seconds of training per block")
    ap.add_argument(
        "--update-docs", action="store_true", help="rewrite the Daemon figures in docs/performance.md"
    )
    ap.add_argument(
        "--daemon-nice", type=int, default=0, help="run the daemon at this nice value (e.g. -5, as root)"
    )
    args = ap.parse_args()
    global DAEMON_NICE
    DAEMON_NICE = args.daemon_nice
    cmd = "python " + " ".join([os.path.relpath(__file__, REPO), *sys.argv[1:]]).replace(" --update-docs", "")
    print("IPC (256 clients):", flush=True)
    ipc, counters = ipc_benchmark(args.quick)
    step = None
    if not args.no_steps:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch not installed: skipping the step-time part")
        else:
            print("training step time:", flush=True)
            step = step_benchmark(4 if args.quick else args.pairs, args.block)
    text = report(ipc, counters, step, cmd)
    print()
    print(text)
    if args.update_docs:
        update_docs(text)


if __name__ == "__main__":
    main()
