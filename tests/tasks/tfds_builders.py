"""TFDS builders with the catalogue's names, configs, features and versions of imdb_reviews
(plain_text, 1.0.0), cifar10 (3.0.2) and mnist (3.0.1), for tests: they prepare real TFDS
folders from an archive layout in `manual_dir` (aclImdb/, cifar-10-batches-py/, MNIST's
four IDX files), as the catalogue's builders do from the downloaded archives.

Catalogue facts kept: imdb_reviews' key is the archive path and its text the file's bytes
stripped; cifar10's `id` numbers images `train_00000`... in batch order; mnist's key is
the image's index in the IDX file and it has no `id` (TFDS stores it shuffled by key).
One difference: the catalogue encodes the numpy images to PNG with TensorFlow, these
builders hand TFDS a PIL image to encode (lossless PNG either way), so that no TensorFlow
is needed.
"""
from __future__ import annotations

import pickle

import numpy as np
import PIL.Image
import tensorflow_datasets as tfds
from etils import epath

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck"]  # batches.meta.txt, which the catalogue reads them from


# skip_registration: the catalogue's own builders own these names in TFDS's registry.
class ImdbReviews(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    name = "imdb_reviews"
    # TFDS finds a builder's source (for its checksums file) through the package; `tests`
    # is a namespace package, which needs importlib_resources there. The file says it.
    code_path = epath.Path(__file__)
    MANUAL_DOWNLOAD_INSTRUCTIONS = "aclImdb/ in manual_dir"
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="plain_text", description="Plain text",
                                               version=tfds.core.Version("1.0.0"))]
    SPLITS = {"train": "train", "test": "test", "unsupervised": "train"}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "text": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=["neg", "pos"]),
            }),
            supervised_keys=("text", "label"),
        )

    def _split_generators(self, dl_manager):
        root = dl_manager.manual_dir / "aclImdb"
        return {split: self._generate_examples(root, folder, split != "unsupervised")
                for split, folder in self.SPLITS.items()}

    def _generate_examples(self, root, folder, labeled):
        for label in ("neg", "pos") if labeled else ("unsup",):
            for path in sorted((root / folder / label).glob("*.txt")):
                yield f"aclImdb/{folder}/{label}/{path.name}", {
                    "text": path.read_bytes().strip(), "label": label if labeled else -1}


class Cifar10(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    name = "cifar10"
    code_path = epath.Path(__file__)  # as ImdbReviews
    MANUAL_DOWNLOAD_INSTRUCTIONS = "cifar-10-batches-py/ in manual_dir"
    VERSION = tfds.core.Version("3.0.2")
    SPLITS = {"train": ("train_", [f"data_batch_{i}" for i in range(1, 6)]),
              "test": ("test_", ["test_batch"])}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "image": tfds.features.Image(shape=(32, 32, 3)),
                "label": tfds.features.ClassLabel(names=CIFAR10_NAMES),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        root = dl_manager.manual_dir / "cifar-10-batches-py"
        return {split: self._generate_examples(prefix, [root / f for f in files])
                for split, (prefix, files) in self.SPLITS.items()}

    def _generate_examples(self, prefix, paths):
        index = 0
        for path in paths:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
            for row, label in zip(batch[b"data"], batch[b"labels"]):
                image = PIL.Image.fromarray(np.asarray(row).reshape(3, 32, 32).transpose(1, 2, 0))
                yield index, {"id": f"{prefix}{index:05d}", "image": image, "label": int(label)}
                index += 1


class Mnist(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    name = "mnist"
    code_path = epath.Path(__file__)  # as ImdbReviews
    MANUAL_DOWNLOAD_INSTRUCTIONS = "the four IDX files (.gz) in manual_dir"
    VERSION = tfds.core.Version("3.0.1")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(28, 28, 1)),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        from lra.tasks import mnist

        return {split: self._generate_examples(*(dl_manager.manual_dir / f"{name}.gz"
                                                 for name in mnist.FILES[split]))
                for split in ("train", "test")}

    def _generate_examples(self, images_path, labels_path):
        from lra.tasks import mnist

        images = mnist.read_idx(str(images_path), mnist.IMAGES_MAGIC)
        labels = mnist.read_idx(str(labels_path), mnist.LABELS_MAGIC)
        for index, (image, label) in enumerate(zip(images, labels)):
            yield index, {"image": PIL.Image.fromarray(image, mode="L"), "label": int(label)}


def prepare(builder_cls, data_dir, manual_dir, file_format="array_record") -> str:
    """download_and_prepare into data_dir from the archive layout in manual_dir; returns the
    version folder."""
    builder = builder_cls(data_dir=str(data_dir), file_format=file_format)
    builder.download_and_prepare(
        download_dir=str(data_dir) + "_downloads",  # keeps data_dir to the dataset folders
        download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
    return str(builder.data_dir)
