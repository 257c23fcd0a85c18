"""The snli task: SNLI loader, frozen-output cache, the trainable last block against the full encoder, the smoke run."""
import json
import warnings

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from dpbench.cli import main
from dpbench.data import snli
from dpbench.privacy.ghost import unsupported_layers
from dpbench.results import store
from dpbench.tasks.snli import OFFLINE_ENCODER, SNLI, load_encoder


def test_mirror_loader_has_dev_as_train_and_the_canonical_test_split(mirror):
    text = snli.load_snli()
    assert text.data_id == "snli-dev-as-train" and "dev pairs serve as the training set" in text.note
    assert "tokenized" in text.preprocessing
    assert len(text.train.premises) == len(text.train.hypotheses) == len(text.train.labels) == 9842
    assert len(text.test.premises) == len(text.test.hypotheses) == len(text.test.labels) == 9824
    # Counts per label from the mirror's PROVENANCE.txt (entailment, neutral, contradiction).
    assert text.train.labels.bincount().tolist() == [3329, 3235, 3278]
    assert text.test.labels.bincount().tolist() == [3368, 3219, 3237]
    assert snli.SNLI_LABELS == ("entailment", "neutral", "contradiction")
    assert text.train.premises[0].split() == "Two women are embracing while holding to go packages .".split()
    assert text.train.labels[0] == snli.SNLI_LABELS.index("neutral")


def prepared(**options) -> SNLI:
    pl.seed_everything(0, verbose=False)
    task = SNLI(encoder=OFFLINE_ENCODER, **options)
    task.prepare()
    return task


def test_frozen_cache_plus_trained_block_reproduces_the_full_encoder(mirror):
    task = prepared(prefix=24, init="pretrained")
    x = task.data.x_test
    width = task.config.hidden_size
    assert x.shape[2] == width + 1 and set(x[..., width].unique().tolist()) == {0.0, 1.0}
    text = snli.load_snli().test
    tokenizer, encoder, _ = load_encoder(OFFLINE_ENCODER)
    tokens = tokenizer(text.premises[:24], text.hypotheses[:24], truncation=True, max_length=128, padding=True,
                       return_tensors="pt")
    assert x.shape[1] == tokens["input_ids"].shape[1]  # padded to the longest pair present
    assert torch.equal(x[..., width], tokens["attention_mask"].float())
    task.model.eval()
    with torch.no_grad():
        full = encoder(**tokens)
        assert torch.allclose(task.model.cls_state(x), full.last_hidden_state[:, 0], atol=1e-5)
        assert torch.allclose(task.model.pooled(x), full.pooler_output, atol=1e-5)
        # Extra padding beyond a batch's longest pair changes nothing.
        padded = torch.cat([x, torch.zeros(len(x), 7, width + 1)], 1)
        assert torch.allclose(task.model(padded), task.model(x), atol=1e-6)


def test_only_the_last_block_pooler_and_classifier_are_trained_with_fast_clipping(mirror):
    task = prepared(prefix=8)
    _, encoder, _ = load_encoder(OFFLINE_ENCODER)
    last, pooler = encoder.encoder.layer[-1], encoder.pooler
    expected = sum(p.numel() for p in [*last.parameters(), *pooler.parameters()]) + (384 + 1) * 3
    parameters = list(task.model.parameters())
    assert all(p.requires_grad for p in parameters) and sum(p.numel() for p in parameters) == expected
    assert unsupported_layers(task.model) == []
    # init=random is DP-AdamBC's code: Linear weights N(0, 1), zero biases, LayerNorm 1/0.
    assert task.model.intermediate.weight.std().item() == pytest.approx(1.0, abs=0.01)
    assert torch.all(task.model.key.bias == 0) and torch.all(task.model.output_norm.weight == 1)


def test_the_frozen_outputs_are_read_from_the_cache(mirror, isolated_home):
    first = prepared(prefix=8)
    [train_file] = isolated_home.glob("cache/snli/*-first8-frozen5/train.npy")
    marker = np.full(tuple(first.data.x_train.shape), 0.5, dtype=np.float32)
    np.save(train_file, marker)
    second = prepared(prefix=8)
    assert torch.equal(second.data.x_train, torch.from_numpy(marker))


def test_smoke_profile_end_to_end(mirror, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", "--method", "dpadam_bc", "--task", "snli", "--profile", "smoke", "--json"]) == 0
    assert not [w for w in caught if "vmap" in str(w.message)]
    record = json.loads(capsys.readouterr().out)
    assert record["data_id"] == "snli-dev-as-train-first128" and record["n_train"] == record["n_test"] == 128
    assert record["epsilon"] <= 3.0 and record["delta"] == pytest.approx(1 / 128**2)
    assert 0 <= record["metrics"]["test_accuracy"] <= 1
    assert "first 5 of 6 blocks frozen" in record["preprocessing"]
    assert [r["run_id"] for r in store.load()] == [record["run_id"]]


def test_an_encoder_that_cannot_be_fetched_is_refused_naming_the_offline_one(mirror, refused, monkeypatch):
    import transformers

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    error = refused("run", "--method", "dpsgd", "--task", "snli", "--profile", "smoke",
                    "--set", "encoder=bert-base-uncased")
    assert "bert-base-uncased" in error and f"--set encoder={OFFLINE_ENCODER}" in error
