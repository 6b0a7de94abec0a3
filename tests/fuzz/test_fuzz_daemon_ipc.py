"""Fuzzing the IPC fabric: the datagram parsers (pure) and a live daemon's IPC loop.

Inputs: random bytes, and mutations (bit flips, byte edits, inserted/deleted ranges,
truncation, hostile size/count/type fields) of valid "req" and "ctxt" datagrams, among them
the 80-byte datagram captured from torch (docs/protocol.md §1.2). Properties: the parsers raise nothing
but FrameError; the live loop survives every batch and still answers a valid poll at once.
"""

from __future__ import annotations

import random
import struct

from hypothesis import given
from hypothesis import strategies as st

from kinetoscope.protocol import wire
from tests.daemon.daemon_helpers import IpcClient

from . import fuzz_settings

CAPTURED_REQ = bytes.fromhex(
    "2800000000000000" "7265710000000000" + "00" * 24
    + "0300000006000000" "9210000000000000" "ba640000b8640000" "b2640000b1640000" "890a0000880a0000"
)  # fmt: skip
SEEDS = [
    CAPTURED_REQ,
    wire.pack_request(3, 0, [4242]),
    wire.pack_request(2, -1, list(range(1, 12))),
    wire.pack_context(0, 4242, 7),
    wire.pack_datagram(b"req", b""),
]
INTERESTING_U64 = [0, 1, 15, 16, 40, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
INTERESTING_I32 = [-(2**31), -1, 0, 1, 11, 64, 65, 2**31 - 1]


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """One to four random edits of ``data`` (a libFuzzer-like mutator, driven by ``rnd``)."""
    buf = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(9)
        if op == 0 and buf:
            i = rnd.randrange(len(buf))
            buf[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and buf:
            buf[rnd.randrange(len(buf))] = rnd.randrange(256)
        elif op == 2:
            i = rnd.randrange(len(buf) + 1)
            buf[i:i] = rnd.randbytes(rnd.randint(1, 32))
        elif op == 3 and buf:
            i = rnd.randrange(len(buf))
            del buf[i : i + rnd.randint(1, 16)]
        elif op == 4:
            del buf[rnd.randrange(len(buf) + 1) :]
        elif op == 5 and len(buf) >= 8:
            buf[0:8] = struct.pack("=Q", rnd.choice(INTERESTING_U64 + [max(0, len(buf) - 40)]))
        elif op == 6 and len(buf) >= 40:
            tag = rnd.choice([b"req", b"ctxt", b"reqX", b"ctx", b"", rnd.randbytes(32), b"req\0junk"])
            buf[8:40] = tag[:32].ljust(32, b"\0")
        elif op == 7 and len(buf) >= 48:
            buf[44:48] = struct.pack("=i", rnd.choice(INTERESTING_I32))  # req: pid count n
        else:
            i = rnd.randrange(len(buf) + 1)
            buf[i:i] = buf[: rnd.randint(0, len(buf))]  # duplicate a prefix
    return bytes(buf)


hostile_datagrams = st.one_of(
    st.binary(max_size=600),
    st.builds(mutate, st.sampled_from(SEEDS), st.randoms(use_true_random=False)),
)


def _parse(data: bytes) -> None:
    msg_type, payload = wire.unpack_datagram(data)
    if msg_type[:3] == b"req":
        req = wire.parse_request(payload)
        assert len(req.pids) <= wire.MAX_PIDS
    elif msg_type[:4] == b"ctxt":
        wire.parse_context(payload)


@fuzz_settings(2000)
@given(hostile_datagrams)
def test_parsers_raise_only_frame_error(fuzz_counts, data):
    fuzz_counts["ipc: datagram parser"] += 1
    try:
        _parse(data)
    except wire.FrameError:
        pass


@fuzz_settings(150)
@given(st.lists(hostile_datagrams, min_size=1, max_size=12))
def test_live_ipc_loop_survives_and_keeps_answering(live_daemon, fuzz_counts, batch):
    addr = live_daemon.ipc.endpoint.address
    sockdir = live_daemon.ipc.endpoint.socket_dir
    attacker, rank = IpcClient(addr, sockdir), IpcClient(addr, sockdir)
    try:
        for data in batch:
            attacker.send(data)
        fuzz_counts["ipc: live daemon datagrams"] += len(batch)
        # the rank's poll is queued behind the whole batch: its answer proves the loop survived
        assert rank.poll([77], timeout=10.0) == ""
    finally:
        attacker.close()
        rank.close()
    assert live_daemon.ipc._loop_thread._thread.is_alive()
