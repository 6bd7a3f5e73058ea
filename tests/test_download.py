"""lra.download against a local HTTP server: layouts the readers read, resumption with HTTP
Range, checksums, damaged archives, one-line errors (no network beyond 127.0.0.1)."""
from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import os
import pickle
import re
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import zipfile

import numpy as np
import pytest
from PIL import Image

import lra.tasks
from lra import download
from lra.downloading import transfer
from lra.errors import DataError, UserError
from lra.tasks import image, mnist, text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARD = "curv_contour_length_14"


# --- a server with Range support, and a mode that drops the connection mid-file ------------


class Server:
    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[dict] = []
        # file -> bytes sent before dropping the connection (once), or a list: one per request
        self.drop_after: dict[str, int | list[int]] = {}
        # file -> bytes sent before the connection stalls (once): silent for stall_seconds
        self.stall_after: dict[str, int] = {}
        self.stall_seconds = 1.0
        self.ignore_range = False
        self.etag = '"v1"'
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = urllib.parse.unquote(self.path.lstrip("/"))
                state.requests.append({"file": name, "range": self.headers.get("Range"),
                                       "if_range": self.headers.get("If-Range")})
                if name not in state.files:
                    self.send_error(404)
                    return
                data = state.files[name]
                start = 0
                ranged = self.headers.get("Range")
                if ranged and not state.ignore_range and (
                        self.headers.get("If-Range") in (None, state.etag)):
                    start = int(re.fullmatch(r"bytes=(\d+)-", ranged).group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("ETag", state.etag)
                self.end_headers()
                body = data[start:]
                drop = state.drop_after.get(name)
                if isinstance(drop, list):
                    drop = drop.pop(0) if drop else None
                else:
                    state.drop_after.pop(name, None)
                stall = state.stall_after.pop(name, None)
                if stall is not None:
                    self.wfile.write(body[:stall])
                    self.wfile.flush()
                    time.sleep(state.stall_seconds)
                    self.close_connection = True
                    return
                if drop is not None:
                    self.wfile.write(body[:drop])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- small archives with the official layouts -----------------------------------------------


def targz(entries: dict[str, bytes | None]) -> bytes:
    """A .tar.gz of `entries` (None: a folder), in the given order."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for name, data in entries.items():
                info = tarfile.TarInfo(name)
                info.mtime = 0
                if data is None:
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()


_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz  ", np.uint8)
# Random letters, so that the archive does not shrink to a few hundred bytes.
REVIEWS = {(split, label): [f"{split} {label} {i} ".encode() + _LETTERS[
    np.random.default_rng([ord(split[1]), ord(label[0]), i]).integers(0, 28, 400 + i)].tobytes()
    + b" \xc3\xa9" for i in range(3)] for split in ("train", "test") for label in ("neg", "pos")}


def imdb_archive() -> bytes:
    entries: dict[str, bytes | None] = {"aclImdb": None, "aclImdb/imdb.vocab": b"the\na\n"}
    for (split, label), reviews in REVIEWS.items():
        entries[f"aclImdb/{split}/{label}"] = None
        for i, review in enumerate(reviews):
            entries[f"aclImdb/{split}/{label}/{i}_{7 + i}.txt"] = review
    entries["aclImdb/train/unsup/0_0.txt"] = b"unlabelled"
    return targz(entries)


def cifar_archive() -> tuple[bytes, dict]:
    rng = np.random.default_rng(0)
    batches = {}
    entries: dict[str, bytes | None] = {"cifar-10-batches-py": None}
    for name, n in [(f"data_batch_{i}", 4) for i in range(1, 6)] + [("test_batch", 3)]:
        batch = {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, size=n).tolist(), b"batch_label": name.encode()}
        batches[name] = batch
        entries[f"cifar-10-batches-py/{name}"] = pickle.dumps(batch)
    entries["cifar-10-batches-py/batches.meta"] = pickle.dumps({b"label_names": [b"cat"]})
    return targz(entries), batches


AAN = {split: [(i % 2, f"{split}-doc{i} \"quoted\"".encode(), f"cited {i}".encode() * 3)
               for i in range(4)] for split in ("train", "eval", "test")}


def release_archive(listops_dir: str) -> tuple[bytes, dict]:
    """lra_release.gz's layout: lra_release/{tsv_data,listops-1000,pathfinder32,...}, with
    a nested copy of tsv_data (as users report) and folders no task takes."""
    entries: dict[str, bytes | None] = {"lra_release": None, "lra_release/tsv_data": None}
    for split, rows in AAN.items():
        entries[f"lra_release/tsv_data/new_aan_pairs.{split}.tsv"] = b"".join(
            b"%d\tid%d\tid%d\t%s\t%s\n" % (label, i, i + 100, t1, t2)
            for i, (label, t1, t2) in enumerate(rows))
    entries["lra_release/tsv_data/new_aan_pairs.train.only_ids.tsv"] = b"x\n"
    for split in ("train", "val", "test"):
        with open(os.path.join(listops_dir, f"basic_{split}.tsv"), "rb") as f:
            entries[f"lra_release/listops-1000/basic_{split}.tsv"] = f.read()
    rng = np.random.default_rng(1)
    images = {}
    for res in (32, 128, 64):
        images[res] = rng.integers(0, 256, size=(10, res, res), dtype=np.uint8)
        labels = rng.integers(0, 2, size=10)
        root = f"lra_release/pathfinder{res}/{HARD}"
        for i in range(10):
            entries[f"{root}/imgs/0/sample_{i}.png"] = png(images[res][i])
        entries[f"{root}/metadata/0.npy"] = "".join(
            f"imgs/0 sample_{i}.png {i} {labels[i]}\n" for i in range(10)).encode()
        images[res] = (images[res], labels)
    # A second copy that differs: the first one is kept, with a warning.
    entries["lra_release/lra_release/tsv_data/new_aan_pairs.train.tsv"] = (
        entries["lra_release/tsv_data/new_aan_pairs.train.tsv"] + b"1\ta\tb\tc\td\n")
    return targz(entries), images


def mnist_files(tmp_path) -> dict[str, bytes]:
    """MNIST's four .gz files (as on the CVDF mirror), of 6 training and 3 test images."""
    rng = np.random.default_rng(2)
    out = {}
    for split, n in (("train", 6), ("test", 3)):
        images, labels = mnist.FILES[split]
        for name, array in ((images, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)),
                            (labels, rng.integers(0, 10, n).astype(np.uint8))):
            mnist.write_idx(str(tmp_path / f"{name}.gz"), array)
            out[f"{name}.gz"] = (tmp_path / f"{name}.gz").read_bytes()
    return out


