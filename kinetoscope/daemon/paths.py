"""Where trace files may go: confinement to the trace root, and directory/file creation.

Why: the RPC port lets a caller choose a file path that a *traced process* (often another
user, sometimes root) will write - Kineto's own fix for that is commit 9ea826ec (docs/protocol.md §4.3) -
and the daemon itself (often root) creates directories and writes manifests there. So:

* ``confine`` refuses any ``ACTIVITIES_LOG_FILE``/output directory that is not a string, is
  relative, contains ``..``, control characters or a character that breaks a Kineto
  ``KEY=VALUE`` line (``=``, ``#``, see :func:`check_config_value`), lies outside
  ``--trace-root``, or has a component below the root that is a symbolic link. Symlinks are
  refused even when they point back inside the root: the check is then one ``lstat`` per
  component, with nothing to resolve.
* Every write *at use* walks the path again component by component from an ``O_DIRECTORY``
  descriptor of the root with ``openat(..., O_NOFOLLOW)`` (``ensure_dir_under``,
  ``write_file_under``): a symlink planted between the check and the write makes the write
  fail instead of landing outside the root.

The root itself is resolved and pinned once, at start (:class:`TraceRoot`): an ``O_DIRECTORY``
descriptor walks start from, and its identity (device, inode), checked on every request, so a
root swapped for a symlink after start is refused instead of followed (issue 32). Before that,
:func:`check_root_chain` refuses a root whose directories another user owns or may rename
entries of (whoever created ``/tmp/kinetoscope`` first must not decide where a root daemon writes).

Directories are created so that the traced processes (maybe another uid) can write into them.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterable

log = logging.getLogger("kinetoscope.daemon.paths")

# Characters that end or split a Kineto config line (AbstractConfig::parse: one KEY=VALUE per
# line, '#' starts a comment, a second '=' aborts parsing - and Kineto then writes to its
# default /tmp path, outside the root).
_CONFIG_BREAKERS = frozenset("\n\r=#\0")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefused(ValueError):
    """A path outside the trace root (message says why, for the RPC error response)."""


def check_config_value(value: str, what: str) -> None:
    """Refuse a value that cannot sit in one Kineto ``KEY=VALUE`` line unchanged.

    Refused: empty, control characters (newline, CR, NUL, ...), ``=``, ``#``, and leading or
    trailing blanks (Kineto trims them, so the file written would not be the one checked).
    """
    if not value:
        raise PathRefused(f"{what} must not be empty")
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise PathRefused(f"{what} {value!r} contains control characters")
    bad = sorted(set(value) & _CONFIG_BREAKERS)
    if bad:
        raise PathRefused(
            f"{what} {value!r} contains {', '.join(map(repr, bad))}, which breaks a Kineto config line"
        )
    if value != value.strip(" \t"):
        raise PathRefused(f"{what} {value!r} has leading or trailing blanks (Kineto strips them)")


class TraceRoot:
    """The trace root, resolved and opened once (at daemon start) and checked on every use.

    ``path`` is the root as configured (normalised), ``real`` its resolved path then. ``fd()``
    gives a fresh descriptor of the *pinned* directory after :meth:`check` confirmed that
    ``path`` still leads to it; walks below the root start there, never at a path looked up again.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.normpath(path)
        self.real = os.path.realpath(self.path)
        self._fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(self._fd)
        self.ident = (st.st_dev, st.st_ino)

    def __str__(self) -> str:
        return self.path

    def check(self) -> None:
        """Raise PathRefused when ``path`` no longer leads to the pinned directory."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise PathRefused(
                f"the trace root {self.path} is gone since the daemon started ({exc.strerror}); restart the daemon"
            ) from None
        if (st.st_dev, st.st_ino) != self.ident:
            raise PathRefused(
                f"the trace root {self.path} changed since the daemon started (it now leads to another "
                "directory, e.g. it was replaced by a symlink); refusing to write there - restart the daemon"
            )

    def fd(self) -> int:
        """A new O_DIRECTORY descriptor of the pinned root (the caller closes it)."""
        self.check()
        return os.dup(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _root_path(root: str | TraceRoot) -> str:
    return root.path if isinstance(root, TraceRoot) else root


def _root_real(root: str | TraceRoot) -> str:
    if isinstance(root, TraceRoot):
        root.check()
        return root.real
    return os.path.realpath(root)


def _root_fd(root: str | TraceRoot) -> int:
    if isinstance(root, TraceRoot):
        return root.fd()
    return os.open(os.path.realpath(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _trusted_uids() -> set[int]:
    return {0, os.geteuid()}


def check_root_chain(path: str) -> None:
    """Refuse a trace root that another user controls: every existing directory on its path
    (as configured and as resolved), the root and any symlink on the way must be owned by root
    or by the daemon's user, and no directory above the root may be writable by others without
    the sticky bit (``/tmp`` is fine: others cannot rename what they do not own there).

    Raises PathRefused naming the directory, its owner or mode, and what to do."""
    trusted = _trusted_uids()
    seen: set[str] = set()
    for chain in (os.path.normpath(path), os.path.realpath(path)):
        parts = chain.strip("/").split("/") if chain != "/" else []
        probes = ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        for i, probe in enumerate(probes):
            if probe in seen:
                continue
            seen.add(probe)
            try:
                st = os.lstat(probe)
            except FileNotFoundError:
                break
            except OSError as exc:
                raise PathRefused(f"trace root {path}: cannot inspect {probe}: {exc.strerror}") from None
            if st.st_uid not in trusted:
                raise PathRefused(
                    f"trace root {path}: {probe} is owned by uid {st.st_uid}, not by root or this daemon's "
                    f"user (uid {os.geteuid()}): its owner decides where the daemon writes. Remove it, or "
                    "choose a --trace-root whose directories root (or you) own"
                )
            above = i < len(probes) - 1
            if above and stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
                raise PathRefused(
                    f"trace root {path}: {probe} is writable by every user (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}, no sticky bit): anyone could replace the directories "
                    "below it. Fix its mode, or choose another --trace-root"
                )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def relative_parts(path: str, root: str | TraceRoot) -> list[str]:
    """The components of normalised ``path`` below ``root`` (given as configured or resolved)."""
    for prefix in dict.fromkeys((_root_path(root), _root_real(root))):
        if _inside(path, prefix):
            rest = path[len(prefix.rstrip("/")) :].strip("/")
            return rest.split("/") if rest else []
    raise PathRefused(f"{path!r} is outside the daemon's trace root {root} (see --trace-root)")


def confine(path: object, root: str | TraceRoot, what: str = "path") -> str:
    """``path`` normalised, if it lies under ``root`` (an absolute, normalised directory).

    Raises PathRefused when it is not a string, is relative, contains ``..``, control
    characters or config-breaking characters, is outside ``root``, or one of its existing
    components below ``root`` is a symlink or not a directory.
    """
    if not isinstance(path, str) or not path:
        raise PathRefused(f"{what} must be a non-empty string")
    check_config_value(path, what)
    if not path.startswith("/"):
        raise PathRefused(
            f"{what} {path!r} is not absolute (Kineto would resolve it in the traced process's cwd)"
        )
    if ".." in path.split("/"):
        raise PathRefused(f"{what} {path!r} contains '..'")
    norm = os.path.normpath(path)
    if isinstance(root, TraceRoot):
        root.check()  # a root replaced since start: say so, not "outside the root"
    try:
        parts = relative_parts(norm, root)
    except PathRefused:
        raise PathRefused(
            f"{what} {path!r} is outside the daemon's trace root {_root_path(root)} (see --trace-root)"
        ) from None
    probe = _root_real(root)
    for i, name in enumerate(parts):
        probe = os.path.join(probe, name)
        try:
            st = os.lstat(probe)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise PathRefused(f"{what} {path!r}: cannot inspect {probe}: {exc.strerror}") from None
        if os.path.islink(probe):
            raise PathRefused(
                f"{what} {path!r} goes through the symlink {probe} (symlinks under the trace root are not followed)"
            )
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise PathRefused(f"{what} {path!r}: {probe} is not a directory")
    return norm


def _check_name(name: str, path: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise PathRefused(f"{path!r}: bad path component {name!r}")


def _is_link(parent_fd: int, name: str) -> bool:
    try:
        os.readlink(name, dir_fd=parent_fd)
    except OSError:
        return False
    return True


def _open_child(parent_fd: int, name: str, path: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(
            parent_fd, name
        ):  # O_NOFOLLOW met a symlink
            raise PathRefused(
                f"{path!r}: {name!r} is a symlink (symlinks under the trace root are not followed)"
            ) from None
        raise


def open_dir_under(
    root: str | TraceRoot, path: str, *, create: bool = False, writer_uids: Iterable[int | None] = ()
) -> tuple[int, list[str]]:
    """Open (and with ``create`` make) directory ``path`` below ``root`` without following
    any symlink below the root. Returns (an O_DIRECTORY fd the caller closes, dirs created).

    Parents created on the way are 0755; a created leaf is given to the traced processes
    (``writer_uids``) as :func:`ensure_dir` describes. Raises PathRefused or OSError.
    """
    parts = relative_parts(os.path.normpath(path), root)
    fd = _root_fd(root)
    created: list[str] = []
    here = _root_path(root).rstrip("/")
    try:
        for i, name in enumerate(parts):
            _check_name(name, path)
            here = f"{here}/{name}"
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    created.append(here)
                except FileExistsError:
                    pass
            child = _open_child(fd, name, path)
            os.close(fd)
            fd = child
            if created and created[-1] == here:
                os.fchmod(fd, 0o755)  # independent of the daemon's umask
                if i == len(parts) - 1:
                    _grant(fd, here, set(writer_uids))
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def ensure_dir_under(root: str | TraceRoot, path: str, writer_uids: Iterable[int | None] = ()) -> list[str]:
    """Create directory ``path`` below ``root`` (no symlinks followed); return those created."""
    fd, created = open_dir_under(root, path, create=True, writer_uids=writer_uids)
    os.close(fd)
    return created


def write_file_under(root: str | TraceRoot, path: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``path`` (below ``root``) atomically: a fresh temporary file created with
    ``O_EXCL|O_NOFOLLOW`` in the directory's fd, then renamed over the final name (rename
    replaces a symlink planted there; it never writes through it). Raises PathRefused/OSError.
    """
    directory, name = os.path.split(os.path.normpath(path))
    _check_name(name, path)
    dir_fd, _ = open_dir_under(root, directory)
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
        )
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    finally:
        os.close(dir_fd)


