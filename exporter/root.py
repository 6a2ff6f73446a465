"""Every read of the machine goes through a Root (tests/fixtures/nodes/README.md).

The root is ``/`` on a live node, or a folder that stands in for a node in tests, bug
reports and demos. Paths inside it are the machine's own (``sys/class/net/...``).
"""

from __future__ import annotations

import os
import resource
import stat
import time
from pathlib import Path


class SourceError(Exception):
    """A source could not be read or held a value that makes no sense.

    ``where`` names the place (a file and line, a device, a call) so that the log line and
    the bug report say exactly what was wrong; ``what`` says what.
    """

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where = where
        self.what = what


class TooBig(SourceError):
    """A file that holds more than a read takes: not read, and not worth reading again
    until it changes."""


# Git cannot store empty folders, so fixture trees hold a `.keep` file where a folder must
# exist; it is never a counter or a device.
IGNORED_NAMES = frozenset({".keep"})
# The most a read takes from one file. The largest the exporter reads are `ethtool -S` of a
# port with many channels (some hundred kilobytes with 200 channels) and /proc/net/netstat:
# tens of kilobytes. What a file of this size parses into (a dict of 100,000 counters at
# most) must also fit the unit's MemoryMax=128M beside the exporter's own 30 MB.
MAX_READ = 1 << 20
READ_CHUNK = 64 << 10
# sysfs attributes are kept open and read again from offset 0 (what sysfs documents for
# polling an attribute): one pread instead of open, read, read, close. An attribute holds at
# most a page; a file under sys/ that fills ATTRIBUTE_READ is read the plain way.
ATTRIBUTE_READ = 4096
# At most this many kept open, and never more than a quarter of the open-file limit less the
# exporter's own files: HTTP connections may take half of the limit (exporter/connections.py),
# and the rest must leave room for a listener's accept burst, NVML and a scrape. A dense node
# reads a few hundred attributes a second; those past the cap are read by their path.
MAX_OPEN_ATTRIBUTES = 512
OWN_FILES = 40
# And opened afresh at least this often (seconds): two devices that swapped names between two
# discoveries are read by their new names within a minute.
REOPEN_AFTER = 60.0