@pytest.fixture(scope="module")
def archives(listops_dir, tmp_path_factory):
    cifar, batches = cifar_archive()
    release, pathfinder_images = release_archive(listops_dir)
    return {"aclImdb_v1.tar.gz": imdb_archive(), "cifar-10-python.tar.gz": cifar,
            "lra_release.gz": release, "batches": batches, "pathfinder": pathfinder_images,
            **mnist_files(tmp_path_factory.mktemp("mnist")), **lm_zips()}


def lm_zips() -> dict[str, bytes]:
    """enwik8.zip and text8.zip of a few bytes (the real members hold 10^8)."""
    out = {}
    for name, text in (("enwik8", b"<page>Hello, wiki</page>\n"), ("text8", b" anarchism is")):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr(name, text)
        out[f"{name}.zip"] = buffer.getvalue()
    return out


def table(files: dict[str, bytes], *, checksums: bool = True) -> dict[str, download.Archive]:
    """ARCHIVES with the test archives' sizes and sha256 (lra_release: none, as the real)."""
    out = {}
    for key, official in download.ARCHIVES.items():
        data = files[official.filename]
        known = checksums and official.sha256 is not None
        out[key] = download.Archive(official.filename, official.url,
                                    len(data) if known else None,
                                    hashlib.sha256(data).hexdigest() if known else None, "test")
    return out


@pytest.fixture
def server(archives):
    s = Server()
    s.files = {k: v for k, v in archives.items() if k.endswith(("gz", ".zip"))}
    yield s
    s.close()


def run(server, data_dir, tasks, lines=None, **kw):
    if "archives" not in kw:
        kw["archives"] = table(server.files)
    kw.setdefault("mirror", server.url)
    kw.setdefault("backoff", 0)
    kw.setdefault("stream", io.StringIO())
    return download.fetch(tasks, str(data_dir), log=(lines if lines is not None else []).append,
                          **kw)


# --- the whole path: download, verify, unpack, read back with the task readers --------------


