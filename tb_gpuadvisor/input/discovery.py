"""Finding profile sessions: ``<logdir>/<run>/plugins/profile/<session>/<host>.xplane.pb``
(TensorFlow, JAX) and ``<logdir>/<run>/<worker>[.<epoch ms>].pt.trace.json[.gz]`` (PyTorch),
or files of any other registered format (``tb_gpuadvisor.input``) in a run's folder.

A run is any folder (at any depth below the logdir) that holds ``plugins/profile``;
its name is its path relative to the logdir ("." for the logdir itself), as
TensorBoard names runs.  Only ``*.xplane.pb`` files count as captures: the
cache files XProf writes beside them are ignored.  A run of another format is any folder
holding its files, grouped into sessions as the format's adapter says (a PyTorch profiling
cycle: ``input/kineto``).  A ``.json[.gz]`` file of any other name is a capture when its first
bytes are a trace (``Adapter.sniffer``); none is sniffed in or below a folder named ``plugins``
(TensorBoard's and XProf's own files: TF's ``<host>.trace.json.gz``), nor one whose name starts
with a dot (XProf's ``.cached_tools.json``), unless the file itself is given.  Paths with a scheme
(``gs://``, ``s3://``, ``memory://``) go through fsspec when it is installed; their
listings are asked of the store on every search (never of fsspec's listing cache), and
any failure of a store (a missing backend package, credentials, network) is a
DiscoveryError with one line for the user.
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Iterator

from tb_gpuadvisor.input import Adapter, Sniffed, adapter_for, adapters, sniffer_for
from tb_gpuadvisor.input.files import Opener, remote_stamp
from tb_gpuadvisor.metadata import PROFILE_DIR, XPLANE_SUFFIX


class DiscoveryError(Exception):
    """The path given cannot be searched for captures (missing, unreadable, wrong kind)."""


class StoreError(DiscoveryError):
    """A remote location that cannot be searched at all: its fsspec backend is not installed,
    or the store failed (credentials, network).  Unlike a missing folder, waiting does not fix it."""


class UnsafePathError(ValueError):
    """A run, session or host value that would read outside the logdir."""


@dataclass(frozen=True)
class SessionRef:
    """One capture session and the hosts it holds."""

    run: str
    session: str
    path: str
    hosts: tuple[str, ...]
    fs: Any = field(default=None, compare=False, hash=False, repr=False)
    # (file name, or "" for the folder itself; why it is not read): reported as errors.
    skipped: tuple[tuple[str, str], ...] = ()
    # (host, folder) of hosts whose file is in a sibling session folder (see join_split_sessions).
    host_dirs: tuple[tuple[str, str], ...] = ()
    # (host, file name) of hosts whose file is not "<host>.xplane.pb" (PyTorch traces, other formats).
    files: tuple[tuple[str, str], ...] = ()

    def host_file(self, host: str) -> str:
        if host not in self.hosts:
            raise LookupError(f"host {host!r} is not in session {self.session!r}")
        name = dict(self.files).get(host) or host + XPLANE_SUFFIX
        return self._join(dict(self.host_dirs).get(host, self.path), name)

    def _join(self, *parts: str) -> str:
        return posixpath.join(*parts) if self.fs is not None else os.path.join(*parts)

    def opener(self) -> Opener | None:
        """The filesystem the reader reads this session's files with (None for local files)."""
        return self.fs

    def stat_key(self) -> tuple:
        """(host, size, mtime) of every capture file: a cache key that changes with the files.

        For a remote file "mtime" is every field of its info that changes on a rewrite
        (each store names its own); the listing resolve_session just refreshed answers it.
        """
        key = []
        for host in self.hosts:
            path = self.host_file(host)
            try:
                if self.fs is None:
                    st = os.stat(path)
                    key.append((host, st.st_size, st.st_mtime_ns))
                else:
                    size, version = remote_stamp(self.fs.info(path))
                    key.append((host, -1 if size is None else size, version))
            except Exception as err:    # a store raises its own kinds; reading the file says why
                if self.fs is None and not isinstance(err, OSError):
                    raise
                key.append((host, -1, -1))
        return tuple(key)


def _filesystem(path: str):
    """(fs, path) for remote paths, (None, path) for local ones."""
    if "://" not in path or path.startswith("file://"):
        return None, path[len("file://"):] if path.startswith("file://") else path
    try:
        import fsspec
    except ImportError:
        raise StoreError(
            f"{path}: remote paths need fsspec (pip install fsspec: the package's remote extra)") from None
    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as err:
        raise StoreError(_missing_backend(path, err)) from None
    except Exception as err:    # an unknown protocol, or a store refusing its settings
        raise StoreError(f"{path}: cannot open this location: {err}") from None


