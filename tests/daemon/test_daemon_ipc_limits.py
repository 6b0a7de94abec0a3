"""Issue 16 item 7 (daemon parts): what an IPC client can make the daemon keep or log is
bounded. "ctxt" registrations are capped and expire unless their pid still polls; invented
poll keys are capped; per-process INFO lines are rate-limited. Real daemon, real datagrams."""

from __future__ import annotations

import logging
import time

from daemon_helpers import IpcClient

from kinetoscope.daemon.registry import MAX_CONTEXTS, REGISTER_LOG_BURST, Registry
from kinetoscope.protocol import wire


def _wait(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _send_contexts(c: IpcClient, pids, job: int = 0, gpu: int = 0) -> None:
    for pid in pids:
        c.send(wire.pack_context(gpu, pid, job))
        c.recv(timeout=5.0)  # the reply (keeps the client's queue short)


def test_ctxt_registrations_are_capped(daemon, clients):
    c = clients()
    n = MAX_CONTEXTS + 500
    _send_contexts(c, range(1, n + 1))
    _wait(lambda: daemon.ipc.stats.contexts >= n, "every ctxt datagram served")
    assert daemon.registry.context_count() == MAX_CONTEXTS
    c.send(wire.pack_context(0, n + 1, 0))
    _t, payload = c.recv(timeout=5.0)
    assert int.from_bytes(payload, "little", signed=True) == MAX_CONTEXTS  # the count stays bounded too


def test_ctxt_of_pids_that_do_not_poll_expire_although_their_job_is_live(make_daemon, sockdir):
    d = make_daemon(gc_timeout_s=0.5)
    ranks = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        assert ranks.poll([9100]) == ""  # job 0 stays live: 9100 keeps polling
        _send_contexts(ranks, [9100, 5001, 5002, 5003])
        assert d.registry.context_count() == 4

        def expired() -> bool:
            ranks.poll([9100])
            return d.registry.context_count() == 1

        _wait(expired, "contexts of pids that never poll to expire")
        assert d.registry.register_context(0, 0, 9100) == 1  # the live rank's context was kept
    finally:
        ranks.close()


def test_invented_poll_keys_are_capped_least_recently_polled_first():
    reg = Registry(info_reader=lambda pid, sender: None, max_processes=10)
    for pid in range(1, 21):
        reg.poll(0, (pid,), 3)
    reg.poll(0, (11,), 3)  # a recent poll keeps a process
    reg.poll(0, (21,), 3)
    assert len(reg) == 10 and reg.evicted == 11
    assert sorted(p.pid for p, _ in reg.snapshot()) == [11, *range(13, 22)]


def test_unique_key_polls_do_not_flood_the_log(make_daemon, sockdir, caplog):
    n = REGISTER_LOG_BURST + 1000
    d = make_daemon(gc_timeout_s=1.0, max_processes_per_uid=n)  # all from this test's uid
    c = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        with caplog.at_level(logging.INFO, logger="kinetoscope"):
            for pid in range(100_000, 100_000 + n):
                assert c.poll([pid], timeout=5.0) == ""
            _wait(lambda: len(d.registry) == 0, "the GC to forget every invented process")
    finally:
        c.close()
    registered = [r for r in caplog.records if "registered process" in r.getMessage()]
    forgotten = [r for r in caplog.records if "stopped polling" in r.getMessage()]
    # the rest are counted, not written (a second window only if this ran over a minute)
    assert REGISTER_LOG_BURST <= len(registered) <= 2 * REGISTER_LOG_BURST
    assert 1 <= len(forgotten) <= n // 20  # one line per GC round, not one per process
    assert d.ipc.stats.gc_removed == n
