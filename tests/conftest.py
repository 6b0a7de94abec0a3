"""Shared fixtures. Real traces come from HTA's test corpus, vendored in tests/data/traces
(MIT licence, byte for byte; see tests/data/traces/README.md and MANIFEST.tsv)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Hypothesis profiles (docs/trace-loading.md, "Property tests and fuzzing"). CI must be
# reproducible: ``ci`` (the default) derandomizes, so every run tries the same examples, keeps
# no example database and prints the blob that replays a failure. ``slow`` and ``fuzz`` search
# more widely with random seeds: ``HYPOTHESIS_PROFILE=slow pytest tests/trace/test_properties.py``.
# A test's own ``@settings(max_examples=...)`` still wins over the profile's count.
HYPOTHESIS_PROFILES = {
    "ci": {"derandomize": True, "max_examples": 60, "database": None},
    "slow": {"max_examples": 1000},
    "fuzz": {"max_examples": 5000},
}
try:
    from hypothesis import settings as _hyp_settings
except ImportError:  # pragma: no cover - the test extras are not installed
    pass
else:
    for _name, _opts in HYPOTHESIS_PROFILES.items():
        _hyp_settings.register_profile(_name, deadline=None, print_blob=True, **_opts)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Fixtures shared across test folders (tests/fixtures_*.py).
pytest_plugins = ["tests.fixtures_s3"]

REPO_ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = Path(os.environ.get("KSCOPE_TEST_TRACES", REPO_ROOT / "tests" / "data" / "traces"))
HTA_TRACES = TRACES_DIR / "hta"


_OWN_CACHE_DIR: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Keep the trace cache of the whole run (subprocesses included) out of the user's
    ~/.cache: one throwaway folder per run unless KSCOPE_CACHE_DIR is set already."""
    if "KSCOPE_CACHE_DIR" not in os.environ:
        os.environ["KSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="kscope-test-cache-")
        _OWN_CACHE_DIR.append(os.environ["KSCOPE_CACHE_DIR"])


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's own cache folder: left behind, every run would leave ~100 MB in /tmp
    (a CI machine's disk is shared and finite)."""
    for folder in _OWN_CACHE_DIR:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def hta_traces() -> Path:
    """Folder of the real HTA test traces (read-only: copy before writing beside them)."""
    assert HTA_TRACES.is_dir(), f"vendored traces missing at {HTA_TRACES}"
    return HTA_TRACES


@pytest.fixture()
def trace_copy(tmp_path: Path):
    """Copy one vendored trace (path relative to tests/data/traces/hta) into a temp dir."""

    def _copy(rel: str) -> Path:
        src = HTA_TRACES / rel
        dst = tmp_path / Path(rel).name
        shutil.copyfile(src, dst)
        return dst

    return _copy
