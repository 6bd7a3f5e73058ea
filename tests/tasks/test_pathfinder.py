"""Pathfinder: our generator draws what the original draws; the reader takes every form."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import lra.tasks
from lra.errors import ConfigError, DataError
from lra.tasks import pathfinder
from lra.tasks import pathfinder_generator as gen

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARD = "curv_contour_length_14"
# Made by the original generator (github.com/drewlinsley/pathfinder, snakes2.py, run
# unmodified with LRA's settings by run_original.py there; np.random.seed(seed), one stream
# for all images): its images, its np.save'd metadata, and the marker centres it drew.
ORIGINAL = os.path.join(REPO, "tests", "data", "pathfinder_original")


@pytest.mark.parametrize("res,seed,n", [(32, 1, 10), (128, 2, 2)])
def test_images_equal_the_original_generators(res, seed, n):
    """Drawn from the same NumPy stream, every pixel, label, marker and metadata field is
    the original's (at 128 px also the per-image margin, 2 or 3)."""
    root = os.path.join(ORIGINAL, f"pathfinder{res}", HARD)
    rows = np.load(os.path.join(root, "metadata", "0.npy"))
    with open(os.path.join(ORIGINAL, f"markers{res}_seed{seed}.json")) as f:
        markers = json.load(f)
    rs = np.random.RandomState(seed)
    for i in range(n):
        image, label, info = gen.draw_image(gen.SETTINGS[res], 14, rs)
        original = np.asarray(Image.open(os.path.join(root, "imgs", "0", f"sample_{i}.png")))
        np.testing.assert_array_equal(image, original, err_msg=f"image {i}")
        assert info["markers"] == markers[2 * i:2 * i + 2]
        row = gen.metadata_row(0, i, label, gen.SETTINGS[res], 14, info["margin"])
        assert row == " ".join(rows[i])


def test_contours_are_dashed_and_the_label_is_not_a_flood_fill(generated):
    """What made the old stimulus easy: with dashed paddles and crossing contours, the
    markers of most positives are not joined by ink, and some negatives' are."""
    stats = pathfinder.statistics(os.path.join(generated, "pathfinder32", HARD))
    assert stats["images"] == 10
    assert stats["flood fill joins the markers, positives"] < 0.5
    assert 0.2 < stats["fraction of pixels > 0"] < 0.6  # Lanczos ringing, as the original
    assert stats["mean of non-zero pixels"] < 100  # gray strokes, not white


def test_statistics_of_the_originals_output_on_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tasks.pathfinder",
         f"--stats={os.path.join(ORIGINAL, 'pathfinder32', HARD)}"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "images" in proc.stdout and "8-connected components above 64" in proc.stdout


def test_reader_takes_the_original_generators_output_unchanged():
    """metadata/0.npy there is a binary .npy array of 11-field string rows."""
    with open(os.path.join(ORIGINAL, "pathfinder32", HARD, "metadata", "0.npy"), "rb") as f:
        assert f.read(6) == b"\x93NUMPY"
    task = lra.tasks.get("pathfinder")
    rows = np.load(os.path.join(ORIGINAL, "pathfinder32", HARD, "metadata", "0.npy"))
    for split, (lo, hi) in {"train": (0, 8), "val": (8, 9), "test": (9, 10)}.items():
        data = task.load(ORIGINAL, split, 1024)
        for n, row in enumerate(rows[lo:hi]):
            pixels = np.asarray(Image.open(os.path.join(ORIGINAL, "pathfinder32", HARD,
                                                        row[0], row[1])))
            np.testing.assert_array_equal(data["inputs"][n], pixels.reshape(-1))
            assert data["targets"][n] == int(row[3])


def test_reader_takes_python2_byte_string_arrays(tmp_path):
    """The original ran under Python 2, where np.save wrote byte strings (dtype S)."""
    _, labels, root = _release_folder(tmp_path)
    table = np.array([[b"imgs/0", f"sample_{i}.png".encode(), str(i).encode(),
                       str(labels[i]).encode(), b"1.0", b"14", b"4", b"2", b"0.5", b"1", b"1"]
                      for i in range(10)])
    assert table.dtype.kind == "S"
    with open(root / "metadata" / "0.npy", "wb") as f:
        np.save(f, table)
    data = lra.tasks.get("pathfinder").load(str(tmp_path), "train", 64, resolution=8)
    np.testing.assert_array_equal(data["targets"], labels[:8])


