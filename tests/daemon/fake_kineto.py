"""A stand-in for a libkineto process, speaking the real IPC protocol (no torch needed).

It computes its pid chain and job id like kineto (self first, then ancestors via
/proc/<pid>/stat, at most 11, stopping before pid 1; job id = numeric prefix of SLURM_JOB_ID),
polls the daemon every ``--period`` seconds, and when it receives a config it "traces" like
Kineto: writes ``<ACTIVITIES_LOG_FILE with _<pid>>.tmp`` and renames it to the final name.
With ``--children N`` it first spawns N copies of itself (RANK=i), like torchrun's agent.

Usage: python fake_kineto.py SOCKET_DIR [--period S] [--lifetime S] [--children N] [--stay]
Prints "READY <pid>" once registered, "TRACED <path>" after each trace.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.environ.get("KSCOPE_REPO", os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))

from kinetoscope.protocol import wire  # noqa: E402
from kinetoscope.protocol.kineto_config import kineto_output_path  # noqa: E402


def pid_chain() -> list[int]:
    pids = [os.getpid()]
    while len(pids) < 11:
        with open(f"/proc/{pids[-1]}/stat", "rb") as f:
            data = f.read()
        ppid = int(data[data.rindex(b")") + 2 :].split()[1])
        if ppid <= 1:
            break
        pids.append(ppid)
    return pids


def job_id() -> int:
    m = re.match(r"\s*([+-]?\d+)", os.environ.get("SLURM_JOB_ID", ""))
    return int(m.group(1)) if m else 0


def sync_send(sock: socket.socket, datagram: bytes, addr: str, retries: int = 10) -> bool:
    """Send like kineto's ``FabricManager::sync_send``: non-blocking, and on a full daemon queue
    (EAGAIN) or a refused connection sleep 10, 20, 40 ... ms and retry; any other error fails
    at once. A failed send only skips this poll: the client never dies of a busy daemon."""
    sleep_s = 0.01
    for _ in range(retries):
        try:
            sock.sendto(datagram, addr)
            return True
        except (BlockingIOError, ConnectionRefusedError):
            time.sleep(sleep_s)
            sleep_s *= 2
        except OSError:
            return False
    return False


def poll_recv(sock: socket.socket, tries: int = 9) -> bytes | None:
    """kineto's ``poll_recv(9, 10000)``: up to 9 non-blocking receives 10 ms apart (~90 ms)."""
    for _ in range(tries):
        try:
            return sock.recv(65536)
        except BlockingIOError:
            time.sleep(0.01)
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("socket_dir")
    ap.add_argument("--period", type=float, default=0.1)
    ap.add_argument("--lifetime", type=float, default=30.0)
    ap.add_argument("--children", type=int, default=0)
    ap.add_argument("--stay", action="store_true", help="keep polling after a trace")
    args = ap.parse_args()

    kids = []
    for i in range(args.children):
        env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(args.children))
        kids.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    args.socket_dir,
                    "--period",
                    str(args.period),
                    "--lifetime",
                    str(args.lifetime),
                ],
                env=env,
            )
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    my_addr = os.path.join(args.socket_dir, f"dynoconfigclient{uuid.uuid4()}")
    sock.bind(my_addr)
    sock.setblocking(False)  # kineto: every send and receive is MSG_DONTWAIT
    daemon = os.path.join(args.socket_dir, "dynolog")
    pids, job = pid_chain(), job_id()
    ready = False
    deadline = time.monotonic() + args.lifetime
    try:
        while time.monotonic() < deadline:
            payload = None
            if sync_send(sock, wire.pack_request(3, job, pids), daemon):
                reply = poll_recv(sock)
                payload = None if reply is None else wire.unpack_datagram(reply)[1]
            if payload is not None and not ready:
                print(f"READY {os.getpid()}", flush=True)
                ready = True
            if payload:
                text = payload.decode()
                opts = dict(
                    (k.strip(), v.strip())
                    for k, _, v in (ln.partition("=") for ln in text.splitlines() if "=" in ln)
                )
                path = kineto_output_path(opts["ACTIVITIES_LOG_FILE"], os.getpid())
                with open(path + ".tmp", "w") as f:
                    f.write(
                        json.dumps(
                            {"schemaVersion": 1, "trace_id": opts["REQUEST_TRACE_ID"], "traceEvents": []}
                        )
                        + "\n"
                    )
                os.rename(path + ".tmp", path)
                print(f"TRACED {path}", flush=True)
                if not args.stay and not args.children:
                    break
            time.sleep(args.period)
    finally:
        sock.close()
        try:
            os.unlink(my_addr)
        except FileNotFoundError:  # the test already removed the socket directory
            pass
        for k in kids:
            k.terminate()
            k.wait()


if __name__ == "__main__":
    main()