def _missing_backend(path: str, err: ImportError) -> str:
    """One line naming the package that reads PATH's protocol (fsspec's registry knows it)."""
    from fsspec.core import split_protocol
    from fsspec.registry import get_filesystem_class, known_implementations

    for part in path.split("::"):               # a chained URL: find the link that fails
        protocol = split_protocol(part)[0] or "file"
        try:
            get_filesystem_class(protocol)
        except ImportError:
            package = known_implementations.get(protocol, {}).get("class", "").split(".")[0]
            if package and package != "fsspec" and importlib.util.find_spec(package) is None:
                return f"{path}: reading {protocol}:// needs the {package} package (pip install {package})"
            return f"{path}: reading {protocol}:// needs a package that is not installed: {err}"
    return f"{path}: {err}"


@contextmanager
def _store_errors(path: str, fs) -> Iterator[None]:
    """Any failure of a remote store (each raises its own kinds) as a StoreError for PATH."""
    try:
        yield
    except (DiscoveryError, UnsafePathError, LookupError):
        raise
    except Exception as err:
        if fs is None:
            raise
        raise StoreError(f"{path}: cannot list this location: {type(err).__name__}: {err}") from None


def _hosts_in(names: list[str]) -> tuple[str, ...]:
    return tuple(sorted(n[: -len(XPLANE_SUFFIX)] for n in names
                        if n.endswith(XPLANE_SUFFIX) and len(n) > len(XPLANE_SUFFIX)))


def _why_skipped(path: str, real_root: str | None) -> str | None:
    """Why a local capture file must not be read: not a regular file, or a link out of REAL_ROOT."""
    try:
        if real_root is not None and os.path.islink(path):
            target = os.path.realpath(path)
            if os.path.commonpath([real_root, target]) != real_root:
                return "a symbolic link to a file outside the log directory; not read"
        st = os.stat(path)
    except (OSError, ValueError):
        return None             # gone or unreadable: reading it reports that
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, socket or device named like a capture); not read"
    return None


def _local_hosts(folder: str, names: list[str], real_root: str | None = None
                 ) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(readable hosts, skipped files) among the file NAMES of a local session FOLDER."""
    hosts, skipped = [], []
    for host in _hosts_in(names):
        reason = _why_skipped(os.path.join(folder, host + XPLANE_SUFFIX), real_root)
        if reason:
            skipped.append((host + XPLANE_SUFFIX, reason))
        else:
            hosts.append(host)
    return tuple(hosts), tuple(skipped)


def _run_name(fs, logdir: str, run_dir: str) -> str:
    """TensorBoard's name for a run: its folder relative to the logdir ("." for the logdir)."""
    rel = os.path.relpath(run_dir, logdir) if fs is None else run_dir[len(logdir):].strip("/")
    return "." if rel in ("", ".") else rel.replace(os.sep, "/")


def _addressable(run: str, session: str) -> bool:
    """Whether resolve_session reaches RUN/SESSION by these names.  A store's keys are plain
    strings, so a listed folder may be called "..", "." or "" (from "a//b"): such names would
    read as a way out of the logdir, or as another run, and are not listed."""
    try:
        check_component(run, "run", allow_slash=True)
        check_component(session, "session", allow_slash=False)
    except UnsafePathError:
        return False
    return run == "." or all(part not in ("", ".") for part in run.split("/"))


def _own_name(run_dir: str) -> str:
    """The run name when only the session (or a file in it) was given: the run folder's name."""
    return os.path.basename(run_dir.rstrip("/")) or "."


def _split_session_dir(session_dir: str) -> tuple[str, str] | None:
    """(run_dir, session) when session_dir looks like <run>/plugins/profile/<session>."""
    parent, session = os.path.split(session_dir.rstrip("/"))
    profile_parent, profile = os.path.split(parent)
    run_dir, plugins = os.path.split(profile_parent)
    if (plugins, profile) == PROFILE_DIR:
        return run_dir or ".", session
    return None


def _walk(fs, root: str, unreadable: list[tuple[str, str]]):
    """os.walk / fs.walk; local folders below ROOT that cannot be listed go to UNREADABLE."""
    if fs is None:
        def onerror(err: OSError) -> None:
            if err.filename == root:
                raise DiscoveryError(f"{root}: {err.strerror}")
            unreadable.append((err.filename, err.strerror or str(err)))
        yield from os.walk(root, onerror=onerror)
    else:
        for dirpath, dirnames, filenames in fs.walk(root):
            yield dirpath, dirnames, filenames


