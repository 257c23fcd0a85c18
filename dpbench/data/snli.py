"""SNLI: sentence pairs and labels from the Stanford archive or e-SNLI's tokenized dev and test copies (the encoder
that turns them into features is the task's, ``tasks/snli.py``)."""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
import torch
from dpbench.data.files import DataError, RemoteFile, fetch, mirror_dir
from dpbench.data.files import cached

SNLI_ZIP = RemoteFile(  # md5 as published by torchtext's and InferSent's SNLI download scripts
    "snli", "snli_1.0.zip", "https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
    "md5:981c3df556bbaea3f17f752456d0088c",
)


_ESNLI = ("https://raw.githubusercontent.com/OanaMariaCamburu/e-SNLI/"
          "7b585a3f077fdea899780eb0473940522ae44a2e/dataset/eSNLI")


SNLI_TOKENIZED = {  # e-SNLI's copies of SNLI dev and test: tokenized sentences, one per line, gold label '-' dropped
    name: RemoteFile("snli", name, f"{_ESNLI}/{name}", f"sha256:{digest}") for name, digest in [
        ("s1.dev", "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00"),
        ("s2.dev", "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b"),
        ("labels.dev", "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974"),
        ("s1.test", "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be"),
        ("s2.test", "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1"),
        ("labels.test", "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5"),
    ]
}


SNLI_LABELS = ("entailment", "neutral", "contradiction")  # label i is SNLI_LABELS[i] (Hugging Face's order)


@dataclass(frozen=True)
class SentencePairs:
    """(premise, hypothesis) pairs with labels 0..2 (see ``SNLI_LABELS``), in file order."""

    premises: list[str]
    hypotheses: list[str]
    labels: torch.Tensor


@dataclass(frozen=True)
class SNLIData:
    """SNLI text before any encoder's tokenization; ``data_id``, ``preprocessing`` and ``note`` as in TaskData."""

    train: SentencePairs
    test: SentencePairs
    data_id: str
    preprocessing: str
    note: str | None = None


def _snli_labels(names: list[str], source: str) -> torch.Tensor:
    unknown = set(names) - set(SNLI_LABELS)
    if unknown:
        raise DataError(f"{source}: unexpected gold labels {sorted(unknown)}")
    return torch.tensor([SNLI_LABELS.index(name) for name in names])


def _snli_jsonl(archive: zipfile.ZipFile, split: str) -> SentencePairs:
    """One split of the canonical release: sentence1/sentence2 as given, pairs with gold label '-' dropped."""
    with archive.open(f"snli_1.0/snli_1.0_{split}.jsonl") as lines:
        records = [record for record in map(json.loads, lines) if record["gold_label"] != "-"]
    return SentencePairs([r["sentence1"] for r in records], [r["sentence2"] for r in records],
                         _snli_labels([r["gold_label"] for r in records], f"snli_1.0_{split}.jsonl"))


def _snli_tokenized(split: str) -> SentencePairs:
    """e-SNLI's aligned files of one split: s1 premises, s2 hypotheses, labels; one line each, in the same order."""
    columns = []
    for name in (f"s1.{split}", f"s2.{split}", f"labels.{split}"):
        text = fetch(SNLI_TOKENIZED[name]).read_text(encoding="utf-8")
        columns.append(text[:-1].split("\n") if text.endswith("\n") else text.split("\n"))
    if len({len(column) for column in columns}) != 1:
        raise DataError(f"SNLI {split} files are not aligned: {[len(column) for column in columns]} lines")
    premises, hypotheses, labels = columns
    return SentencePairs(premises, hypotheses, _snli_labels(labels, f"labels.{split}"))


@cached
def load_snli() -> SNLIData:
    """SNLI 1.0 (Bowman et al. 2015): train 549,367 / test 9,824 pairs with a gold label, canonical split.

    With a mirror that holds only e-SNLI's tokenized dev and test files (no ``snli_1.0.zip``), the 9,842 dev pairs
    are the training set instead (``data_id`` "snli-dev-as-train"); the test set is the canonical test split either
    way, and the dev split is never used for evaluation.
    """
    labels = "labels 0 entailment, 1 neutral, 2 contradiction"
    if mirror_dir() is None or SNLI_ZIP.is_available() or not all(f.is_available() for f in SNLI_TOKENIZED.values()):
        with zipfile.ZipFile(fetch(SNLI_ZIP)) as archive:
            train, test = _snli_jsonl(archive, "train"), _snli_jsonl(archive, "test")
        preprocessing = (
            "snli_1.0.zip: snli_1.0_train.jsonl (549,367 pairs) and snli_1.0_test.jsonl (9,824 pairs) after dropping "
            "pairs whose gold_label is '-' (no annotator majority); sentence1/sentence2 raw strings, file order; "
            f"{labels}."
        )
        return SNLIData(train, test, "snli", preprocessing)
    train, test = _snli_tokenized("dev"), _snli_tokenized("test")
    preprocessing = (
        "e-SNLI's copies of SNLI 1.0 dev and test (s1.*, s2.*, labels.*; pairs with gold label '-' already dropped): "
        "dev (9,842 pairs) as the training set, test (9,824 pairs) as the test set, file order (= snli_1.0 order). "
        "The sentences are already tokenized (tokens separated by single spaces, e.g. 'packages .'), not the raw "
        f"sentence1/sentence2 strings; an encoder's tokenizer re-tokenizes them; {labels}."
    )
    note = ("SNLI train split not available: the 9,842 dev pairs serve as the training set (test: the 9,824 test "
            "pairs); sentences come pre-tokenized")
    return SNLIData(train, test, "snli-dev-as-train", preprocessing, note)
