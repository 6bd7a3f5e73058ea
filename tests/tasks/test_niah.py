"""Needle in a haystack (lra/tasks/niah.py, configs/niah.py) and the depth protocol
(config.eval_depth_buckets): every row read back token by token (the needles found, the
query's answers recomputed from the context), RULER's needle counts per row, the depth
range, the errors, and a run through train_and_evaluate with lengths and depths."""
import json
import os

import numpy as np
import pytest

from configs import niah as niah_config
from lra.errors import ConfigError
from lra.tasks import niah

SIZES = dict(key_len=2, value_len=2, num_keys=32, num_values=32, num_filler=64,
             sentence_len=16)


def _parse(row, key_len, value_len):
    """(needles [(position, key, value)], queries [(key, answer tokens)]) read from a
    full row (the inputs and the last answer token)."""
    needles, queries, i = [], [], 0
    while i < len(row):
        if row[i] == niah.NEEDLE:
            key = tuple(row[i + 1:i + 1 + key_len])
            assert row[i + 1 + key_len] == niah.IS
            value = tuple(row[i + 2 + key_len:i + 2 + key_len + value_len])
            needles.append((i, key, value))
            i += 2 + key_len + value_len
        elif row[i] == niah.QUERY:
            key = tuple(row[i + 1:i + 1 + key_len])
            assert row[i + 1 + key_len] == niah.IS
            j = i + 2 + key_len
            while j < len(row) and row[j] != niah.QUERY:
                j += 1
            queries.append((key, tuple(row[i + 2 + key_len:j])))
            i = j
        else:
            i += 1
    return needles, queries


@pytest.mark.parametrize("variant", list(niah.VARIANTS))
def test_every_row_answers_its_query_from_its_needles(variant):
    spec = niah.VARIANTS[variant]
    data = niah.generate(num_examples=40, length=256, seed=3, **spec, **SIZES)
    assert data["inputs"].shape == (40, 256) and data["mask"].all()
    nk = max(spec["num_needle_k"], spec["num_needle_q"])
    for x, y in zip(data["inputs"], data["targets"]):
        labelled = np.flatnonzero(y != niah.IGNORE)
        full = np.append(x, y[labelled[-1]])  # the inputs and the last answer token
        # Each label is the next token of the row: teacher forcing.
        assert (y[labelled] == full[labelled + 1]).all()
        needles, queries = _parse(full, 2, 2)
        assert len(queries) == spec["num_needle_q"]
        by_key = {}
        for _, key, value in needles:
            by_key.setdefault(key, []).append(value)
        if spec["haystack"] == "needle":  # distractors: one needle per distinct key
            assert len(by_key) == len(needles) > 1
        else:
            assert len(by_key) == nk and len(needles) == nk * spec["num_needle_v"]
        for key, answer in queries:
            want = sum(by_key[key], ())  # the key's values in the order they stand
            assert answer == want
        # The labels are exactly the answer tokens.
        assert len(labelled) == spec["num_needle_q"] * spec["num_needle_v"] * 2
        assert set(np.unique(x[x >= niah.FIRST])) <= set(range(niah.FIRST, niah.vocab_size_of()))


def test_noise_needles_stand_between_sentences_and_depths_are_uniform():
    data = niah.generate(num_examples=2000, length=256, seed=0,
                         **niah.VARIANTS["single_1"], **SIZES)
    sentence = list(range(niah.FIRST + 64, niah.FIRST + 64 + 16))
    for x in data["inputs"][:50]:
        at = int(np.flatnonzero(x == niah.NEEDLE)[0])
        hay = np.concatenate([x[:at], x[at + 6:np.flatnonzero(x == niah.QUERY)[0]]])
        assert at % 16 == 0  # a sentence boundary
        assert list(hay[:16]) == sentence
    # RULER's slots are uniform: 246 haystack tokens hold 16 sentence boundaries.
    slots, counts = np.unique(data["depth"], return_counts=True)
    assert len(slots) == 16 and np.abs(counts / 2000 - 1 / 16).max() < 0.02, counts


@pytest.mark.parametrize("variant", ["single_2", "multikey_2", "multivalue"])
def test_the_test_split_keeps_its_needles_in_the_depth_range(variant):
    options = dict(niah.VARIANTS[variant], **SIZES, num_train_examples=8,
                   num_valid_examples=8, num_test_examples=200)
    for lo, hi in ((0.0, 0.2), (0.4, 0.6), (0.8, 1.0)):
        test = niah.read_split("test", 256, **niah.at_depth(options, lo, hi))
        rng = np.random.default_rng(niah.split_seeds(0)["test"])
        for n in range(20):  # the same rows, with their depths
            r = niah.make_row(rng, length=256, depth_min=lo, depth_max=hi,
                              **{k: options[k] for k in niah.VARIANTS[variant]}, **SIZES)
            assert ((r["depths"] >= lo) & (r["depths"] <= hi)).all()
            assert (r["tokens"][:-1] == test["inputs"][n]).all()
            assert (test["inputs"][n][r["slots"]] == niah.NEEDLE).all()
    train = niah.read_split("train", 256, **niah.at_depth(options, 0.8, 1.0))
    first = niah.read_split("train", 256, **options)
    assert (train["inputs"] == first["inputs"]).all()  # the range is the test's only