# Hosts of one job that start tracing a few seconds apart (a TPU pod, a multi-node GPU job) each
# write their own session folder, named by its start time: folders of one run whose names lie
# within this many seconds of the first one's, and whose hosts all differ, are one session.
SPLIT_SESSION_S = 30
SESSION_TIME = "%Y_%m_%d_%H_%M_%S"


def _started(session: str) -> datetime | None:
    try:
        return datetime.strptime(session, SESSION_TIME)
    except ValueError:
        return None


def _soon_after(first: str, then: str) -> bool:
    """Whether session folder THEN started up to SPLIT_SESSION_S after FIRST (by their names)."""
    a, b = _started(first), _started(then)
    return a is not None and b is not None and 0 < (b - a).total_seconds() <= SPLIT_SESSION_S


def _continues(group: SessionRef, ref: SessionRef) -> bool:
    """Whether REF's folder holds more hosts of GROUP's session."""
    return (group.run == ref.run and _soon_after(group.session, ref.session) and bool(group.hosts)
            and bool(ref.hosts) and not set(group.hosts) & set(ref.hosts))


def join_split_sessions(refs: list[SessionRef]) -> list[SessionRef]:
    """REFS (sorted by run and session) with the folders of one split session joined under the
    first folder's name."""
    out: list[SessionRef] = []
    for ref in refs:
        if out and _continues(out[-1], ref):
            group = out[-1]
            out[-1] = replace(group, hosts=group.hosts + ref.hosts, skipped=group.skipped + ref.skipped,
                              host_dirs=group.host_dirs + tuple((host, ref.path) for host in ref.hosts))
        else:
            out.append(ref)
    return out


def _folder_format(file_name: str) -> Adapter | None:
    """The format claiming FILE_NAME when its files lie in run folders (not in profile folders)."""
    adapter = adapter_for(file_name)
    return None if adapter is None or adapter.profile_dir else adapter


def _sniffable(file_name: str) -> bool:
    """Whether FILE_NAME is one a format would sniff (hidden files, such as XProf's
    ``.cached_tools.json``, never are)."""
    return not file_name.startswith(".") and sniffer_for(file_name) is not None


def _sniffs_in(folder: str) -> bool:
    """Whether the files of FOLDER are sniffed: not in or below a ``plugins`` folder, where
    TensorBoard's plugins keep their own files (TF's ``<host>.trace.json.gz`` beside its
    ``.xplane.pb``, XProf's caches), wherever the search began."""
    return "plugins" not in folder.replace("\\", "/").split("/")


# What the last sniffs of local files found, by (path, size, mtime): the tab searches its logdir
# on every listing, and a folder of 10,000 small JSON files (a dataset's annotations) costs 0.3 s
# to sniff again, a stat each to look up.  Only settled answers are kept; oldest dropped first.
_SNIFFS: dict[tuple[str, int, int], Sniffed] = {}
SNIFF_CACHE_SIZE = 1 << 16


def _sniff_local(adapter: Adapter, path: str) -> Sniffed:
    """ADAPTER's sniff of the local file PATH, from _SNIFFS while the file is unchanged."""
    try:
        st = os.stat(path)
    except OSError:
        return Sniffed(False)
    key = (path, st.st_size, st.st_mtime_ns)
    known = _SNIFFS.get(key)
    if known is not None:
        return known
    sniff = adapter.sniff(path, None)
    if sniff.holds is not None:
        _SNIFFS[key] = sniff
        while len(_SNIFFS) > SNIFF_CACHE_SIZE:
            del _SNIFFS[next(iter(_SNIFFS))]
    return sniff


def _sniffed(fs, folder: str, names: list[str], real_root: str | None) -> dict[str, Sniffed]:
    """What each sniffable file of NAMES in FOLDER holds, by its sniffing format; files that are
    not safe to read (``_why_skipped``) are not opened."""
    found = {}
    for name in names:
        adapter = None if name.startswith(".") else sniffer_for(name)
        if adapter is None:
            continue
        if fs is None:
            path = os.path.join(folder, name)
            sniff = Sniffed(False) if _why_skipped(path, real_root) else _sniff_local(adapter, path)
        else:
            sniff = adapter.sniff(posixpath.join(folder, name), fs)
        if sniff.holds is not False:
            found[name] = sniff
    return found


