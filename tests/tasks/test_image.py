"""Image (CIFAR-10 grayscale): the python batches, TF's grayscale, splits, errors; a TFDS
cifar10 folder of the same images gives the same arrays, in the archive's order."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import lra.tasks
from lra.errors import ConfigError, DataError
from lra.tasks import image, tfds_folders
from tests.tasks.tfds_builders import Cifar10, prepare

PER_BATCH = 1002  # 5 batches: 5010 training images, so the 5000 held out leave 10


def write_cifar(root, seed=0, per_batch=PER_BATCH, num_test=6):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(seed)
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch",
                                                                            num_test)]:
        batch = {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, size=n).tolist(),
                 b"batch_label": name.encode(), b"filenames": [b"x.png"] * n}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
        batches[name] = batch
    return str(root), batches


def tf_gray_reference(rgb: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale of one [32, 32, 3] uint8 image, pixel by pixel (float64)."""
    out = np.zeros((32, 32), np.int64)
    for y in range(32):
        for x in range(32):
            r, g, b = (float(v) / 255 for v in rgb[y, x])
            out[y, x] = min(255, int((0.2989 * r + 0.5870 * g + 0.1140 * b) * 255.5))
    return out


def test_grayscale_matches_tf_on_known_colours():
    colours = np.array([[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255],
                        [128, 128, 128]], np.uint8)
    rows = np.repeat(colours[:, :, None], 1024, axis=2).reshape(len(colours), 3072)
    # TF: trunc(w . c / 255 * 255.5): black 0, white 255, red 76, green 149, blue 29, gray 128.
    np.testing.assert_array_equal(image.rgb_to_gray(rows)[:, 0], [0, 255, 76, 149, 29, 128])


def test_reads_pixels_row_major_with_an_all_true_mask(tmp_path):
    data_dir, batches = write_cifar(tmp_path)
    data = lra.tasks.get("image").load(data_dir, "test", 1024)
    raw = batches["test_batch"][b"data"]
    for n in range(len(raw)):
        rgb = raw[n].reshape(3, 32, 32).transpose(1, 2, 0)  # R, G, B planes, row-major
        expected = tf_gray_reference(rgb).reshape(-1)
        # float32 (TF) vs float64 here can differ by one at an exact truncation boundary.
        assert np.abs(data["inputs"][n] - expected).max() <= 1
        assert np.mean(data["inputs"][n] == expected) > 0.99
    np.testing.assert_array_equal(data["targets"], batches["test_batch"][b"labels"])
    assert data["inputs"].dtype == np.int32 and data["mask"].all()


def test_black_pixel_is_token_zero_not_padding(tmp_path):
    data_dir, batches = write_cifar(tmp_path)
    batches["test_batch"][b"data"][0] = 0
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump(batches["test_batch"], f)
    data = lra.tasks.get("image").load(data_dir, "test", 1024)
    assert (data["inputs"][0] == 0).all() and data["mask"][0].all()


def test_rgb_gives_every_sub_pixel_in_raster_order(tmp_path):
    data_dir, batches = write_cifar(tmp_path)
    raw = batches["test_batch"][b"data"]
    data = lra.tasks.get("image").load(data_dir, "test", 3080, pixels="rgb")
    assert data["inputs"].shape == (6, 3080) and data["inputs"].dtype == np.int32
    assert data["mask"][:, :3072].all() and not data["mask"][:, 3072:].any()
    for n in range(len(raw)):
        r, g, b = raw[n].reshape(3, 32, 32)  # the archive's row: R plane, G plane, B plane
        tokens = data["inputs"][n]
        # pixel (0, 0)'s R, G, B, then pixel (0, 1)'s ...; pixel (y, x) at 3 * (32 y + x)
        assert list(tokens[:6]) == [r[0, 0], g[0, 0], b[0, 0], r[0, 1], g[0, 1], b[0, 1]]
        np.testing.assert_array_equal(tokens[:3072].reshape(32, 32, 3),
                                      np.stack([r, g, b], axis=-1))
    np.testing.assert_array_equal(image.rgb_sub_pixels(raw), data["inputs"][:, :3072])
    with pytest.raises(ConfigError, match=r"max_length=3071 is shorter than a CIFAR-10 image "
                                          r"\(3072 sub-pixels with task_options.pixels=rgb\)"):
        lra.tasks.get("image").load(data_dir, "test", 3071, pixels="rgb")
    with pytest.raises(ConfigError, match="task_options.pixels='RGB'; choose 'gray'"):
        lra.tasks.get("image").load(data_dir, "test", 3072, pixels="RGB")
    # test_images: the first N test images (the generation mini's), nothing else.
    task = lra.tasks.get("image")
    first = task.load(data_dir, "test", 3072, pixels="rgb", test_images=4)
    np.testing.assert_array_equal(first["inputs"], data["inputs"][:4, :3072])
    assert len(task.load(data_dir, "val", 1024, validation="test", test_images=2)["targets"]) == 2
    assert len(task.load(data_dir, "train", 1024, validation="test", test_images=2)[
        "targets"]) == 5 * PER_BATCH
    with pytest.raises(ConfigError, match="test_images=-1"):
        task.load(data_dir, "test", 1024, test_images=-1)