def ensure_dir(path: str, writer_uids: Iterable[int | None] = ()) -> list[str]:
    """Create ``path`` (and missing parents); return the directories created.

    For the trace root itself (chosen by the operator, so symlinks are allowed); paths below
    it go through :func:`ensure_dir_under`. Created directories are made usable by the traced
    processes (``writer_uids``; None = unknown): if they all run as the daemon's user nothing
    changes; if the daemon is root and they share one uid, the leaf directory is given to that
    uid; otherwise the leaf becomes world-writable with the sticky bit (like /tmp). Parents
    created on the way are 0755.
    """
    missing = []
    probe = path
    while not os.path.isdir(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    created = []
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            continue
        os.chmod(d, 0o755)  # independent of the daemon's umask
        created.append(d)
    if path in created:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _grant(fd, path, set(writer_uids))
        finally:
            os.close(fd)
    return created


def _grant(fd: int, path: str, uids: set[int | None]) -> None:
    me = os.geteuid()
    foreign = {u for u in uids if u != me}
    if not foreign:
        return
    known = {u for u in foreign if u is not None}
    if me == 0 and None not in foreign and len(known) == 1:
        uid = known.pop()
        try:
            os.fchown(fd, uid, -1)
            return
        except OSError as exc:  # pragma: no cover - e.g. a root-squashed NFS trace root
            log.warning("cannot chown %s to uid %d (%s); making it world-writable", path, uid, exc)
    os.fchmod(fd, 0o1777)
