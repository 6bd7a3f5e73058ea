"""lra.download's transfers: an archive fetched over HTTP(S) or from a mirror into
`<name>.part`, continued where a stopped one stopped (HTTP Range, If-Range) and resumed
after a dropped connection, with a progress line (Progress); the disk's free space checked
before writing (check_space); the archive's size and sha256 compared with the official
ones (verify) before it is renamed into place (fetch_archive)."""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, TextIO

from lra.errors import DataError, UserError

CHUNK = 1 << 20
# Left free on the disk beyond what a download or a file being unpacked needs, so that the
# disk is never filled to the last byte (logs and checkpoints share it).
DISK_RESERVE = 64 << 20


class DownloadError(UserError):
    """A server that cannot be reached, answers with an HTTP error, or stops sending."""


@dataclasses.dataclass(frozen=True)
class Archive:
    filename: str  # also its name under --mirror and in <data_dir>/downloads/
    url: str
    size: int | None  # bytes; None: no published size
    sha256: str | None  # None: no published checksum
    source: str  # where size and sha256 come from


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return (f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600
            else f"{seconds // 60}:{seconds % 60:02d}")


class Progress:
    """Bytes, %, MB/s and ETA on `stream`: one line redrawn on a terminal, else a line per
    10% (per 500 MB when the total is unknown)."""

    def __init__(self, label: str, total: int | None, done: int = 0,
                 stream: TextIO | None = None):
        self.label, self.total, self.start_done = label, total, done
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = self.last_draw = time.monotonic()
        self.done = done
        self.next_step = self._step_of(done) + 1
        self.printed = -1  # `done` of the last line printed (not on a terminal)

    def _step_of(self, done: int) -> int:
        return done * 10 // self.total if self.total else done // 500_000_000

    def text(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = (self.done - self.start_done) / elapsed
        if not self.total:
            return f"{self.label}: {mb(self.done)} MB, {mb(rate)} MB/s"
        eta = clock((self.total - self.done) / rate) if rate > 0 else "?"
        bar = "#" * (20 * self.done // self.total)
        return (f"{self.label} [{bar:<20}] {100 * self.done / self.total:5.1f}% "
                f"{mb(self.done)}/{mb(self.total)} MB {mb(rate)} MB/s ETA {eta}")

    def update(self, done: int) -> None:
        self.done = done
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw >= 0.2:
                self.last_draw = now
                self.stream.write("\r" + self.text() + "\033[K")
                self.stream.flush()
        elif self._step_of(done) >= self.next_step:
            self.next_step = self._step_of(done) + 1
            self.printed = done
            self.stream.write(self.text() + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\r" + self.text() + "\033[K\n")
        elif self.printed != self.done:
            self.stream.write(self.text() + "\n")
        self.stream.flush()


def free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free


def check_space(folder: str, needed: int, what: str) -> None:
    free = free_bytes(folder)
    if free < needed + DISK_RESERVE:
        raise UserError(f"not enough disk space in {folder}: {what} needs {mb(needed)} MB "
                        f"and {mb(DISK_RESERVE)} MB are kept free, {mb(free)} MB are free; "
                        f"free some space or give a --data_dir on another disk")


def no_space(folder: str, what: str) -> UserError:
    return UserError(f"the disk holding {folder} is full ({what}); free some space or give a "
                     f"--data_dir on another disk, then run the same command again")


def write_error(folder: str, path: str, e: OSError) -> UserError:
    if e.errno == errno.ENOSPC:
        return no_space(folder, f"writing {path}")
    return UserError(f"cannot write {path} ({e.strerror or e}); give a --data_dir you can "
                     f"write to")


def _reason(e: BaseException) -> str:
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, socket.gaierror):
        return f"host not found: {reason.strerror or reason}"
    if isinstance(reason, BaseException):
        return str(reason) or type(reason).__name__
    return str(reason)


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """'bytes 100-199/1000' -> (100, 1000); 'bytes */1000' -> (None, 1000)."""
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    if not m:
        return None, None
    return (int(m.group(1)) if m.group(1) else None,
            int(m.group(2)) if m.group(2) != "*" else None)


def _read_meta(path: str) -> dict:
    try:
        with open(path) as f:
            meta = json.load(f)
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def _validator(headers) -> str | None:
    """What If-Range may carry: a strong ETag, else Last-Modified."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return headers.get("Last-Modified")


def download_file(url: str, part: str, *, size: int | None, timeout: float = 60,
                  retries: int = 3, backoff: float = 2.0, by_hand: str,
                  stream: TextIO | None = None, log: Callable[[str], None] = print) -> None:
    """Downloads `url` into `part`, continuing a partial `part` with an HTTP Range request.

    `size` (if known) must be what the server offers. A dropped connection is resumed up to
    `retries` times in a row without progress (waiting backoff, 2 backoff, ... seconds; a
    resumption that brought bytes starts the count again); then, or when the server
    cannot be reached or answers an HTTP error, a DownloadError tells to run again (which
    resumes) or to put the file at `by_hand`.
    """
    folder = os.path.dirname(part)
    meta_path = part + ".json"
    failures = 0
    while True:
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if size is not None and have == size:
            return
        if size is not None and have > size:
            log(f"{part} is longer than the {size} bytes of the file; starting over")
            os.remove(part)
            have = 0
        meta = _read_meta(meta_path)
        headers = {"Accept-Encoding": "identity", "User-Agent": "lra.download"}
        if have:
            headers["Range"] = f"bytes={have}-"
            # If the file changed on the server since the first part came, If-Range makes it
            # send the whole new file (200) instead of the rest of another one.
            if meta.get("url") == url and meta.get("validator"):
                headers["If-Range"] = meta["validator"]
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                              timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:
                _, total = _content_range(e.headers.get("Content-Range"))
                if total == have:  # the part was already whole
                    return
                log(f"{url}: the server refused to continue at byte {have}; starting over")
                os.remove(part)
                continue
            if (e.code >= 500 or e.code == 429) and failures < retries:  # a busy server
                failures += 1
                log(f"{url}: HTTP {e.code} {e.reason}; trying again ({failures} of {retries})")
                time.sleep(backoff * 2 ** (failures - 1))
                continue
            raise DownloadError(f"{url} answered HTTP {e.code} {e.reason}; check the address "
                                f"(--mirror), or download the file by hand to {by_hand} and "
                                f"run the same command again") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            failures += 1
            if failures <= retries:
                log(f"{url}: {_reason(e)}; trying again ({failures} of {retries})")
                time.sleep(backoff * 2 ** (failures - 1))
                continue
            raise DownloadError(f"cannot reach {url} ({_reason(e)}); check the network and run "
                                f"the same command again, or download the file by hand to "
                                f"{by_hand}") from None
        with response:
            if response.status == 206:
                start, total = _content_range(response.headers.get("Content-Range"))
                if start != have:
                    log(f"{url}: the server sent bytes from {start}, not {have}; starting over")
                    response.close()
                    os.remove(part)
                    continue
            else:
                if have:
                    log(f"{url}: the server sends the whole file (it ignored the Range request "
                        f"or the file changed); starting over")
                have = 0
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
            if size is not None and total is not None and total != size:
                raise DownloadError(
                    f"{url} offers {total} bytes, the official file has {size}: it is another "
                    f"file (check --mirror), or download the official one by hand to {by_hand}")
            if total is not None:
                check_space(folder, total - have, f"downloading {os.path.basename(by_hand)}")
            progress = Progress(os.path.basename(by_hand), total, have, stream)
            done = have
            error: BaseException | None = None
            try:
                with open(meta_path, "w") as f:
                    json.dump({"url": url, "validator": _validator(response.headers),
                               "total": total}, f)
                with open(part, "ab" if have else "wb") as out:
                    while True:
                        try:
                            # read1: what has arrived, up to CHUNK. read(CHUNK) waits for
                            # CHUNK bytes and loses what it had if the connection stalls
                            # (1000 bytes received, "stopped at 0 bytes").
                            chunk = response.read1(CHUNK)
                        except (OSError, http.client.HTTPException) as e:
                            error = e  # a reset connection, a timeout: the part is kept
                            break
                        if not chunk:
                            break
                        out.write(chunk)
                        done += len(chunk)
                        progress.update(done)
            except OSError as e:  # writing: a full disk, no permission
                raise write_error(folder, part, e) from None
            progress.finish()
        if error is None and (total is None or done >= total):
            if os.path.exists(meta_path):
                os.remove(meta_path)
            return
        reason = _reason(error) if error else "the connection closed early"
        failures = 1 if done > have else failures + 1
        if failures <= retries:
            log(f"{url}: stopped at {done} of {total} bytes ({reason}); resuming "
                f"({failures} of {retries})")
            time.sleep(backoff * 2 ** (failures - 1))
            continue
        raise DownloadError(f"the download of {url} stopped at {done} of {total} bytes "
                            f"({reason}); run the same command again to continue it from "
                            f"{part}")


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify(archive: Archive, path: str, log: Callable[[str], None]) -> None:
    """Size and sha256 against the official ones; a differing file stays where it is."""
    what = ("delete it and run the same command again to download it anew (a proxy or "
            "--mirror may have served another file)")
    if archive.size is not None and os.path.getsize(path) != archive.size:
        raise DataError(f"{path} has {os.path.getsize(path)} bytes, the official "
                        f"{archive.filename} has {archive.size} ({archive.source}); the file "
                        f"is kept: {what}")
    actual = sha256_of(path)
    if archive.sha256 is None:
        log(f"{archive.filename}: no official checksum to compare with ({archive.source}); "
            f"its sha256 is {actual}")
    elif actual != archive.sha256:
        raise DataError(f"{path}: sha256 {actual} differs from the official {archive.sha256} "
                        f"({archive.source}); the file is kept: {what}")
    else:
        log(f"{archive.filename}: sha256 verified")


def fetch_archive(archive: Archive, downloads: str, *, mirror: str = "", timeout: float = 60,
                  retries: int = 3, backoff: float = 2.0, stream: TextIO | None = None,
                  log: Callable[[str], None] = print) -> str:
    """The verified archive in `downloads`: downloaded (or continued) unless already there."""
    path = os.path.join(downloads, archive.filename)
    part = path + ".part"
    if not os.path.exists(path):
        url = f"{mirror.rstrip('/')}/{archive.filename}" if mirror else archive.url
        log(f"{archive.filename}: {'continuing' if os.path.exists(part) else 'downloading'} {url}"
            + (f" ({mb(archive.size)} MB)" if archive.size else ""))
        download_file(url, part, size=archive.size, timeout=timeout, retries=retries,
                      backoff=backoff, by_hand=path, stream=stream, log=log)
        verify(archive, part, log)
        os.replace(part, path)
    else:
        verify(archive, path, log)
    return path