def test_splits(tmp_path):
    data_dir, batches = write_cifar(tmp_path)
    task = lra.tasks.get("image")
    train = task.load(data_dir, "train", 1024)
    val = task.load(data_dir, "val", 1024)
    labels = np.concatenate([batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)])
    assert len(train["targets"]) == 5 * PER_BATCH - 5000 and len(val["targets"]) == 5000
    np.testing.assert_array_equal(np.concatenate([train["targets"], val["targets"]]), labels)
    np.testing.assert_array_equal(val["inputs"][-1], image.rgb_to_gray(
        batches["data_batch_5"][b"data"][-1:])[0])
    val_test = task.load(data_dir, "val", 1024, validation="test")
    np.testing.assert_array_equal(val_test["targets"], batches["test_batch"][b"labels"])
    with pytest.raises(ConfigError, match="validation"):
        task.load(data_dir, "val", 1024, validation="last")
    with pytest.raises(ConfigError, match="shorter than a CIFAR-10 image"):
        task.load(data_dir, "test", 1000)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(DataError, match="cifar-10-python.tar.gz"):
        lra.tasks.get("image").load(str(tmp_path), "test", 1024)
    data_dir, _ = write_cifar(tmp_path, per_batch=2)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"\x80\x04truncated")
    with pytest.raises(DataError, match=r"data_batch_3: not a CIFAR-10 python batch"):
        lra.tasks.get("image").load(data_dir, "train", 1024)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError, match=r"data_batch_3 does not exist.*cifar-10-python"):
        lra.tasks.get("image").load(data_dir, "train", 1024)


@pytest.fixture(scope="module")
def archive_and_tfds(tmp_path_factory):
    """The same 5016 images as python batches and as a TFDS cifar10 folder (ArrayRecord)."""
    root = tmp_path_factory.mktemp("cifar")
    (root / "archive").mkdir()
    archive, _ = write_cifar(root / "archive")
    version = prepare(Cifar10, root / "tfds", archive)
    return archive, str(root / "tfds"), version


def test_tfds_folder_gives_the_archive_arrays_in_its_order(archive_and_tfds):
    archive, tfds_dir, version = archive_and_tfds
    task = lra.tasks.get("image")
    for split, validation in (("train", "holdout"), ("val", "holdout"), ("test", "holdout"),
                              ("val", "test")):
        from_archive = task.load(archive, split, 1030, validation=validation)
        from_tfds = task.load(tfds_dir, split, 1030, validation=validation)
        for key, value in from_archive.items():
            np.testing.assert_array_equal(from_tfds[key], value)
            assert from_tfds[key].dtype == value.dtype
    np.testing.assert_array_equal(task.load(tfds_dir, "test", 3072, pixels="rgb")["inputs"],
                                  task.load(archive, "test", 3072, pixels="rgb")["inputs"])
    # TFDS stores the images shuffled: the order above is recovered from their ids.
    examples, _ = tfds_folders.read_split(version, "train", tfds_folders.CIFAR10, "",
                                          undecoded=("image",))
    ids = [bytes(e["id"]) for e in examples]
    assert ids != sorted(ids) and sorted(ids)[-1] == b"train_05009"


class IdsFromOne(Cifar10, skip_registration=True):
    """cifar10 whose ids count from 1: not the catalogue's numbering of the archive."""
    name = "cifar10"

    def _generate_examples(self, prefix, paths):
        for index, example in super()._generate_examples(prefix, paths):
            yield index, dict(example, id=f"{prefix}{index + 1:05d}")


def test_tfds_ids_that_do_not_number_the_split_are_refused(tmp_path):
    (tmp_path / "archive").mkdir()
    archive, _ = write_cifar(tmp_path / "archive", per_batch=2, num_test=3)
    version = prepare(IdsFromOne, tmp_path / "tfds", archive)
    with pytest.raises(DataError, match=r"3.0.2: the ids of split 'test' are not "
                                        r"test_00000..test_00002, so its images cannot"):
        lra.tasks.get("image").load(version, "test", 1024)