def folder_sessions(fs, run: str, folder: str, names: list[str], real_root: str | None = None,
                    sniff: bool = True) -> list[SessionRef]:
    """The sessions of one run FOLDER from its file NAMES, grouped by each format's adapter:
    files its name ending claims, and (SNIFF) files its sniffer finds to be its own."""
    sniffed = _sniffed(fs, folder, names, real_root) if sniff else {}
    owner = {name: _folder_format(name) for name in names}
    owner.update((name, sniffer_for(name)) for name in sniffed)
    refs = []
    for adapter in adapters():
        claimed = [name for name, its in owner.items() if its is adapter]
        for session, members in adapter.sessions(claimed, sniffed) if claimed else []:
            hosts, skipped = [], []
            for host, name in members:
                reason = _why_skipped(os.path.join(folder, name), real_root) if fs is None else None
                if reason:
                    skipped.append((name, reason))
                else:
                    hosts.append((host, name))
            refs.append(SessionRef(run, session, folder, tuple(h for h, _ in hosts), fs, tuple(skipped),
                                   files=tuple(hosts)))
    return refs


def find_sessions(path: str) -> list[SessionRef]:
    """Every session under PATH (a logdir, a run folder, a session folder or one .xplane.pb).

    Raises DiscoveryError when PATH does not exist or cannot be read.  A logdir
    with no captures gives an empty list.
    """
    fs, root = _filesystem(path)
    with _store_errors(path, fs):
        if fs is not None:
            fs.invalidate_cache()       # sessions written since the last search must show
        return _find_sessions(path, fs, root)


def _find_sessions(path: str, fs, root: str) -> list[SessionRef]:
    exists = os.path.exists(root) if fs is None else fs.exists(root)
    if not exists:
        raise DiscoveryError(f"{path}: no such file or directory")
    is_file = os.path.isfile(root) if fs is None else fs.isfile(root)

    if is_file:
        folder, name = os.path.split(root)
        if _folder_format(name) or _sniffable(name):
            refs = folder_sessions(fs, _own_name(folder), folder, [name])
            if refs:
                return refs
            raise DiscoveryError(f"{path}: not a profile trace (its first bytes hold no \"traceEvents\" "
                                 "and no array of trace events)")
        if not root.endswith(XPLANE_SUFFIX):
            known = " or ".join(f"*{s}" for a in adapters() for s in a.suffixes + a.sniffed)
            raise DiscoveryError(f"{path}: not a profile capture (expected a {known} file)")
        session_dir, name = os.path.split(root)
        split = _split_session_dir(session_dir)
        run = _own_name(split[0]) if split else "."
        session = split[1] if split else os.path.basename(session_dir) or "."
        return [SessionRef(run, session, session_dir, _hosts_in([name]), fs)]

    # A session folder given directly.
    split = _split_session_dir(root)
    if split:
        if fs is None:
            try:
                hosts, skipped = _local_hosts(root, os.listdir(root))
            except OSError as err:
                raise DiscoveryError(f"{path}: cannot list the session folder: {err.strerror}") from None
        else:
            hosts, skipped = _hosts_in([posixpath.basename(p) for p in fs.ls(root, detail=False)]), ()
        if hosts or skipped:
            return [SessionRef(_own_name(split[0]), split[1], root, hosts, fs, skipped)]

    sessions: list[SessionRef] = []
    unreadable: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in _walk(fs, root, unreadable):
        dirnames.sort()
        sniff = _sniffs_in(dirpath)
        if any(map(_folder_format, filenames)) or (sniff and any(map(_sniffable, filenames))):
            run = _run_name(fs, root, dirpath)
            sessions += [ref for ref in folder_sessions(fs, run, dirpath, filenames, sniff=sniff)
                         if fs is None or _addressable(run, ref.session)]
        found = _split_session_dir(dirpath)
        if not found:
            continue
        hosts, skipped = _local_hosts(dirpath, filenames) if fs is None else (_hosts_in(filenames), ())
        run, session = _run_name(fs, root, found[0]), found[1]
        if (hosts or skipped) and (fs is None or _addressable(run, session)):
            sessions.append(SessionRef(run, session, dirpath, hosts, fs, skipped))
    for folder, reason in unreadable:
        # A session folder that cannot be listed is reported, not silently left out.
        found = _split_session_dir(folder)
        if found:
            sessions.append(SessionRef(_run_name(fs, root, found[0]), found[1], folder, (), fs,
                                       (("", f"cannot list the session folder: {reason}"),)))
    sessions.sort(key=lambda ref: (ref.run, ref.session))
    return join_split_sessions(sessions)


