"""Fuzzing path confinement on a real directory tree with hostile symlinks.

The tree: ``root/`` with a directory, a file, a symlink to a directory inside the root, one to
a directory outside it, one to ``/``, a dangling one and a symlink loop; ``outside/`` beside
it. Paths are built from those names plus ``..``, ``.``, empty components, ``=``, ``#``,
blanks and control characters, prefixed by the root, its resolved form, or something else.
Properties: whatever ``confine`` accepts resolves inside the root through no symlink and fits a
Kineto config line; creating it (``ensure_dir_under``) and writing a file in it
(``write_file_under``) never touch anything outside the root.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinetoscope.daemon.paths import PathRefused, confine, ensure_dir_under, write_file_under

from . import fuzz_settings

COMPONENTS = [
    "d",
    "f",
    "in_link",
    "out_link",
    "slash_link",
    "dangling",
    "loop",
    "new",
    "..",
    ".",
    "",
    "a=b",
    "c#d",
    " e",
    "g\n",
    "h\x0b",
    "é",
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("paths")
    # the root is reached through a symlink, as an operator may configure it
    real_root, outside = base / "real_root", base / "outside"
    (real_root / "d").mkdir(parents=True)
    (real_root / "f").write_text("x")
    outside.mkdir()
    os.symlink(real_root / "d", real_root / "in_link")
    os.symlink(outside, real_root / "out_link")
    os.symlink("/", real_root / "slash_link")
    os.symlink(base / "missing", real_root / "dangling")
    os.symlink(real_root / "loop", real_root / "loop")
    os.symlink(real_root, base / "root")
    return str(base / "root"), str(real_root), str(outside)


def _snapshot(path: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(path) for n in dirs + files)


paths = st.builds(
    lambda prefix, parts: prefix + "/".join(parts),
    st.sampled_from(["{root}/", "{real}/", "{root}", "{outside}/", "/", "", "{root}//", "{real}/../"]),
    st.lists(st.sampled_from(COMPONENTS), max_size=5),
)


@fuzz_settings(800)
@given(paths)
def test_accepted_paths_stay_inside_and_creation_never_escapes(tree, fuzz_counts, template):
    root, real_root, outside = tree
    path = template.format(root=root, real=real_root, outside=outside)
    fuzz_counts["paths: confinement"] += 1
    before_outside = _snapshot(outside)
    try:
        norm = confine(path, root, "path")
    except PathRefused:
        return
    fuzz_counts["paths: confinement (accepted)"] += 1
    assert not any(c in norm for c in "=#\n\r\0") and not any(ord(c) < 32 for c in norm)
    assert ".." not in path.split("/")
    real = os.path.realpath(norm)
    assert real == real_root or real.startswith(real_root + "/"), (path, real)
    rel = os.path.relpath(norm, root) if norm.startswith(root) else os.path.relpath(norm, real_root)
    probe = real_root
    for part in [] if rel == "." else rel.split("/"):
        probe = os.path.join(probe, part)
        assert not os.path.islink(probe), f"accepted {path!r} through the symlink {probe}"
    try:
        ensure_dir_under(root, norm)
        write_file_under(root, os.path.join(norm, "m.json"), b"{}")
    except (PathRefused, OSError):
        pass  # e.g. a component is the file f
    assert _snapshot(outside) == before_outside
    assert os.path.realpath(os.path.join(real_root, "slash_link")) == "/"