def test_all_unpacks_the_layouts_the_readers_read(server, archives, tmp_path):
    data = tmp_path / "data"
    lines = []
    ready = run(server, data, ["all"], lines)
    assert ready == {t: str(data / t) for t in ("text", "retrieval", "image")}
    assert sorted(os.listdir(data)) == ["downloads", "image", "retrieval", "text"]
    assert sorted(os.listdir(data / "text" / "aclImdb")) == ["imdb.vocab", "test", "train"]
    assert sorted(os.listdir(data / "retrieval")) == [
        f"new_aan_pairs.{s}.tsv" for s in ("eval", "test", "train")]
    for name in ("aclImdb_v1.tar.gz", "cifar-10-python.tar.gz", "lra_release.gz"):
        with open(data / "downloads" / name, "rb") as f:
            assert f.read() == archives[name]
    assert any("sha256 verified" in line for line in lines)
    assert any("lra_release.gz: no official checksum" in line and
               hashlib.sha256(archives["lra_release.gz"]).hexdigest() in line for line in lines)

    got = lra.tasks.get("text").load(ready["text"], "train", 64)
    want = REVIEWS["train", "neg"] + REVIEWS["train", "pos"]
    np.testing.assert_array_equal(got["inputs"], text.encode_bytes(want, 64)[0])
    np.testing.assert_array_equal(got["targets"], [0, 0, 0, 1, 1, 1])

    batches = archives["batches"]
    got = lra.tasks.get("image").load(ready["image"], "test", 1024)
    np.testing.assert_array_equal(got["inputs"],
                                  image.rgb_to_gray(batches["test_batch"][b"data"]))
    got = lra.tasks.get("image").load(ready["image"], "train", 1024, validation="test")
    assert len(got["targets"]) == 20

    assert any("lra_release/lra_release/tsv_data/new_aan_pairs.train.tsv" in line and
               "the first one is kept" in line for line in lines)
    assert len(lra.tasks.get("retrieval").load(ready["retrieval"], "train", 8)["targets"]) == 4
    got = lra.tasks.get("retrieval").load(ready["retrieval"], "val", 32)
    np.testing.assert_array_equal(got["targets"], [r[0] for r in AAN["eval"]])
    np.testing.assert_array_equal(got["inputs"],
                                  text.encode_bytes([r[1] for r in AAN["eval"]], 32)[0])

    # Done once: the next run says so and asks the server nothing.
    before = len(server.requests)
    lines = []
    run(server, data, ["text", "image", "retrieval"], lines)
    assert len(server.requests) == before
    assert sum("already there; skipped" in line for line in lines) == 3


def test_listops_and_pathfinder_from_the_release_in_one_pass(server, archives, listops_dir,
                                                             tmp_path):
    data = tmp_path / "data"
    ready = run(server, data, ["listops", "pathfinder", "pathx"], keep_archives=False)
    assert [r["file"] for r in server.requests] == ["lra_release.gz"]
    assert os.listdir(data / "downloads") == [".lock"]  # --nokeep_archives
    assert os.listdir(data / "pathfinder") == ["pathfinder32"]
    assert os.listdir(data / "pathx") == ["pathfinder128"]
    assert ready["pathx"] == str(data / "pathx")  # configs/pathx.py's default data_dir
    for split in ("train", "test"):
        got = lra.tasks.get("listops").load(ready["listops"], split, 48)
        want = lra.tasks.get("listops").load(listops_dir, split, 48)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    for task, res in (("pathfinder", 32), ("pathx", 128)):
        images, labels = archives["pathfinder"][res]
        got = lra.tasks.get(task).load(ready[task], "train", res * res)
        np.testing.assert_array_equal(got["inputs"], images[:8].reshape(8, -1))
        np.testing.assert_array_equal(got["targets"], labels[:8])


# --- resumption -----------------------------------------------------------------------------


