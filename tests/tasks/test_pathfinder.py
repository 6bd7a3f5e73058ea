"""Pathfinder: labels decidable from the image, LRA's release layout, reader and its errors."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

import lra.tasks
from lra.errors import ConfigError, DataError
from lra.tasks import pathfinder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARD = "curv_contour_length_14"


def _agreement(num_images: int, seed: int) -> tuple[float, float]:
    """(fraction whose markers are joined exactly when the label is 1, fraction positive)."""
    agree = positives = 0
    for i in range(num_images):
        image, label, markers = pathfinder.generate_image(
            32, 14, pathfinder._image_rng(seed, 32, 14, i))
        agree += pathfinder.markers_connected(image, markers) == bool(label)
        positives += label
    return agree / num_images, positives / num_images


def test_labels_decidable_from_the_image():
    agreement, positives = _agreement(50, seed=123)
    assert agreement == 1.0
    assert 0.3 < positives < 0.7


@pytest.mark.slow
def test_labels_decidable_from_the_image_1000():
    agreement, positives = _agreement(1000, seed=7)
    print(f"agreement {agreement:.4f}, positives {positives:.3f}")
    assert agreement >= 0.99
    assert 0.45 < positives < 0.55


def test_markers_connected_is_a_real_check():
    image = np.zeros((16, 16), np.uint8)
    image[4, 2:12] = 200  # one stroke from (2, 4) to (11, 4)
    image[10, 2:12] = 200
    assert pathfinder.markers_connected(image, np.array([[2.5, 4.5], [11.5, 4.5]]))
    assert not pathfinder.markers_connected(image, np.array([[2.5, 4.5], [11.5, 10.5]]))
    image[4:11, 7] = 200  # a bridge joins the two strokes
    assert pathfinder.markers_connected(image, np.array([[2.5, 4.5], [11.5, 10.5]]))


def test_image_content():
    rng = pathfinder._image_rng(0, 32, 14, 3)
    image, label, markers = pathfinder.generate_image(32, 14, rng)
    assert image.shape == (32, 32) and image.dtype == np.uint8
    # Anti-aliased: intermediate gray levels, not just 0/255.
    assert len(np.unique(image)) > 10
    # Markers are drawn: the pixel under each centre is bright.
    for x, y in np.floor(markers).astype(int):
        assert image[y, x] > 200
    ink = image > pathfinder.BINARY_THRESHOLD
    _, num = ndimage.label(ink, structure=np.ones((3, 3)))
    assert num >= 4  # two target contours and distractors, not one blob


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
    for i, row in enumerate(rows):
        fields = row.split(" ")
        assert fields[:3] == ["imgs/1", f"sample_{i}.png", str(i)]
        assert fields[3] in ("0", "1")
        markers = np.array(fields[4:], dtype=float).reshape(2, 2)
        image = np.asarray(Image.open(os.path.join(root, "imgs", "1", f"sample_{i}.png")))
        assert image.shape == (32, 32)
        # The metadata's label is the image's: markers joined iff positive.
        assert pathfinder.markers_connected(image, markers) == (fields[3] == "1")


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
    with pytest.raises(DataError, match="pathfinder32/curv_baseline/metadata.*lra_release"):
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
    real = pathfinder._write_folder
    monkeypatch.setattr(pathfinder, "_write_folder",
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
