"""GLUE tasks, metrics, the GLUE average, data loading and tokenisation (no fine-tuning here)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn import metrics as sk

from glue.data import collate, encode_split, load_splits, prepare_tokenizer, resolve_tasks
from glue.tasks import (
    ALL_ENTRIES,
    METRIC_RANGES,
    METRICS,
    TASKS,
    GlueError,
    accuracy,
    describe_average,
    f1,
    get_task,
    glue_average,
    matthews,
    pearson,
    spearman,
)
from tests.helpers import SHARED_DATA, requires_shared_data
from trainer.tokenizer import train_wordpiece

# ---- metrics --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_classification_metrics_equal_scikit_learn_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    labels, predictions = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    assert accuracy(labels, predictions) == pytest.approx(sk.accuracy_score(labels, predictions))
    assert f1(labels, predictions) == pytest.approx(sk.f1_score(labels, predictions))
    assert matthews(labels, predictions) == pytest.approx(sk.matthews_corrcoef(labels, predictions))
    three_way = rng.integers(0, 3, 300), rng.integers(0, 3, 300)  # MNLI
    assert accuracy(*three_way) == pytest.approx(sk.accuracy_score(*three_way))


@pytest.mark.parametrize("seed", range(3))
def test_correlations_equal_scipy_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    labels = rng.uniform(0, 5, 300)
    predictions = labels + rng.normal(0, 2, 300)
    assert pearson(labels, predictions) == pytest.approx(stats.pearsonr(labels, predictions).statistic)
    assert spearman(labels, predictions) == pytest.approx(stats.spearmanr(labels, predictions).statistic)


def test_metrics_on_a_hand_made_case():
    labels = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    predictions = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]  # TP 3, FN 1, FP 1, TN 5
    assert accuracy(labels, predictions) == pytest.approx(0.8)
    assert f1(labels, predictions) == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert matthews(labels, predictions) == pytest.approx((3 * 5 - 1 * 1) / math.sqrt(4 * 4 * 6 * 6))
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228))
    assert spearman([1, 2, 3, 4], [10, 20, 25, 100]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_a_constant_predictor_scores_what_it_knows_nothing():
    labels = np.array([0] * 146 + [1] * 131)  # RTE's dev labels
    always_0, always_1 = np.zeros_like(labels), np.ones_like(labels)
    assert matthews(labels, always_0) == 0.0 and matthews(labels, always_1) == 0.0
    assert accuracy(labels, always_0) == pytest.approx(146 / 277)  # the majority share
    assert f1(labels, always_0) == 0.0  # never predicts the positive class
    assert f1(labels, always_1) == pytest.approx(2 * 131 / (131 + 277))  # precision 131/277, recall 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConstantInputWarning, no NaN
        assert pearson([0.0, 2.5, 5.0], [3.0, 3.0, 3.0]) == 0.0
        assert spearman([0.0, 2.5, 5.0], [3.0, 3.0, 3.0]) == 0.0


# ---- tasks and the GLUE average ------------------------------------------------------------------------


def test_registry_holds_the_eight_bert_tasks_with_their_official_metrics():
    assert set(TASKS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"}
    main = {name: task.main_metric for name, task in TASKS.items()}
    assert main == {"cola": "matthews", "sst2": "accuracy", "mrpc": "f1", "qqp": "f1", "stsb": "pearson",
                    "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy"}
    assert TASKS["mrpc"].metrics == ("f1", "accuracy") and TASKS["stsb"].metrics == ("pearson", "spearman")
    assert TASKS["stsb"].is_regression and TASKS["mnli"].num_labels == 3
    assert TASKS["mnli"].validation_splits == ("validation_matched", "validation_mismatched")
    assert sorted(entry for task in TASKS.values() for entry, _ in task.entries) == sorted(ALL_ENTRIES)
    assert all(set(task.metrics) <= set(METRICS) for task in TASKS.values())


def test_glue_average_counts_mnli_m_and_mm_as_bert_and_cramming_do():
    # BERT-base, Devlin et al. Table 1: the printed average 79.6 is the mean of these 9 numbers.
    bert_base = {"mnli-m": 84.6, "mnli-mm": 83.4, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5, "cola": 52.1,
                 "stsb": 85.8, "mrpc": 88.9, "rte": 66.4}
    assert round(glue_average(bert_base), 1) == 79.6
    assert "all 9 entries" in describe_average(bert_base)
    partial = {"rte": 0.5, "sst2": 0.8}
    assert glue_average(partial) == pytest.approx(0.65)
    assert "2 of the 9" in describe_average(partial) and "rte, sst2" in describe_average(partial)


@pytest.mark.parametrize("name", ["wnli", "squad", "mnli-x"])
def test_unknown_tasks_are_named_in_the_error(name):
    with pytest.raises(GlueError, match=f"unknown GLUE task '{name}'.*choose from cola"):
        get_task(name)
    with pytest.raises(GlueError, match=name):
        resolve_tasks(f"rte,{name}")


def test_task_lists_resolve_without_data():
    assert [task.name for task in resolve_tasks("rte, SST-2,rte")] == ["rte", "sst2"]
    assert len(resolve_tasks("all")) == len(resolve_tasks("available")) == 8  # the hub has every task
    assert [task.name for task in resolve_tasks(["stsb"])] == ["stsb"]


# ---- data ---------------------------------------------------------------------------------------------------


@requires_shared_data
@pytest.mark.parametrize("name", ["cola", "sst2", "mrpc", "stsb", "rte"])
def test_present_task_loads_with_its_columns_and_label_range(name):
    task = TASKS[name]
    splits = load_splits(task, SHARED_DATA)
    assert set(splits) == {"train", "validation"}
    for split in splits.values():
        assert set(task.text_columns) | {"label"} <= set(split.column_names)
        labels = np.asarray(split["label"])
        if task.is_regression:
            assert labels.min() >= 0.0 and labels.max() <= 5.0 and len(np.unique(labels)) > 10
        else:
            assert set(np.unique(labels)) == set(range(task.num_labels))
        assert all(isinstance(text, str) and text for column in task.text_columns for text in split[column][:50])


@requires_shared_data
def test_available_means_train_and_validation_present_and_qnli_is_validation_only():
    assert [task.name for task in resolve_tasks("available", SHARED_DATA)] == ["cola", "sst2", "mrpc", "stsb", "rte"]
    qnli = pd.read_parquet(SHARED_DATA / "glue" / "qnli" / "validation.parquet")
    assert {"question", "sentence", "label"} <= set(qnli.columns) and set(qnli.label) == {0, 1}
    with pytest.raises(GlueError, match=r"task qnli: validation only: .*qnli/train.parquet is missing"):
        resolve_tasks("qnli", SHARED_DATA)


@requires_shared_data
@pytest.mark.parametrize("name", ["mnli", "qqp"])
def test_absent_task_error_names_task_and_path(name):
    with pytest.raises(GlueError) as info:
        resolve_tasks(f"rte,{name}", SHARED_DATA)
    message = str(info.value)
    assert f"task {name}:" in message and str(SHARED_DATA / "glue" / name) in message
    assert "--tasks available" in message


def test_a_missing_data_directory_is_named(tmp_path):
    with pytest.raises(GlueError, match="nowhere.*does not exist"):
        resolve_tasks("rte", tmp_path / "nowhere")


def test_wrong_columns_are_named(tmp_path):
    folder = tmp_path / "glue" / "rte"
    folder.mkdir(parents=True)
    for split in ("train", "validation"):
        pd.DataFrame({"premise": ["a"], "hypothesis": ["b"], "label": [0]}).to_parquet(folder / f"{split}.parquet")
    with pytest.raises(GlueError, match="no column sentence1, sentence2"):
        load_splits(TASKS["rte"], tmp_path)


# ---- tokenisation -------------------------------------------------------------------------------------------

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot today", "it rained on the town"] * 20


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer = train_wordpiece(TEXTS, vocab_size=120, normalization="cramming")
    tokenizer.save(str(path))
    return path


def test_pairs_encode_as_cls_a_sep_b_sep_with_segments_and_truncate(small_tokenizer):
    tokenizer = prepare_tokenizer(small_tokenizer, vocab_size=120, max_length=12)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    split = {"sentence1": ["the cat sat", "the cat sat on the mat the cat sat on the mat"],
             "sentence2": ["a dog ran", "it rained"], "label": [0, 1]}
    from datasets import Dataset

    encoded = encode_split(tokenizer, TASKS["rte"], Dataset.from_dict(split))
    ids, types = encoded.input_ids[0], encoded.token_type_ids[0]
    a, b = len(tokenizer.encode("the cat sat", add_special_tokens=False).ids), len(
        tokenizer.encode("a dog ran", add_special_tokens=False).ids)
    assert list(ids[[0, a + 1, a + b + 2]]) == [cls, sep, sep] and len(ids) == a + b + 3
    assert list(types) == [0] * (a + 2) + [1] * (b + 1)
    assert len(encoded.input_ids[1]) == 12 and encoded.input_ids[1][-1] == sep  # the longer text was cut
    kept = len(tokenizer.encode("it rained", add_special_tokens=False).ids)
    assert encoded.token_type_ids[1].sum() == kept + 1  # the short text kept whole, with its [SEP]
    batch = collate(encoded, np.array([0, 1]), pad=0)
    assert batch.input_ids.shape == (2, 12)  # padded to the longest row of the batch, not to 128
    assert batch.attention_mask[0].sum() == len(ids) and batch.input_ids[0, len(ids):].eq(0).all()
    single = encode_split(tokenizer, TASKS["sst2"], Dataset.from_dict({"sentence": ["a dog ran"], "label": [1]}))
    assert single.input_ids[0][0] == cls and single.input_ids[0][-1] == sep and not single.token_type_ids[0].any()


def test_tokenizer_of_another_vocabulary_size_is_a_clear_error(small_tokenizer):
    with pytest.raises(GlueError, match="120 tokens but the model's vocab_size is 2048"):
        prepare_tokenizer(small_tokenizer, vocab_size=2048, max_length=64)
    with pytest.raises(GlueError, match="cannot read tokenizer"):
        prepare_tokenizer(small_tokenizer.parent / "missing.json", vocab_size=120, max_length=64)


def test_metric_ranges_cover_every_metric():
    assert set(METRIC_RANGES) == set(METRICS)


# ---- the classification head ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_head_ignores_padding(pooling):
    import torch

    from glue.finetune import SequenceClassifier
    from space.arch import ArchConfig
    from trainer.model import CrammedBert

    torch.manual_seed(0)
    arch = ArchConfig(layers=2, hidden=32, heads=4, vocab_size=64, max_seq_len=16)
    model = SequenceClassifier(CrammedBert(arch), num_labels=3, dropout=0.1, pooling=pooling).eval()
    short, long = torch.tensor([[2, 7, 8, 3]]), torch.tensor([[2, 9, 10, 11, 12, 13, 3]])
    alone = model(short, torch.ones_like(short), torch.zeros_like(short))
    padded = torch.cat([torch.nn.functional.pad(short, (0, 3)), long])
    mask = (torch.arange(7) < torch.tensor([[4], [7]])).long()
    together = model(padded, mask, torch.zeros_like(padded))
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5)


def test_the_hub_is_asked_for_nyu_mll_glue_and_its_failure_is_one_clear_error(monkeypatch):
    import datasets

    asked = []

    def offline(*args, **kwargs):
        asked.append(args)
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(GlueError, match=r"cannot load rte from the hub dataset nyu-mll/glue: Couldn't reach .*--data"):
        load_splits(TASKS["rte"])
    assert asked == [("nyu-mll/glue", "rte")]
    hub = datasets.DatasetDict({split: datasets.Dataset.from_dict({"premise": ["a"], "hypothesis": ["b"], "label": [2]})
                                for split in ("train", "validation_matched", "validation_mismatched", "test_matched")})
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: hub)
    assert set(load_splits(TASKS["mnli"])) == {"train", "validation_matched", "validation_mismatched"}