def test_mnist_files_are_placed_gzipped_where_the_reader_reads_them(server, archives,
                                                                   tmp_path):
    data = tmp_path / "data"
    lines = []
    ready = run(server, data, ["mnist"], lines, keep_archives=False)
    assert ready == {"mnist": str(data / "mnist")}  # configs/mnist.py's default data_dir
    names = sorted(f"{n}.gz" for pair in mnist.FILES.values() for n in pair)
    assert sorted(r["file"] for r in server.requests) == names
    assert sorted(os.listdir(data / "mnist")) == names
    assert os.listdir(data / "downloads") == [".lock"]  # --nokeep_archives moved them
    assert sum("sha256 verified" in line for line in lines) == 4
    for name in names:
        assert (data / "mnist" / name).read_bytes() == archives[name]
    test = lra.tasks.get("mnist").load(ready["mnist"], "test", 784)
    np.testing.assert_array_equal(test["inputs"], mnist.read_idx(
        str(data / "mnist" / "t10k-images-idx3-ubyte.gz"), mnist.IMAGES_MAGIC).reshape(3, 784))
    lines = []
    run(server, data, ["mnist"], lines)
    assert any("mnist: " in line and "already there; skipped" in line for line in lines)
    # The official sizes and checksums (tensorflow-datasets' url_checksums/mnist.txt).
    official = download.ARCHIVES["mnist_test_labels"]
    assert (official.size, official.sha256[:8], official.url) == (
        4542, "f7ae60f9", "https://storage.googleapis.com/cvdf-datasets/mnist/"
                          "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(transfer.DownloadError, match=r"offers \d+ bytes, the official file "
                                                     r"has 9912422"):
        run(server, tmp_path / "other", ["mnist"], archives=download.ARCHIVES)
    assert "mnist" not in download.resolve(["all"])  # all: LRA's tasks


def test_enwik8_and_text8_zips_go_where_the_reader_reads_them(server, archives, tmp_path):
    data = tmp_path / "data"
    ready = run(server, data, ["enwik8", "text8"])
    assert ready == {"enwik8": str(data / "enwik8"), "text8": str(data / "text8")}
    for name in ("enwik8", "text8"):  # the configs' default data_dir, the zip as it is
        assert (data / name / f"{name}.zip").read_bytes() == archives[f"{name}.zip"]
        # The reader takes it (named as the published file, so it must hold 10^8 bytes).
        with pytest.raises(DataError, match="100000000|10\\^8|100,000,000"):
            lra.tasks.get(name).load(ready[name], "test", 32)
    official = download.ARCHIVES["enwik8"]
    assert (official.size, official.sha256[:8]) == (36_445_475, "547994d9")
    assert (download.ARCHIVES["text8"].size, download.ARCHIVES["text8"].sha256[:8]) == (
        31_344_016, "a6640522")
    assert "enwik8" not in download.resolve(["all"])


def test_an_interrupted_download_continues_where_it_stopped(server, archives, tmp_path):
    data = tmp_path / "data"
    name = "aclImdb_v1.tar.gz"
    server.drop_after[name] = 1000
    with pytest.raises(transfer.DownloadError,
                       match=r"stopped at 1000 of \d+ bytes .*run the same command again"):
        run(server, data, ["text"], retries=0)
    part = data / "downloads" / (name + ".part")
    assert part.stat().st_size == 1000
    assert not (data / "text" / "aclImdb").exists()
    assert not (data / "text" / ".aclImdb.partial").exists()

    run(server, data, ["text"])
    assert server.requests[-1] == {"file": name, "range": "bytes=1000-", "if_range": '"v1"'}
    with open(data / "downloads" / name, "rb") as f:
        assert f.read() == archives[name]
    assert not part.exists()
    assert lra.tasks.get("text").load(str(data / "text"), "test", 8)["inputs"].shape == (6, 8)


def test_a_dropped_connection_is_resumed_within_one_run(server, archives, tmp_path):
    server.drop_after["lra_release.gz"] = 5000
    lines = []
    run(server, tmp_path, ["retrieval"], lines, retries=1)
    assert [r["range"] for r in server.requests] == [None, "bytes=5000-"]
    assert any("stopped at 5000 of" in line and "resuming" in line for line in lines)
    with open(tmp_path / "downloads" / "lra_release.gz", "rb") as f:
        assert f.read() == archives["lra_release.gz"]


def test_a_stalled_connection_keeps_what_it_received(server, archives, tmp_path):
    """1000 bytes, then silence past the timeout: the part keeps the 1000 bytes and the
    line says so (issue 35: "stopped at 0 bytes", the bytes lost with read(CHUNK))."""
    server.stall_after["lra_release.gz"] = 1000
    lines = []
    run(server, tmp_path, ["retrieval"], lines, retries=1, timeout=0.3)
    assert any("stopped at 1000 of" in line for line in lines), lines
    assert [r["range"] for r in server.requests] == [None, "bytes=1000-"]
    with open(tmp_path / "downloads" / "lra_release.gz", "rb") as f:
        assert f.read() == archives["lra_release.gz"]