def test_errors_say_what_to_change():
    with pytest.raises(ConfigError, match="make the row longer"):
        niah.generate(num_examples=1, length=48, seed=0, **niah.VARIANTS["multiquery"],
                      **SIZES)
    with pytest.raises(ConfigError, match="distinct keys"):
        niah.generate(num_examples=1, length=256, seed=0, **niah.VARIANTS["multikey_2"],
                      **dict(SIZES, key_len=1))
    with pytest.raises(ConfigError, match="fewer than"):
        niah.generate(num_examples=1, length=8, seed=0, **niah.VARIANTS["multivalue"],
                      **SIZES)
    with pytest.raises(ConfigError, match="0 <= min < max <= 1"):
        niah.read_split("test", 64, test_depth_min=0.5, test_depth_max=0.5)
    with pytest.raises(ConfigError, match="variant='single'"):
        niah_config.get_config("variant=single")
    with pytest.raises(ConfigError, match="scaffold='grazzi'"):
        niah_config.get_config("scaffold=grazzi")


def test_config_builds_each_row_on_the_declared_scaffold():
    for variant, spec in niah.VARIANTS.items():
        c = niah_config.get_config(f"variant={variant},model=gla")
        assert {k: c.task_options[k] for k in spec} == spec
        assert c.scaffold.name == "zoology_mqar" and c.block.short_conv == 3
        assert c.causal and c.objective == "sequence_labels"
        assert c.eval_lengths == "512,1024,2048" and c.eval_depth_buckets == 5


