"""A real multi-node Ray cluster on this machine: a head and one more node, each a separate
``ray start`` (own raylet, own object store, ``--num-cpus 1``, a small store), the driver joining
by address as it would join a cluster on other hosts. The analysis runs there and equals the
reference document; tasks land on both nodes (six each: the executor places them round-robin
with a soft node affinity, ``RayExecutor``); a task lost with its worker is resubmitted on the
other node; a node killed while it runs a task costs retries, not the document. The kill is
deterministic: a watcher kills the second node as soon as a map task runs there (its worker's
process title is ``ray::map_rank``), never after a sleep.

Slow (two Ray nodes start in 20-200 s on a loaded 2-core box): generous timeouts, and a cluster
that cannot start here is a skip that says why. Teardown ends the processes of this cluster
only (its process groups, then any process naming its private temp dir), never with a global
``ray stop``, which would also stop other users' Ray on a shared machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from kinetoscope.scale import AnalyzeRequest, run_analysis
from tests.scale.conftest import PAIR, write_ranks
from tests.scale.test_equivalence import analyze_paths, assert_same_document

# Run in a fresh interpreter by test_ray_cluster_process.py: Ray reads its auth mode once per
# process, and a local Ray started earlier in the suite sets RAY_AUTH_MODE=token; a driver in
# token mode loses every task it places on this cluster's second node (auth disabled) with
# OwnerDiedError, seen in clean CI runs. A fresh process, as a `kscope analyze` command is.
CHILD_ENV = "KSCOPE_RAY_CLUSTER_CHILD"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get(CHILD_ENV) != "1",
        reason="run in a fresh interpreter by tests/scale/test_ray_cluster_process.py",
    ),
]
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kinetoscope[scale]')")

START_TIMEOUT_S = 420
STORE_BYTES = 100 * 1024 * 1024  # small object stores: results are small
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",  # a token in ~/.ray would turn auth on for this private cluster
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_agent_register_timeout_ms": "300000",
        "RAY_raylet_start_wait_time_s": "300",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }


@dataclass
class Cluster:
    temp_dir: Path
    port: int
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)  # every `ray start`, live or not
    head: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_node(self, *args: str) -> subprocess.Popen[bytes]:
        ray_bin = Path(sys.executable).with_name("ray")
        log = open(self.temp_dir.with_suffix(f".{len(self.nodes)}.log"), "wb")  # noqa: SIM115 - the node outlives this call
        p = subprocess.Popen(
            [
                str(ray_bin),
                "start",
                "--block",
                "--num-cpus",
                "1",
                "--object-store-memory",
                str(STORE_BYTES),
                "--disable-usage-stats",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
        self.nodes.append(p)
        return p

    def started(self, i: int) -> bool:
        """``ray start`` of node ``i`` said its runtime is up."""
        log = self.temp_dir.with_suffix(f".{i}.log")
        return log.exists() and b"Ray runtime started" in log.read_bytes()

    def alive_nodes(self) -> list[dict[str, Any]]:
        return [n for n in ray.nodes() if n["Alive"]]

    def kill_node(self, p: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """``sig`` to the node's process group and to every process below it (a worker may
        have left the group), as a lost host would end them all at once."""
        tree = _tree(p.pid)
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        for proc in tree:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    def stop(self) -> None:
        for p in self.nodes:
            self.kill_node(p, signal.SIGTERM)
        deadline = time.monotonic() + 10  # then SIGKILL (a SIGTERMed head takes ~30 s to stop)
        for p in self.nodes:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.kill_node(p)
        _kill_naming(str(self.temp_dir))
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        for i in range(len(self.nodes)):
            self.temp_dir.with_suffix(f".{i}.log").unlink(missing_ok=True)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def node_id(p: subprocess.Popen[bytes]) -> str:
    """The Ray node id of the node ``ray start`` process ``p`` runs (its raylet's ``--node_id``)."""
    for proc in _tree(p.pid):
        try:
            args = proc.cmdline()
        except psutil.Error:
            continue
        for a in args:
            if a.startswith("--node_id="):
                return a.partition("=")[2]
    raise AssertionError(f"no raylet below ray start pid {p.pid}")


def running_task(p: subprocess.Popen[bytes], name: str) -> bool:
    """A worker of node ``p`` is running task ``name`` (Ray titles it ``ray::<name>`` meanwhile)."""
    for proc in _tree(p.pid):
        try:
            if " ".join(proc.cmdline()).startswith(f"ray::{name}"):
                return True
        except psutil.Error:
            continue
    return False


def _kill_naming(marker: str) -> None:
    """SIGKILL every process whose command line or environment names ``marker`` (this
    cluster's private temp dir): Ray's agents can outlive their node's process group."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            blob = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_for(cond: Any, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if cond():
            return
        if any(p.poll() is not None for p in cluster.nodes):
            break
        time.sleep(2)
    logs = " | ".join(
        cluster.temp_dir.with_suffix(f".{i}.log").read_text(errors="replace")[-300:]
        for i in range(len(cluster.nodes))
    )
    pytest.skip(f"a two-node Ray cluster could not start on this machine ({what}): {logs}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # a short private dir: Ray's socket paths must stay under 108 bytes
    c = Cluster(Path(f"/tmp/kray-{os.getpid()}"), _free_port())
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the driver too (see _env)
    try:
        # a raylet gives its agents ~15 s to start, which a loaded box can miss: a node whose
        # `ray start` died is started again (a new session), a few times
        head = [
            "--head",
            "--port",
            str(c.port),
            "--include-dashboard",
            "false",
            "--temp-dir",
            str(c.temp_dir),
        ]
        c.head = _start_with_retries(c, head, "head")
        c.worker = _start_with_retries(c, ["--address", c.address], "second node")
        _wait_for(lambda: _two_nodes(c), "both nodes registered and schedulable", c)
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def _start_with_retries(c: Cluster, args: list[str], what: str, attempts: int = 3) -> subprocess.Popen[bytes]:
    """Start a node and wait until its ``ray start`` says it is up; skip (with its log) after
    ``attempts`` deaths or timeouts."""
    for _ in range(attempts):
        p = c.start_node(*args)
        i = len(c.nodes) - 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and p.poll() is None and not c.started(i):
            time.sleep(2)
        if c.started(i) and p.poll() is None:
            return p
        c.kill_node(p)
    log = c.temp_dir.with_suffix(f".{len(c.nodes) - 1}.log").read_text(errors="replace")[-300:]
    pytest.skip(f"a two-node Ray cluster could not start on this machine ({what}, {attempts} tries): {log}")


def _two_nodes(c: Cluster) -> bool:
    """Join, check both nodes are alive *and schedulable*, leave (the test joins again through
    the executor). A node is listed alive before the head's scheduler holds its resources; a task
    placed there with a soft affinity meanwhile runs elsewhere (a clean CI run: all twelve on the
    head), so a task pinned to the second node (hard affinity) must run there first."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tests.scale.ray_tasks import node_of

    try:
        ray.init(address=c.address, log_to_driver=False)
    except Exception:  # noqa: BLE001 - not ready yet: the caller polls until its deadline
        ray.shutdown()
        return False
    try:
        if len(c.alive_nodes()) < 2 or c.worker is None:
            return False
        second = node_id(c.worker)
        pinned = NodeAffinitySchedulingStrategy(second, soft=False)
        probe = ray.remote(num_cpus=1)(node_of).options(scheduling_strategy=pinned)
        return bool(ray.get(probe.remote(), timeout=120) == second)
    except Exception:  # noqa: BLE001 - not schedulable yet (unschedulable, timeout): poll again
        return False
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ranks12(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_ranks(tmp_path_factory.mktemp("ranks12"), PAIR, 12)


@pytest.fixture(scope="module")
def reference(ranks12: list[Path]) -> dict[str, Any]:
    """The single-process document of the 12 ranks (module docstring of test_equivalence)."""
    return analyze_paths(ranks12)


def _nodes_used(run: Any) -> Counter[str]:
    """Ranks per Ray node id, from where each rank's map task ran (``host:pid@node``)."""
    return Counter(w.rpartition("@")[2] for w in run.workers.values())


def test_tasks_land_on_both_nodes_and_the_document_is_the_reference(
    cluster: Cluster, ranks12: list[Path], reference: dict[str, Any]
) -> None:
    assert cluster.head is not None and cluster.worker is not None
    head, second = node_id(cluster.head), node_id(cluster.worker)
    req = AnalyzeRequest(backend="auto", ray_address=cluster.address, cache=False)
    said: list[str] = []
    run = run_analysis(req, ranks12, on_backend=lambda b, why, n: said.append(f"{b}: {why}"))
    assert said == [
        f"ray: a Ray cluster is given (--ray-address {cluster.address}); 12 tasks round-robin over "
        f"2 Ray nodes: {head[:8]} (this node) 6, {second[:8]} 6"
    ]
    # soft node affinity: a task waits for its node while that node is alive, so the placement
    # is exact (SPREAD once put all twelve on the head)
    assert _nodes_used(run) == {head: 6, second: 6}, run.workers
    assert run.notes == [] and run.load_errors == {}
    assert_same_document(reference, run.document)


def _calls(folder: Path) -> list[str]:
    """The node ids of the calls ``ray_tasks`` recorded in ``folder``, in call order."""
    return [
        f.name.partition("-")[2]
        for f in sorted(folder.iterdir(), key=lambda f: int(f.name.partition("-")[0]))
    ]


def test_a_task_lost_with_its_worker_is_resubmitted_on_the_other_node(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's own retries are turned off so that the first crash is kinetoscope's to handle: the
    task goes to the other node; one lost on every try is an error after ``RAY_RESUBMITS``; an
    error of the function itself is not rerun at all."""
    from kinetoscope.scale import executors
    from tests.scale import ray_tasks

    assert cluster.head is not None and cluster.worker is not None
    head, second = node_id(cluster.head), node_id(cluster.worker)
    monkeypatch.setattr(executors, "RAY_TASK_RETRIES", 0)
    once, always, bad = (tmp_path / n for n in ("once", "always", "bad"))
    for d in (once, always, bad):
        d.mkdir()
    ex = executors.RayExecutor(cluster.address)
    try:
        (out,) = ex.map_unordered(ray_tasks.crash_first, [(str(once), 1)])
        (lost,) = ex.map_unordered(ray_tasks.crash_first, [(str(always), 99)])
        (failed,) = ex.map_unordered(ray_tasks.fail, [str(bad)])
    finally:
        ex.close()
    assert out.error is None and out.value == second
    assert _calls(once) == [head, second]  # placed on the head (slot 0), resubmitted on the other
    assert lost.value is None and "WorkerCrashedError" in str(lost.error)
    assert len(_calls(always)) == 1 + executors.RAY_RESUBMITS
    assert failed.value is None and "ValueError: a bad input" in str(failed.error)
    assert len(_calls(bad)) == 1
    assert ex.notes == [
        "1 Ray task(s) lost (WorkerCrashedError x1) and resubmitted on another alive node",
        f"{executors.RAY_RESUBMITS} Ray task(s) lost (WorkerCrashedError x{executors.RAY_RESUBMITS}) "
        "and resubmitted on another alive node",
    ]


def _kill_when_running(
    cluster: Cluster, node: subprocess.Popen[bytes], stop: threading.Event, killed: list[str]
) -> None:
    """Kill ``node`` as soon as one of its workers runs a map task (polled every 0.1 s)."""
    while not stop.wait(0.1):
        if running_task(node, "map_rank"):
            cluster.kill_node(node)
            killed.append("killed while running map_rank")
            return


def test_a_node_killed_mid_run_costs_retries_not_the_document(
    cluster: Cluster, ranks12: list[Path], reference: dict[str, Any]
) -> None:
    assert cluster.head is not None and cluster.worker is not None
    head, second = node_id(cluster.head), node_id(cluster.worker)
    worker_node = cluster.worker
    stop = threading.Event()
    killed: list[str] = []
    watcher = threading.Thread(
        target=_kill_when_running, args=(cluster, worker_node, stop, killed), daemon=True
    )
    watcher.start()
    try:
        req = AnalyzeRequest(backend="ray", ray_address=cluster.address, cache=False)
        run = run_analysis(req, ranks12)
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert killed and worker_node.wait(timeout=120) is not None
    used = _nodes_used(run)
    # six tasks were placed on the second node; it died running its first: that one and the
    # ones queued behind it ran again on the head
    assert set(used) <= {head, second} and sum(used.values()) == 12, run.workers
    assert used[head] > 6, run.workers
    assert run.load_errors == {}
    assert_same_document(reference, run.document)
