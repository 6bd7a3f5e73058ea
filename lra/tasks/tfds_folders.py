"""TFDS folders as task data: the folders `tfds.load` / `tfds build` prepare, read in place.

A TFDS data_dir holds `<name>/[<config>/]<version>/` with `dataset_info.json`,
`features.json` and the record shards. `find` accepts the folder holding `<name>/` (the
usual `~/tensorflow_datasets`), `<name>/` itself, its config folder or the version folder.

Reading goes through tensorflow-datasets without TensorFlow: `tfds.builder_from_directory`
and its random-access `as_data_source` over ArrayRecord (or Parquet) shards, which parse
the stored `tf.train.Example`s with TFDS's NumPy parser. TFRecord shards (TFDS's default
format, and what LRA's pipeline prepared) can only be read by TensorFlow's record reader:
with TensorFlow installed they are read through `as_dataset` + `tfds.as_numpy`; without it
the error says what to install or how to convert the folder to ArrayRecord once.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from lra.errors import DataError

DATASET_INFO = "dataset_info.json"


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """One TFDS catalogue dataset as a task reads it: name, config, version, splits."""
    task: str
    name: str
    config: str  # "" for datasets without configs
    version: str
    splits: tuple[str, ...]

    @property
    def full_name(self) -> str:
        return "/".join(p for p in (self.name, self.config, self.version) if p)


IMDB_REVIEWS = Catalogue("text", "imdb_reviews", "plain_text", "1.0.0", ("train", "test"))
CIFAR10 = Catalogue("image", "cifar10", "", "3.0.2", ("train", "test"))
MNIST = Catalogue("mnist", "mnist", "", "3.0.1", ("train", "test"))
FASHION_MNIST = Catalogue("fashion_mnist", "fashion_mnist", "", "3.0.1", ("train", "test"))


def _subfolders(folder: str) -> list[str]:
    # TFDS writes `incomplete.<random>_<version>` while preparing and renames it when done;
    # `downloads/` is its default download_dir inside a data_dir.
    return sorted(f for f in os.listdir(folder) if os.path.isdir(os.path.join(folder, f))
                  and not f.startswith((".", "incomplete.")) and f != "downloads")


def _has_unfinished(folder: str) -> bool:
    return any(f.startswith("incomplete.") for f in os.listdir(folder))


def find(data_dir: str, dataset: Catalogue, how_to_get_data: str) -> str | None:
    """The version folder of `dataset` that data_dir names, or None if data_dir holds no
    TFDS folder of it. A TFDS folder with another config or version is a DataError."""
    data_dir = os.path.normpath(data_dir)
    if os.path.isfile(os.path.join(data_dir, DATASET_INFO)):
        return data_dir  # checked against the catalogue by `read_split`
    name_dir = None
    config_dir = None
    if os.path.isdir(os.path.join(data_dir, dataset.name)):
        name_dir = os.path.join(data_dir, dataset.name)
    elif os.path.basename(data_dir) == dataset.name:
        name_dir = data_dir
    elif (dataset.config and os.path.basename(data_dir) == dataset.config
          and os.path.basename(os.path.dirname(data_dir)) == dataset.name):
        config_dir = data_dir
    else:
        return None
    needed = f"the {dataset.task} task reads TFDS {dataset.full_name}"
    if config_dir is None:
        config_dir = name_dir
        if dataset.config:
            config_dir = os.path.join(name_dir, dataset.config)
            if not os.path.isdir(config_dir):
                found = ", ".join(_subfolders(name_dir)) or "none"
                raise DataError(f"TFDS folder {name_dir} has config(s) {found}, not "
                                f"{dataset.config}; {needed} (or: {how_to_get_data})")
    version_dir = os.path.join(config_dir, dataset.version)
    if not os.path.isdir(version_dir):
        found = ", ".join(_subfolders(config_dir)) or "none"
        unfinished = (" and an unfinished preparation (incomplete.*)"
                      if _has_unfinished(config_dir) else "")
        raise DataError(f"TFDS folder {config_dir} has version(s) {found}{unfinished}, not "
                        f"{dataset.version}; {needed} (or: {how_to_get_data})")
    if not os.path.isfile(os.path.join(version_dir, DATASET_INFO)):
        raise DataError(f"TFDS folder {version_dir} has no {DATASET_INFO}: not a finished "
                        f"TFDS preparation; prepare it again (or: {how_to_get_data})")
    return version_dir


def _one_line(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"  # library messages span lines


def _tensorflow_installed() -> bool:
    return importlib.util.find_spec("tensorflow") is not None


def _catalogue_builder(version_dir: str, dataset: Catalogue):
    """The catalogue's own builder on the data_dir that holds version_dir: for folders from
    TFDS <= 3.2.1, which have no features.json for `builder_from_directory`."""
    import tensorflow_datasets as tfds

    depth = 3 if dataset.config else 2  # <root>/<name>/[<config>/]<version>
    root = version_dir
    for _ in range(depth):
        root = os.path.dirname(root)
    return tfds.builder(f"{dataset.name}/{dataset.config}:{dataset.version}"
                        if dataset.config else f"{dataset.name}:{dataset.version}",
                        data_dir=root)


def read_split(version_dir: str, split: str, dataset: Catalogue, how_to_get_data: str, *,
               undecoded: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], Any]:
    """All examples of one TFDS split, in the order stored, as dicts of NumPy values / bytes,
    and the folder's `FeaturesDict` (to decode the `undecoded` features later, e.g. only the
    images a split keeps)."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import dataset_info, file_adapters

    try:
        proto = dataset_info.read_proto_from_builder_dir(version_dir)
    except Exception as e:  # noqa: BLE001  (unreadable or malformed JSON)
        raise DataError(f"{os.path.join(version_dir, DATASET_INFO)}: not a TFDS dataset info "
                        f"({_one_line(e)})") from None
    # TFDS before 4.x did not record the config: then the folder's name says it.
    config = proto.config_name
    if not config and dataset.config and proto.name == dataset.name:
        config = os.path.basename(os.path.dirname(version_dir))
    found = Catalogue(dataset.task, proto.name, config, proto.version, ())
    if (found.name, found.config, found.version) != (dataset.name, dataset.config,
                                                      dataset.version):
        raise DataError(f"TFDS folder {version_dir} holds {found.full_name}; the {dataset.task} "
                        f"task reads TFDS {dataset.full_name} (or: {how_to_get_data})")
    splits = [s.name for s in proto.splits]
    if split not in splits:
        raise DataError(f"TFDS folder {version_dir} has split(s) {', '.join(splits) or 'none'}, "
                        f"not {split!r}; the {dataset.task} task needs {', '.join(dataset.splits)}")
    # An empty file_format is a folder from before TFDS recorded it: TFRecord, the default.
    formats = {proto.file_format or file_adapters.FileFormat.TFRECORD.value,
               *proto.alternative_file_formats}
    random_access = sorted(f.value for f in file_adapters.FileFormat.with_random_access()
                           if f.value in formats)
    decoders = {name: tfds.decode.SkipDecoding() for name in undecoded} or None
    try:
        if random_access:
            builder = tfds.builder_from_directory(version_dir)
            source = builder.as_data_source(split, decoders=decoders,
                                            file_format=random_access[0])
            # One batched read: ArrayRecord fetches the records in parallel.
            return list(source.__getitems__(range(len(source)))), builder.info.features
        if not _tensorflow_installed():
            # The `tfds` command of tensorflow-datasets 4.9.x imports apache_beam and
            # mlcroissant for any subcommand, and reads TFRecords through TensorFlow.
            raise DataError(
                f"TFDS folder {version_dir} stores {'/'.join(sorted(formats))} records, which "
                "only TensorFlow reads: pip install tensorflow; or add ArrayRecord shards "
                "beside them once, where pip install tensorflow apache-beam mlcroissant is "
                f"done: tfds convert_format --dataset_version_dir={version_dir} "
                "--out_file_format=array_record")
        try:
            builder = tfds.builder_from_directory(version_dir)
        except ValueError:  # no features.json (TFDS <= 3.2.1): the catalogue's code knows them
            builder = _catalogue_builder(version_dir, dataset)
        # Shards in order, as as_data_source does, so both formats give one order.
        stream = builder.as_dataset(split, decoders=decoders, shuffle_files=False)
        return list(tfds.as_numpy(stream)), builder.info.features
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  (missing or truncated shards, bad records)
        raise DataError(f"TFDS folder {version_dir}: cannot read split {split!r} "
                        f"({_one_line(e)})") from None