def check_component(value: str, what: str, allow_slash: bool) -> None:
    """Reject values that could address anything outside the logdir."""
    if not value:
        raise UnsafePathError(f"{what} is empty")
    if "\x00" in value or "\\" in value:
        raise UnsafePathError(f"{what} contains a forbidden character")
    if value.startswith("/") or os.path.isabs(value) or "://" in value or (len(value) > 1 and value[1] == ":"):
        raise UnsafePathError(f"{what} must be relative to the logdir")
    parts = value.split("/")
    if ".." in parts or (not allow_slash and len(parts) > 1):
        raise UnsafePathError(f"{what} must not contain '..' or path separators")


def _listed(fs, run: str, session: str, session_dir: str, real_root: str | None) -> SessionRef:
    """The session folder SESSION_DIR as listed now."""
    if fs is None:
        try:
            hosts, skipped = _local_hosts(session_dir, os.listdir(session_dir), real_root)
        except OSError as err:
            hosts, skipped = (), (("", f"cannot list the session folder: {err.strerror}"),)
    else:
        fs.invalidate_cache(session_dir)    # stat_key reads this listing: it must be today's
        hosts, skipped = _hosts_in([posixpath.basename(p) for p in fs.ls(session_dir, detail=False)]), ()
    return SessionRef(run, session, session_dir, hosts, fs, skipped)


def _folder_session(fs, root: str, run: str, session: str, run_dir: str) -> SessionRef | None:
    """RUN/SESSION when it is a session of files in RUN's folder (a PyTorch profiling cycle), else None."""
    real_root = None
    if fs is None:
        real_root = os.path.realpath(root)
        if os.path.commonpath([real_root, os.path.realpath(run_dir)]) != real_root:
            raise UnsafePathError("run resolves outside the logdir")
        try:
            names = os.listdir(run_dir)
        except OSError:
            return None
    else:
        with _store_errors(root, fs):
            if not fs.isdir(run_dir):
                return None
            fs.invalidate_cache(run_dir)
            names = [posixpath.basename(p) for p in fs.ls(run_dir, detail=False)]
    return next((ref for ref in folder_sessions(fs, run, run_dir, names, real_root, _sniffs_in(run_dir))
                 if ref.session == session), None)


def resolve_session(logdir: str, run: str, session: str) -> SessionRef:
    """The session RUN/SESSION of LOGDIR, refusing anything that escapes the logdir; with the
    hosts of sibling folders of the same split session (join_split_sessions).

    Raises UnsafePathError for escape attempts and LookupError for unknown names.
    """
    check_component(run, "run", allow_slash=True)
    check_component(session, "session", allow_slash=False)
    fs, root = _filesystem(logdir)
    join = os.path.join if fs is None else posixpath.join
    run_dir = root if run == "." else join(root, *run.split("/"))
    profile_dir = join(run_dir, *PROFILE_DIR)
    session_dir = join(profile_dir, session)
    # An XPlane session folder is looked up first (the common case costs no listing of the run's
    # folder, which on a remote store is a round trip); a session of a run folder's files (a PyTorch
    # cycle) is sought only without one.
    real_root = None
    if fs is None:
        real_root = os.path.realpath(root)
        real_session = os.path.realpath(session_dir)
        if os.path.commonpath([real_root, real_session]) != real_root:
            raise UnsafePathError("run/session resolves outside the logdir")
        found = os.path.isdir(session_dir)
    else:
        with _store_errors(logdir, fs):
            found = fs.isdir(session_dir)
    if not found:
        in_folder = _folder_session(fs, root, run, session, run_dir)
        if in_folder is None:
            raise LookupError(f"no session {session!r} in run {run!r}")
        return in_folder
    if fs is None:
        ref = _listed(fs, run, session, session_dir, real_root)
        siblings = sorted(os.listdir(profile_dir))
    else:
        with _store_errors(logdir, fs):
            ref = _listed(fs, run, session, session_dir, real_root)
            siblings = sorted(posixpath.basename(p) for p in fs.ls(profile_dir, detail=False))
    if not ref.hosts and not ref.skipped:
        raise LookupError(f"session {session!r} of run {run!r} holds no capture")
    for name in siblings:
        if _soon_after(session, name):      # only folders close in time are listed
            with _store_errors(logdir, fs):
                later = _listed(fs, run, name, join(profile_dir, name), real_root)
            ref = join_split_sessions([ref, later])[0]
    return ref