@pytest.mark.parametrize("content,message", [
    (b"\x00\xff\xfe binary", "holds binary data that is neither text nor a .npy array"),
    ("npy-floats", r"holds a NumPy array of shape \(3,\) and dtype float64; expected rows"),
    ("imgs/0 sample_0.png 0\n", r"0\.npy:1: a row of 3 field\(s\); expected rows"),
])
def test_bad_metadata_says_what_the_file_holds(tmp_path, content, message):
    _, _, root = _release_folder(tmp_path)
    path = root / "metadata" / "0.npy"
    if content == "npy-floats":
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(DataError, match=message):
        lra.tasks.get("pathfinder").load(str(tmp_path), "train", 64, resolution=8)


def _generated(tmp_path_factory, workers: int, num_images: int = 10):
    out = tmp_path_factory.mktemp(f"pathfinder_w{workers}")
    pathfinder.generate(str(out), resolution=32, difficulty="hard", num_images=num_images,
                        seed=5, workers=workers, images_per_folder=4, verbose=False)
    return str(out)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return _generated(tmp_path_factory, workers=1)


def test_layout_and_metadata_rows(generated):
    root = os.path.join(generated, "pathfinder32", HARD)
    assert sorted(os.listdir(os.path.join(root, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
    assert sorted(os.listdir(os.path.join(root, "imgs", "2"))) == ["sample_0.png",
                                                                   "sample_1.png"]
    rows = open(os.path.join(root, "metadata", "1.npy")).read().splitlines()
    assert len(rows) == 4
    with open(os.path.join(root, "extra", "1.json")) as f:
        extra = json.load(f)
    for i, row in enumerate(rows):
        # LRA's 11 fields: folder, file, index, label, continuity, contour length,
        # distractor length, paddle length, thickness, margin, number of paddle contrasts.
        assert row.split(" ") == ["imgs/1", f"sample_{i}.png", str(i), str(extra[i]["label"]),
                                  "1.0", "14", "4", "2", "0.5", "1", "1"]
        image = np.asarray(Image.open(os.path.join(root, "imgs", "1", f"sample_{i}.png")))
        assert image.shape == (32, 32) and image.max() == 255
        for r, c in extra[i]["markers"]:  # marker centres are bright (side file, not rows)
            assert image[r, c] > 150


def test_output_does_not_depend_on_workers(generated, tmp_path_factory):
    # The command line, with two spawned workers, writes the same bytes as one process.
    out = tmp_path_factory.mktemp("pathfinder_cli")
    code = ("import sys; from lra.tasks import pathfinder; "
            f"pathfinder.generate({str(out)!r}, num_images=10, seed=5, workers=2, "
            "images_per_folder=4, verbose=False)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
    for sub in ("metadata", "imgs/0", "imgs/2"):
        a = os.path.join(generated, "pathfinder32", HARD, sub)
        b = os.path.join(str(out), "pathfinder32", HARD, sub)
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        for name in os.listdir(a):
            assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name),
                                                                    "rb").read()


def test_command_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tasks.pathfinder", f"--output_dir={tmp_path}",
         "--resolution=32", "--difficulty=easy", "--num_images=3", "--workers=1"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = open(tmp_path / "pathfinder32" / "curv_baseline" / "metadata" / "0.npy").readlines()
    assert len(rows) == 3


def test_command_line_mistakes_are_not_tracebacks(tmp_path):
    """Issue 35: --seed=-1 and an --output_dir that cannot be written were tracebacks."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for args, needle in ((["--seed=-1", f"--output_dir={tmp_path}"], "--seed=-1"),
                         ([f"--output_dir={blocker}/x"], f"error: cannot write {blocker}/x")):
        proc = subprocess.run([sys.executable, "-m", "lra.tasks.pathfinder", *args,
                               "--num_images=2", "--workers=1"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert needle in proc.stderr, proc.stderr


def test_reader_on_generated_set(generated):
    root = os.path.join(generated, "pathfinder32", HARD)
    rows = []
    for k in range(3):
        rows += open(os.path.join(root, "metadata", f"{k}.npy")).read().splitlines()
    task = lra.tasks.get("pathfinder")
    sizes = {}
    for split, (lo, hi) in {"train": (0, 8), "val": (8, 9), "test": (9, 10)}.items():
        data = task.load(generated, split, 1024)
        sizes[split] = len(data["targets"])
        assert data["inputs"].dtype == np.int32 and data["inputs"].shape == (hi - lo, 1024)
        assert data["mask"].all()  # a black pixel is token 0, not padding
        for n, row in enumerate(rows[lo:hi]):
            folder, file, _, label = row.split(" ")[:4]
            pixels = np.asarray(Image.open(os.path.join(root, folder, file)))
            np.testing.assert_array_equal(data["inputs"][n], pixels.reshape(-1))
            assert data["targets"][n] == int(label)
    assert sizes == {"train": 8, "val": 1, "test": 1}


def _release_folder(tmp_path, resolution=8, rows=None, n=10):
    """A folder in LRA's release layout, by hand: 4-column rows, no marker columns."""
    root = tmp_path / f"pathfinder{resolution}" / HARD
    (root / "metadata").mkdir(parents=True)
    (root / "imgs" / "0").mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, resolution, resolution), dtype=np.uint8)
    labels = rng.integers(0, 2, size=n)
    for i in range(n):
        Image.fromarray(images[i], mode="L").save(root / "imgs" / "0" / f"sample_{i}.png")
    rows = rows or [f"imgs/0 sample_{i}.png {i} {labels[i]}" for i in range(n)]
    (root / "metadata" / "0.npy").write_text("\n".join(rows) + "\n")
    return images, labels, root