def test_drops_that_bring_bytes_do_not_use_up_the_retries(server, archives, tmp_path):
    server.drop_after["lra_release.gz"] = [3000] * 4
    run(server, tmp_path, ["retrieval"], retries=1)
    assert [r["range"] for r in server.requests] == [None] + [
        f"bytes={3000 * k}-" for k in range(1, 5)]
    with open(tmp_path / "downloads" / "lra_release.gz", "rb") as f:
        assert f.read() == archives["lra_release.gz"]


def test_a_server_that_ignores_range_makes_it_start_over(server, archives, tmp_path):
    name = "cifar-10-python.tar.gz"
    server.drop_after[name] = 3000
    with pytest.raises(transfer.DownloadError):
        run(server, tmp_path, ["image"], retries=0)
    server.ignore_range = True
    lines = []
    run(server, tmp_path, ["image"], lines)
    assert server.requests[-1]["range"] == "bytes=3000-"
    assert any("starting over" in line for line in lines)
    with open(tmp_path / "downloads" / name, "rb") as f:
        assert f.read() == archives[name]


def test_a_file_changed_on_the_server_is_downloaded_anew(server, archives, tmp_path):
    name = "aclImdb_v1.tar.gz"
    server.drop_after[name] = 2000
    with pytest.raises(transfer.DownloadError):
        run(server, tmp_path, ["text"], retries=0)
    server.etag = '"v2"'  # If-Range no longer matches: the server sends the whole file
    lines = []
    run(server, tmp_path, ["text"], lines)
    assert server.requests[-1]["if_range"] == '"v1"'
    assert any("starting over" in line for line in lines)
    with open(tmp_path / "downloads" / name, "rb") as f:
        assert f.read() == archives[name]


# --- checksums and damaged archives ---------------------------------------------------------


def test_a_corrupted_archive_is_kept_and_nothing_is_unpacked(server, archives, tmp_path):
    name = "aclImdb_v1.tar.gz"
    good = table(server.files)
    bad = bytearray(archives[name])
    bad[len(bad) // 2] ^= 0xFF
    server.files[name] = bytes(bad)
    part = tmp_path / "downloads" / (name + ".part")
    expected = good["imdb"].sha256
    actual = hashlib.sha256(bad).hexdigest()
    message = (f"{re.escape(str(part))}: sha256 {actual} differs from the official {expected}"
               r" \(test\); the file is kept: delete it and run the same command again")
    with pytest.raises(DataError, match=message):
        run(server, tmp_path, ["text"], archives=good)
    assert part.read_bytes() == bad
    assert not (tmp_path / "text" / "aclImdb").exists()
    assert not (tmp_path / "text" / ".aclImdb.partial").exists()
    # Run again: the kept file is checked again, not downloaded again.
    before = len(server.requests)
    with pytest.raises(DataError, match="differs from the official"):
        run(server, tmp_path, ["text"], archives=good)
    assert len(server.requests) == before


def test_a_mirror_with_another_file_size_is_refused_before_downloading(server, tmp_path):
    official = download.ARCHIVES["imdb"]
    with pytest.raises(transfer.DownloadError,
                       match=rf"offers \d+ bytes, the official file has {official.size}"):
        run(server, tmp_path, ["text"], archives=download.ARCHIVES)
    assert not (tmp_path / "downloads" / "aclImdb_v1.tar.gz.part").exists()


@pytest.mark.parametrize("damage", ["crc", "truncated"])
def test_a_damaged_release_without_checksum_is_caught_while_unpacking(server, archives, tmp_path,
                                                                     damage):
    data = bytearray(archives["lra_release.gz"])
    if damage == "crc":  # only the gzip trailer's CRC-32 differs: every tar member reads fine
        data[-8] ^= 0xFF
    else:
        data = data[:len(data) // 2]
    server.files["lra_release.gz"] = bytes(data)
    with pytest.raises(DataError, match=r"lra_release.gz is damaged .*nothing was unpacked: "
                                        r"delete it"):
        run(server, tmp_path, ["retrieval", "listops"])
    assert sorted(os.listdir(tmp_path)) == ["downloads"]


def test_a_member_pointing_outside_its_folder_is_refused(server, tmp_path):
    server.files["aclImdb_v1.tar.gz"] = targz({"aclImdb/train/pos/0_9.txt": b"fine",
                                               "aclImdb/../../evil.txt": b"no"})
    with pytest.raises(DataError, match="points outside its folder"):
        run(server, tmp_path / "data", ["text"])
    assert not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "data" / "text" / "aclImdb").exists()


def test_an_archive_without_the_task_files_is_refused(server, tmp_path):
    server.files["lra_release.gz"] = targz({"lra_release/listops-1000/basic_train.tsv": b"x"})
    with pytest.raises(DataError, match="holds no new_aan_pairs.train.tsv, new_aan_pairs.eval"):
        run(server, tmp_path, ["retrieval"])
    assert not (tmp_path / "retrieval").exists()


# --- no network, disks, folders --------------------------------------------------------------


def test_offline_names_the_url_and_where_to_put_the_file(server, tmp_path):
    url = closed_port_url()
    by_hand = tmp_path / "downloads" / "aclImdb_v1.tar.gz"
    with pytest.raises(transfer.DownloadError,
                       match=rf"cannot reach {url}/aclImdb_v1.tar.gz \(.*\); check the network"
                             rf".*by hand to {re.escape(str(by_hand))}$"):
        run(server, tmp_path, ["text"], mirror=url, retries=0)


def test_an_http_error_names_the_url_and_the_code(server, tmp_path):
    official = table(server.files)
    del server.files["cifar-10-python.tar.gz"]
    with pytest.raises(transfer.DownloadError,
                       match=rf"{server.url}/cifar-10-python.tar.gz answered HTTP 404 Not Found; "
                             r"check the address \(--mirror\), or download the file by hand"):
        run(server, tmp_path, ["image"], archives=official)
    assert len(server.requests) == 1  # a 404 is not retried


def test_a_file_put_there_by_hand_is_verified_and_unpacked_offline(server, archives, tmp_path):
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "aclImdb_v1.tar.gz").write_bytes(archives["aclImdb_v1.tar.gz"])
    run(server, tmp_path, ["text"], mirror=closed_port_url(), retries=0)
    assert (tmp_path / "text" / "aclImdb" / "train" / "pos" / "0_7.txt").exists()


