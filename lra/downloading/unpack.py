"""lra.download's unpacking: the members of a .tar.gz that each task's folder takes
(Target: a pattern on member names, the files a complete folder has), unpacked in one
pass into hidden `.<folder>.partial` siblings that are renamed into place only when
complete (unpack); files used as they are copied into place the same way (place)."""
from __future__ import annotations

import dataclasses
import gzip
import os
import posixpath
import re
import shutil
import tarfile
import zlib
from typing import Callable, TextIO

from lra.downloading.transfer import CHUNK, Progress, check_space, write_error
from lra.errors import DataError


@dataclasses.dataclass(frozen=True)
class Target:
    """One task's folder: which archive members go into it and what a complete one holds."""
    task: str
    archive: str  # key of ARCHIVES
    folder: str  # below data_dir, '/'-separated; renamed into place when complete
    member: str  # regex on archive member names; group 1 = the path inside `folder`
    required: tuple[str, ...]  # paths inside `folder` that a complete folder has
    data_dir: str  # the task's --config.data_dir, below data_dir
    # Keys of ARCHIVES that are the task's files themselves (gzipped files its reader reads
    # as they are): placed into `folder` as downloaded, not unpacked (`archive` unused).
    files: tuple[str, ...] = ()


class _Counted:
    """A read-only file that reports how far it has been read (the unpacking progress)."""

    def __init__(self, f, progress: Progress):
        self.f, self.progress, self.done = f, progress, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.done += len(data)
        self.progress.update(self.done)
        return data


def missing_files(folder: str, target: Target) -> list[str]:
    """What `folder` lacks of target.required."""
    return [r for r in target.required if not os.path.exists(os.path.join(folder, r))]


def partial_of(final: str) -> str:
    return os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.partial")


def unpack(archive_path: str, targets: list[Target], data_dir: str, *,
           stream: TextIO | None = None, log: Callable[[str], None] = print) -> None:
    """Unpacks each target's members of one .tar.gz in one pass; renames each target's
    folder into place only when every target is complete."""
    finals = [os.path.join(data_dir, *t.folder.split("/")) for t in targets]
    partials = [partial_of(f) for f in finals]
    patterns = [re.compile(t.member) for t in targets]
    written: list[dict[str, int]] = [{} for _ in targets]
    for p in partials:
        if os.path.exists(p):  # a stopped run's leftover (runs are serialized by the lock)
            shutil.rmtree(p)
        os.makedirs(p)
    name = os.path.basename(archive_path)
    try:
        progress = Progress(f"unpacking {name}", os.path.getsize(archive_path), 0, stream)
        with open(archive_path, "rb") as raw, gzip.GzipFile(fileobj=_Counted(raw, progress),
                                                            mode="rb") as gz:
            with tarfile.open(fileobj=gz, mode="r|") as tar:
                for member in tar:
                    member_name = member.name
                    while member_name.startswith("./"):  # tar run in the folder: ./aclImdb/...
                        member_name = member_name[2:]
                    for pattern, partial, seen in zip(patterns, partials, written):
                        m = pattern.match(member_name)
                        if m:
                            _extract(tar, member, m.group(1), partial, seen, name, log)
            # To the end of the gzip stream: reaching it checks the CRC-32 and length trailer
            # (the only check lra_release.gz has; tarfile stops at the end-of-archive blocks).
            while gz.read(CHUNK):
                pass
        progress.finish()
        for target, partial in zip(targets, partials):
            missing = missing_files(partial, target)
            if missing:
                raise DataError(f"{archive_path} holds no {', '.join(missing)} for "
                                f"{target.task} (pattern {target.member}): not the archive "
                                f"the readers expect; delete it and run the same command again")
        for partial, final in zip(partials, finals):
            if os.path.isdir(final):  # empty (checked before): rename cannot replace a folder
                os.rmdir(final)
            os.rename(partial, final)
    except OSError as e:
        _remove(partials)
        if isinstance(e, gzip.BadGzipFile) or not e.errno:  # a bad CRC, not a gzip file
            raise _damaged(archive_path, e) from None
        raise write_error(data_dir, f"{data_dir} (unpacking {name})", e) from None
    except (tarfile.TarError, EOFError, zlib.error) as e:
        _remove(partials)
        raise _damaged(archive_path, e) from None
    except BaseException:
        _remove(partials)
        raise


def place(paths: list[str], target: Target, data_dir: str, *, keep: bool) -> None:
    """Copies (moves, unless `keep`) downloaded files into target's folder, through the
    hidden `.partial` sibling, renamed into place when all are there."""
    final = os.path.join(data_dir, *target.folder.split("/"))
    partial = partial_of(final)
    try:
        if os.path.exists(partial):
            shutil.rmtree(partial)
        os.makedirs(partial)
        for path in paths:
            check_space(partial, os.path.getsize(path), f"copying {path}")
            dest = os.path.join(partial, os.path.basename(path))
            shutil.copyfile(path, dest) if keep else shutil.move(path, dest)
        if os.path.isdir(final):  # empty (checked before): rename cannot replace a folder
            os.rmdir(final)
        os.rename(partial, final)
    except OSError as e:
        _remove([partial])
        raise write_error(data_dir, f"{final} (placing {target.task}'s files)", e) from None


def _damaged(path: str, e: BaseException) -> DataError:
    return DataError(f"{path} is damaged ({type(e).__name__}: {e}); nothing was unpacked: "
                     f"delete it and run the same command again to download it anew")


def _remove(folders: list[str]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, inside: str, partial: str,
             seen: dict[str, int], archive: str, log: Callable[[str], None]) -> None:
    rel = posixpath.normpath(inside)
    if rel.startswith("/") or rel == ".." or rel.startswith("../"):
        raise DataError(f"{archive}: member {member.name!r} points outside its folder; "
                        f"not unpacked (delete the archive: it is not the official one)")
    dest = os.path.join(partial, *rel.split("/"))
    if member.isdir():
        os.makedirs(dest, exist_ok=True)
        return
    if not member.isfile():  # links and devices: LRA's archives hold none the readers need
        return
    if rel in seen:  # lra_release.gz may hold a file twice (in nested copies of a folder)
        if seen[rel] != member.size:
            log(f"{archive}: {member.name} ({member.size} bytes) repeats {rel} with another "
                f"size ({seen[rel]} bytes); the first one is kept")
        return
    check_space(partial, member.size, f"unpacking {member.name}")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    source = tar.extractfile(member)
    with open(dest, "wb") as out:
        shutil.copyfileobj(source, out, CHUNK)
    seen[rel] = member.size