def test_reader_on_release_layout_any_resolution(tmp_path):
    images, labels, _ = _release_folder(tmp_path)
    data = lra.tasks.get("pathx").load(str(tmp_path), "train", 70, resolution=8)
    np.testing.assert_array_equal(data["inputs"][:, :64], images[:8].reshape(8, -1))
    assert (data["inputs"][:, 64:] == 0).all()
    np.testing.assert_array_equal(data["mask"], np.arange(70)[None].repeat(8, 0) < 64)
    np.testing.assert_array_equal(data["targets"], labels[:8])


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(DataError, match="python -m lra.tasks.pathfinder"):
        lra.tasks.get("pathfinder").load(str(tmp_path / "nope"), "train", 1024)
    with pytest.raises(DataError, match="pathfinder32/curv_baseline/metadata.*lra.download pathfinder"):
        lra.tasks.get("pathfinder").load(str(tmp_path), "train", 1024, difficulty="easy")


def test_corrupt_image_names_the_file_and_line(tmp_path):
    _, _, root = _release_folder(tmp_path)
    (root / "imgs" / "0" / "sample_3.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match=r"sample_3\.png \(listed at .*0\.npy:4\)"):
        lra.tasks.get("pathfinder").load(str(tmp_path), "train", 64, resolution=8)


def test_bad_rows_name_the_file_and_line(tmp_path):
    rows = [f"imgs/0 sample_{i}.png {i} 1" for i in range(10)]
    rows[5] = "imgs/0 sample_5.png 5 2"
    _release_folder(tmp_path, rows=rows)
    with pytest.raises(DataError, match=r"0\.npy:6: label '2'"):
        lra.tasks.get("pathfinder").load(str(tmp_path), "train", 64, resolution=8)


def test_wrong_size_and_short_max_length(tmp_path):
    _release_folder(tmp_path)
    with pytest.raises(ConfigError, match="max_length=50 is shorter"):
        lra.tasks.get("pathfinder").load(str(tmp_path), "train", 50, resolution=8)
    os.rename(tmp_path / "pathfinder8", tmp_path / "pathfinder9")
    with pytest.raises(DataError, match="image is 8x8, expected 9x9"):
        lra.tasks.get("pathfinder").load(str(tmp_path), "train", 81, resolution=9)


def test_bad_generator_arguments(tmp_path):
    with pytest.raises(ConfigError, match="resolution"):
        pathfinder.generate(str(tmp_path), resolution=48, num_images=1, verbose=False)
    with pytest.raises(ConfigError, match="difficulty"):
        pathfinder.generate(str(tmp_path), difficulty="extreme", num_images=1, verbose=False)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match="a_file is a file, not a folder"):
        pathfinder.generate(str(tmp_path / "a_file"), num_images=1, verbose=False)


def test_a_stopped_generation_resumes(generated, tmp_path, monkeypatch):
    """Complete folders are kept, the rest written again; the result is the same bytes."""
    out = str(tmp_path)
    kwargs = dict(resolution=32, difficulty="hard", num_images=10, seed=5, workers=1,
                  images_per_folder=4, verbose=False)
    pathfinder.generate(out, **kwargs)
    root = os.path.join(out, "pathfinder32", HARD)
    os.remove(os.path.join(root, "metadata", "1.npy"))  # stopped while writing folder 1
    with open(os.path.join(root, "metadata", "2.npy"), "w") as f:
        f.write("imgs/2 sample_0.png 0 1\n")  # a short file is not complete
    written = []
    real = gen._write_folder
    monkeypatch.setattr(gen, "_write_folder",
                        lambda job: written.append(job[1]) or real(job))
    pathfinder.generate(out, **kwargs)
    assert written == [1, 2]
    for sub in ("metadata", "imgs/1", "imgs/2"):
        a = os.path.join(generated, "pathfinder32", HARD, sub)
        for name in os.listdir(a):
            assert (open(os.path.join(a, name), "rb").read()
                    == open(os.path.join(root, sub, name), "rb").read())
    with pytest.raises(ConfigError, match="generated with"):
        pathfinder.generate(out, **dict(kwargs, seed=6))