def read_fd(fd: int, where: str, cap: int = MAX_READ) -> bytes:
    """All of an open file, read in chunks of READ_CHUNK; TooBig for one that holds more
    than `cap` bytes (a runaway or hostile file must not take the exporter's memory). Nothing
    past cap + 1 bytes is read: a regular file that fills the first chunk is refused by its
    size, and a file whose size says nothing (sysfs says 4096 of every attribute, /proc and a
    device 0, /dev/zero never ends) by what it gave."""
    chunks = []
    size = 0
    while chunk := os.read(fd, min(READ_CHUNK, cap + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > cap or size == READ_CHUNK and _regular_size(fd) > cap:
            # Let go of what was read first: the error's traceback holds this frame, and
            # an error kept in a list of a tick's errors may live until the next collection.
            chunks.clear()
            raise TooBig(where, f"holds over {cap >> 20} MiB: not read" if cap >= 1 << 20
                         else f"holds over {cap >> 10} KiB: not read")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _regular_size(fd: int) -> int:
    """A regular file's size; 0 for anything else (its size means nothing)."""
    st = os.fstat(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def read_file(path: str | os.PathLike, cap: int = MAX_READ) -> bytes:
    """A file's bytes by its path, at most `cap` (read_fd); OSError where it cannot be opened
    or read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_fd(fd, str(path), cap)
    finally:
        os.close(fd)


class _OpenAttribute:
    """A kept-open file. It is closed when the last reference goes, never while a thread
    still reads it (a closed descriptor's number could be reused for another file)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


class Root:
    # Paths are plain strings: the sampler reads hundreds of files a second, and pathlib
    # objects cost more than the reads themselves.
    def __init__(self, path: str | os.PathLike = "/"):
        self.base = Path(path)
        self.is_live = self.base.resolve() == Path("/")
        self._prefix = os.path.join(str(self.base), "")
        self._open: dict[str, _OpenAttribute] = {}  # rel -> the sysfs attribute kept open
        self._opened_since = time.monotonic()
        # Bumped when they are let go: a read by path that began before keeps its file
        # only if none was let go meanwhile (discovery, on another thread, saw a rename).
        self._generation = 0
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._max_open = MAX_OPEN_ATTRIBUTES if soft_limit == resource.RLIM_INFINITY else max(0, min(
            MAX_OPEN_ATTRIBUTES, soft_limit // 4 - OWN_FILES))
        # Paths read once by path: kept open at their second read, so that what discovery
        # reads once per device (its type, PCI address, NUMA node) takes no kept file.
        self._read_before: set[str] = set()

    def __repr__(self) -> str:
        return f"Root({str(self.base)!r})"

    def path(self, rel: str) -> Path:
        return self.base / rel

    def _abs(self, rel: str) -> str:
        return self._prefix + rel

    def where(self, rel: str) -> str:
        """The path of a file under the root, as messages name it (a string, cheaply made)."""
        return self._prefix + rel

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._prefix + rel)

    def entries(self, rel: str) -> dict[str, int]:
        """Names in a folder, sorted, each with the inode of its entry (a symbolic link's
        own, not followed); an absent folder is empty. One listing, no stat per name: what
        tells a device from another that took its name (sysfs makes a device's link anew
        when the device is made anew, and keeps it through a rename)."""
        try:
            with os.scandir(self._prefix + rel) as listing:
                found = {e.name: e.inode() for e in listing if e.name not in IGNORED_NAMES}
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as e:
            raise SourceError(self._prefix + rel, e.strerror or str(e)) from e
        return dict(sorted(found.items()))

    def listdir(self, rel: str) -> list[str]:
        """Names in a folder, sorted; an absent folder is empty."""
        try:
            return sorted(n for n in os.listdir(self._prefix + rel) if n not in IGNORED_NAMES)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise SourceError(self._prefix + rel, e.strerror or str(e)) from e

    def read_text(self, rel: str) -> str:
        data = self._read(rel)
        assert data is not None  # not missing_ok: an absent file raised
        return data.decode("utf-8", "replace")

    def forget_open_files(self, devices_changed: bool) -> None:
        """For discovery, each time it lists the devices: let go of the attributes kept open
        when devices came or went (and every REOPEN_AFTER seconds), so that each is opened
        again by its path at its next read. A file kept open follows its device through a
        rename, where a read by path must find whatever holds that name now."""
        now = time.monotonic()
        if devices_changed or now - self._opened_since > REOPEN_AFTER:
            self._generation += 1
            self._open.clear()
            self._read_before.clear()
            self._opened_since = now

    def _read(self, rel: str, missing_ok: bool = False) -> bytes | None:
        """The file's bytes, at most MAX_READ: a file that holds more is no attribute or
        table the exporter reads (a runaway or hostile file must not take its memory).
        None for a file that does not exist, where `missing_ok`."""
        if rel.startswith("sys/"):
            attribute = self._open.get(rel)
            if attribute is not None:
                try:
                    data = os.pread(attribute.fd, ATTRIBUTE_READ, 0)
                    # A removed sysfs attribute answers ENODEV (OSError); a fixture file
                    # replaced by another (a rename over it) has no links left.
                    if len(data) < ATTRIBUTE_READ and (self.is_live or os.fstat(attribute.fd).st_nlink):
                        return data
                except OSError:
                    pass
                self._open.pop(rel, None)  # read by path below: it says what became of it
            keep = rel in self._read_before and len(self._open) < self._max_open
            if not keep and len(self._read_before) < 4 * MAX_OPEN_ATTRIBUTES:
                self._read_before.add(rel)
            return self._read_path(rel, missing_ok, keep_from=self._generation if keep else None)
        return self._read_path(rel, missing_ok)

    def _read_path(self, rel: str, missing_ok: bool, keep_from: int | None = None) -> bytes | None:
        """Read by path; the file is kept open where `keep_from` is the generation of kept
        files the read began in and it is still that generation."""
        p = self._prefix + rel
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            if missing_ok:
                return None
            raise SourceError(p, e.strerror or str(e)) from e
        except OSError as e:
            raise SourceError(p, e.strerror or str(e)) from e
        try:
            data = read_fd(fd, p)
        except OSError as e:
            os.close(fd)
            # sysfs answers EINVAL for attributes that have no value right now (the speed
            # of a link that is down); that is "unknown", still reported with its path.
            raise SourceError(p, e.strerror or str(e)) from e
        except BaseException:
            os.close(fd)
            raise
        if keep_from == self._generation and len(data) < ATTRIBUTE_READ:
            self._open[rel] = _OpenAttribute(fd)
        else:
            os.close(fd)
        return data

    def read_int_if_present(self, rel: str) -> int | None:
        """The integer in a file, None when the file does not exist; SourceError when it
        exists but cannot be read or holds no integer."""
        text = self._read(rel, missing_ok=True)  # one open, as the fast tick reads it
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise SourceError(self._prefix + rel, f"not an integer: {text.strip()[:40]!r}") from None

    def read_str(self, rel: str) -> str:
        return self.read_text(rel).strip()

    def read_int(self, rel: str) -> int:
        text = self.read_str(rel)
        try:
            return int(text, 0) if text.startswith("0x") else int(text)
        except ValueError:
            raise SourceError(self._prefix + rel, f"not an integer: {text[:40]!r}") from None

    def read_optional_str(self, rel: str) -> str | None:
        """The stripped content, or None when the file is absent or unreadable."""
        try:
            return self.read_str(rel)
        except SourceError:
            return None

    def stat_key(self, rel: str) -> tuple[int, int] | None:
        """(mtime_ns, size) of a file, to reuse a parse while it is unchanged."""
        try:
            st = os.stat(self._prefix + rel)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)