def test_runlocal_tests_every_length_and_depth(tmp_path):
    from lra import train

    c = niah_config.get_config("model=gla,runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    r = json.load(open(os.path.join(tmp_path, "results.json")))
    assert r["task"] == "niah"
    assert [(x["length"], x["max_length"]) for x in r["length_accuracy"]] == [(96, 96)]
    depths = [(x["length"], x["depth_min"], x["depth_max"]) for x in r["depth_accuracy"]]
    assert depths == [(48, 0.0, 0.5), (48, 0.5, 1.0), (96, 0.0, 0.5), (96, 0.5, 1.0)]
    assert all(0.0 <= x["accuracy"] <= 1.0 for x in r["depth_accuracy"])


def test_a_run_stopped_during_its_length_tests_resumes_them_where_it_stopped(tmp_path,
                                                                            capsys):
    """Each length and depth test is kept in the workdir as it is tested, keyed by the
    test weights' digest: a run stopped among them (here: the file cut after two entries
    and mid-line, results.json gone) tests only the rest on resuming, says which rows it
    took, and writes the results an unstopped run writes. A kept row of other weights
    is tested again."""
    from lra import train
    from lra.training import lengths

    c = niah_config.get_config("model=gla,runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    first = json.load(open(tmp_path / "results.json"))
    kept = (tmp_path / lengths.TESTED_FILE).read_text().splitlines()
    assert len(kept) == 5  # (96) and 2 depths at 48 and at 96
    other = json.loads(kept[1])
    other["weights"] = "0" * 32
    (tmp_path / lengths.TESTED_FILE).write_text(
        "\n".join([kept[0], json.dumps(other), kept[2], kept[3][:20]]) + "\n")
    os.remove(tmp_path / "results.json")
    capsys.readouterr()
    train.train_and_evaluate(c, str(tmp_path))
    again = json.load(open(tmp_path / "results.json"))
    for field in ("length_accuracy", "depth_accuracy"):
        assert again[field] == first[field]
    resumed = capsys.readouterr().out
    reused = [line for line in resumed.splitlines() if "tested before" in line]
    assert len(reused) == 2, resumed  # kept[0] and kept[2]; kept[1]'s weights are others
    assert len((tmp_path / lengths.TESTED_FILE).read_text().splitlines()) == 4 + 3


def test_depth_buckets_are_refused_where_a_task_has_no_needles(tmp_path):
    from configs import mqar
    from lra import train

    c = mqar.get_config("model=linear,runlocal")
    c.eval_depth_buckets = 4
    with pytest.raises(ConfigError, match="no needle depth"):
        train.train_and_evaluate(c, str(tmp_path))


def test_mega_runs_past_its_training_length_as_mega_chunk(tmp_path):
    """Mega's relative bias spans max_len (chunk_size -1): past the training length it is
    tested as Mega-chunk with chunks of the training length, the trained weights as they
    are; inside it that is one chunk, the function trained (same outputs)."""
    from flax import nnx

    from lra import tasks, train
    from lra.training import lengths

    c = niah_config.get_config("model=mega,runlocal")
    assert c.model_hparams.chunk_size == -1
    task = tasks.get(c.task)
    at_same = lengths.config_at(c, c.max_length)
    assert at_same.model_hparams.chunk_size == -1 and lengths.extension(c, c.max_length) == {}
    chunked = c.copy_and_resolve_references()
    chunked.model_hparams.chunk_size = c.max_length  # what a longer length builds
    full, one_chunk = train.build_model(c, task), train.build_model(chunked, task)
    nnx.update(one_chunk, nnx.state(full, nnx.Param))
    x = np.random.default_rng(0).integers(1, 40, (2, c.max_length))
    np.testing.assert_allclose(np.asarray(full(x, deterministic=True)),
                               np.asarray(one_chunk(x, deterministic=True)), atol=1e-6)
    at_twice = lengths.config_at(c, 2 * c.max_length)
    assert at_twice.model_hparams.chunk_size == c.max_length and at_twice.max_length == 96

    # Capabilities.span_hparam drives it: every variant that declares one takes it.
    from models import registry

    spans = {n: registry.capabilities(n).span_hparam for n in registry.available()}
    assert spans["mega"] == "chunk_size"
    assert all(k in registry.accepted_hparams(n) for n, k in spans.items() if k)

    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    r = json.load(open(os.path.join(tmp_path, "results.json")))
    (row,) = r["length_accuracy"]
    assert (row["length"], row["model_hparams"]) == (96, {"chunk_size": 48})
    assert all("model_hparams" not in x for x in r["depth_accuracy"] if x["length"] == 48)


def test_the_length_tests_run_in_the_flash_form_equal_to_dense(tmp_path, monkeypatch):
    """configs/niah.py tests transformer's longer lengths and depths in its flash form
    (config.eval_attention_impl), trained in dense: the flash kernel is traced only for
    those tests, and they give what the dense form gives (accuracy equal, loss within
    float rounding)."""
    from lra import train
    from models.kernels import flash_attention

    calls = []
    chunked = flash_attention._FORMS["chunked"]
    monkeypatch.setitem(flash_attention._FORMS, "chunked",
                        lambda *a, **k: calls.append(1) or chunked(*a, **k))
    results = {}
    for impl in ("flash", ""):
        c = niah_config.get_config("model=transformer,runlocal")
        assert c.attention_impl == "dense" and c.eval_attention_impl == "flash"
        c.eval_attention_impl = impl
        c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
        calls.clear()
        train.train_and_evaluate(c, str(tmp_path / (impl or "dense")))
        results[impl] = json.load(open(tmp_path / (impl or "dense") / "results.json"))
        assert bool(calls) == (impl == "flash"), impl
    flash, dense = results["flash"], results[""]
    assert flash["test_accuracy"] == dense["test_accuracy"]
    for field in ("length_accuracy", "depth_accuracy"):
        assert len(flash[field]) == len(dense[field]) > 0
        for a, b in zip(flash[field], dense[field]):
            assert a["accuracy"] == b["accuracy"]
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_every_flash_tested_variant_takes_its_weights_in_that_form():
    """FLASH_TESTED's variants build in the flash form at the mini's length with the
    trained parameters' shapes; a variant without that form is refused before it trains,
    and so is an unknown form."""
    from flax import nnx

    from lra import tasks, train
    from lra.training import lengths

    task = tasks.get("niah")

    def at(c):
        return nnx.eval_shape(lambda: train.build_model(c, task))

    for model in niah_config.FLASH_TESTED:
        c = niah_config.get_config(f"model={model},mini")
        assert lengths.graphdef_at_training_length(c, at) is not None, model
    c = niah_config.get_config("model=gla,mini")
    assert c.eval_attention_impl == "" and lengths.graphdef_at_training_length(c, at) is None
    c.eval_attention_impl = "flash"
    with pytest.raises(ConfigError, match="eval_attention_impl='flash': gla cannot be built"):
        lengths.graphdef_at_training_length(c, at)
    c.eval_attention_impl = "fast"
    with pytest.raises(ConfigError, match="eval_attention_impl='fast'; choose one of"):
        from configs import common
        common.validate(c)


def test_the_tests_form_may_change_when_a_run_resumes():
    """A run recorded before eval_attention_impl existed, or with another value, resumes
    with the config's (it changes only the form the tests after training run in); a
    field that changes the training still refuses."""
    from lra.training import resume

    config = niah_config.get_config("model=transformer,runlocal")
    saved = config.to_dict()
    for before in ("", None):
        if before is None:
            saved.pop("eval_attention_impl")
        else:
            saved["eval_attention_impl"] = before
        resume.check_compatible(saved, config, "w", step=4, diverged=False)
    config.learning_rate = 0.5
    with pytest.raises(ConfigError, match="learning_rate"):
        resume.check_compatible(saved, config, "w", step=4, diverged=False)