def test_not_enough_disk(server, archives, tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "free_bytes", lambda path: 10 << 20)
    with pytest.raises(UserError, match=r"not enough disk space in .*downloads: downloading "
                                        r"aclImdb_v1.tar.gz needs 0.0 MB"):
        run(server, tmp_path, ["text"])
    # Unpacking checks each file against the free space; nothing half-unpacked remains.
    (tmp_path / "downloads" / "aclImdb_v1.tar.gz").write_bytes(archives["aclImdb_v1.tar.gz"])
    with pytest.raises(UserError, match="not enough disk space in .*unpacking aclImdb/"):
        run(server, tmp_path, ["text"])
    assert os.listdir(tmp_path / "text") == []


def test_folders_that_are_not_ours(server, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="--data_dir=.*file is a file, not a folder"):
        run(server, tmp_path / "file", ["text"])
    (tmp_path / "retrieval").mkdir()
    (tmp_path / "retrieval" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="retrieval exists but is not a complete retrieval "
                                        "folder .*move it away"):
        run(server, tmp_path, ["retrieval"])
    assert os.listdir(tmp_path / "retrieval") == ["notes.txt"]
    assert server.requests == []


def test_progress_line():
    out = io.StringIO()
    p = transfer.Progress("x.tar.gz", 4_000_000, 0, out)
    for done in range(0, 4_000_001, 100_000):
        p.update(done)
    p.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10  # each 10% once (not a terminal); the end is not repeated
    assert re.fullmatch(r"x\.tar\.gz \[#{20}\] 100\.0% 4\.0/4\.0 MB [\d.]+ MB/s ETA 0:00",
                        lines[-1])

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = transfer.Progress("x", None, 0, out)
    p.update(2_500_000)
    p.finish()
    assert out.getvalue().startswith("\rx: 2.5 MB, ") and out.getvalue().endswith("\n")


# --- the command line: one line, no traceback -------------------------------------------------


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lra.download", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_command_line_errors_are_one_line(server, tmp_path):
    url = closed_port_url()
    r = cli("text", f"--data_dir={tmp_path}", "--retries=0", env={download.MIRROR_ENV: url})
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: cannot reach {url}/aclImdb_v1.tar.gz")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr

    # The official checksums against a mirror that serves another file.
    r = cli("image", f"--data_dir={tmp_path}", f"--mirror={server.url}")
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: {server.url}/cifar-10-python.tar.gz offers ")
    assert r.stderr.count("\n") == 1

    r = cli("texts", f"--data_dir={tmp_path}")
    assert r.returncode == 2 and r.stderr.startswith("error: unknown task 'texts'; choose")
