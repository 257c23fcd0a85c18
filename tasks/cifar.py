"""CIFAR-10 tasks of the seed papers.

* ``cifar10_cnn``: the 5-layer tanh CNN that Tang & Lécuyer ("DP-Adam: Correcting DP Bias in Adam's Second Moment
  Estimation", Section 3) train from scratch with DP-SGD, DP-Adam and DP-AdamBC.
* ``cifar10``: Koskela & Honkela's ADADP setting ("Learning Rate Adaptation for Federated and Differentially Private
  Learning", Section "Experiments"): two 3x3 convolutions pretrained on public data and frozen, DP training of the
  fully connected 1600-500-500-10 head only.

Images stay uint8 in memory (a 50,000-image float copy would take 600 MB); the model's first module scales them to
[0, 1] and normalizes each channel with fixed published constants, never statistics of the private data. With the
mirror here, CIFAR-10 is the JPEG copy (data id ``cifar10-jpeg``, see :func:`dpbench.data.cifar.load_cifar10`).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from dpbench.data import cifar, stages
from dpbench.data.files import dpbench_home, mirror_dir
from dpbench.task import Classification, TaskData

#: ImageNet's channel means and standard deviations, which the DP-AdamBC code (``data_utils/datasets.py``,
#: ``get_cifar10``) normalizes CIFAR-10 with: public constants, independent of CIFAR-10.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: The CIFAR-10 channel constants of the ADADP code (``CIFAR_tests/main_adadp.py`` and ``sgd_train_conv.py``, used for
#: CIFAR-100 pretraining too), widely published with PyTorch CIFAR examples: derived by others from the CIFAR-10
#: training set long ago, fixed here, never recomputed from the data a run trains on.
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


class Normalize(nn.Module):
    """uint8 RGB images (n, 3, H, W) -> float32 ``(x / 255 - mean) / std`` per channel; fixed constants, no
    parameters."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255 - self.mean) / self.std


def random_crop_flip(images: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image on its own: zero-pad by ``padding`` pixels on every side, crop a window of the original size at
    offsets drawn uniformly from 0..2·padding, and mirror it left-right with probability 1/2.

    This is torchvision's ``RandomCrop(32, padding=4)`` then ``RandomHorizontalFlip()`` on the uint8 image, before
    normalization (padding is black), as in the DP-AdamBC and ADADP code. Draws (three per image, on the CPU) come
    from ``generator`` (the task's ``augmentation`` stream in training; torch's global generator if None), so one
    image's result never depends on another's pixels."""
    n, channels, height, width = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(device)
    flip = torch.randint(0, 2, (n,), generator=generator).bool().to(device)
    rows = top[:, None] + torch.arange(height, device=device)
    columns = left[:, None] + torch.arange(width, device=device)
    columns = torch.where(flip[:, None], columns.flip(1), columns)  # a mirrored crop is the crop mirrored
    return padded[torch.arange(n, device=device)[:, None, None, None],
                  torch.arange(channels, device=device)[None, :, None, None],
                  rows[:, None, :, None], columns[:, None, None, :]]


def check_limits(settings: dict, keys: tuple[str, ...]) -> None:
    """Image counts of options (``train_limit``, ``pretrain_limit``): 0 for all, or a positive count."""
    for key in keys:
        if settings[key] < 0:
            raise ValueError(f"{key} must be 0 (all) or a positive count of images, got {settings[key]}")


def first_examples(data: TaskData, limit: int) -> TaskData:
    """The first ``limit`` training examples in the loader's fixed order (0: all), under a data id that says so;
    the test set is unchanged."""
    if limit <= 0 or limit >= data.n_train:
        return data
    return replace(
        data, x_train=data.x_train[:limit], y_train=data.y_train[:limit], data_id=f"{data.data_id}-first{limit}",
        preprocessing=f"{data.preprocessing} Training set: its first {limit:,} images in that order.",
        note="; ".join(filter(None, [data.note, f"training set limited to its first {limit:,} images"])),
    )


def _haiku_init(layer: nn.Conv2d) -> nn.Conv2d:
    """Haiku's default ``Conv2D`` initialization, which the DP-AdamBC code uses: weights from a normal of standard
    deviation √(1/fan_in)/0.8796 truncated at two standard deviations (``VarianceScaling(1.0)``, whose truncated
    normal then has variance 1/fan_in), zero biases."""
    fan_in = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
    std = math.sqrt(1 / fan_in) / 0.87962566103423978
    nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
    nn.init.zeros_(layer.bias)
    return layer


class CIFAR10CNN(Classification):
    """DP-AdamBC's CIFAR-10 model (Tang & Lécuyer, Section 3: "a 5-layer CNN ... all of the model parameters are
    initialized randomly"), as defined by ``CNN5`` with ``--activation tanh`` in the authors' code
    (``jax_implementation/models/cnn.py``), the architecture the paper does not spell out:

        conv 3x3 32 (no padding) - tanh - max-pool 2 ─ conv 3x3 64 (padding 1) - tanh - max-pool 2
        ─ conv 3x3 128 (padding 1) - tanh - max-pool 2 ─ conv 3x3 256 (padding 1) - tanh
        ─ conv 3x3 10 (padding 1) ─ global average pool -> 10 logits

    (32 -> 30 -> 15 -> 7 -> 3 pixels; Haiku's default "SAME" padding is zero padding of 1 for a 3x3 kernel.) All
    convolutions have biases; Haiku's default initialization (:func:`_haiku_init`). Inputs are normalized with
    ImageNet's channel constants as in the code. Training images get a random crop (zero padding 4) and horizontal
    flip per example (``augment``, on by default, as in the code's ``get_cifar10``).

    Hyperparameters (paper, Section 3, tuned by the authors on test accuracy at ε ≈ 7): C = 1, σ = 1, B = 2048;
    η = 4 (DP-SGD, no momentum: the paper names none), 0.001 (DP-Adam, γ = 1e-8), 0.001 (DP-AdamBC, γ′ = 1e-8);
    batches are Poisson samples as in Algorithm 1 (the code's are fixed-size; see ``dpadam_bc``). Not in the
    paper: the number of steps ("T = f(ε, δ, B, N, σ)", Algorithm 1: training runs until ε reaches its target) and
    δ; the code's δ is 1e-5. The ``paper`` profile fixes σ = 1, δ = 1e-5 and 28 epochs of round(50,000/2048) = 24
    Poisson steps, 672 steps, which spend ε = 7.04 under the PLD accountant: the paper's "ε ≈ 7" (Figure 1).
    With σ = 1, ε = 8 takes 35 epochs (840 steps, ε = 7.93). The defaults (no profile) are the same
    hyperparameters at ε = 8, the issue's budget, with σ calibrated for 28 epochs and δ = 1/n².
    """

    name = "cifar10_cnn"
    min_train_examples = 50_000
    description = "DP-AdamBC's 5-layer tanh CNN on CIFAR-10 from scratch, random crop and flip"
    options = {"augment": True, "train_limit": 0}
    defaults = {"epochs": 28, "batch_size": 2048, "clip": 1.0, "epsilon": 8.0}
    # quantile_clip starts from this task's C and takes DP-SGD's η; autoclip's η is DP-SGD's times its C (Bu et al.)
    method_defaults = {"dpsgd": {"lr": 4.0}, "dpadam": {"lr": 1e-3, "gamma": 1e-8},
                       "dpadam_bc": {"lr": 1e-3, "gamma_prime": 1e-8}, "quantile_clip": {"lr": 4.0},
                       "autoclip": {"lr": 4.0}}
    profiles = {
        "paper": {"batch_size": 2048, "clip": 1.0, "epochs": 28, "noise_multiplier": 1.0, "delta": 1e-5,
                  "augment": True, "train_limit": 0,
                  "methods": {"dpsgd": {"lr": 4.0}, "dpadam": {"lr": 1e-3, "gamma": 1e-8},
                              "dpadam_bc": {"lr": 1e-3, "gamma_prime": 1e-8}}},
        "smoke": {"batch_size": 256, "epochs": 1, "train_limit": 2000, "epsilon": 8.0},
    }

    def __init__(self, **options):
        super().__init__(**options)
        check_limits(self.settings, ("train_limit",))

    def load_data(self) -> TaskData:
        data = first_examples(cifar.load_cifar10(), self.settings["train_limit"])
        augmentation = ("each training batch randomly cropped (zero padding 4) and mirrored left-right, per example"
                        if self.settings["augment"] else "no augmentation")
        return replace(data, preprocessing=(
            f"{data.preprocessing} In the model: pixels / 255, normalized per channel with ImageNet's published mean "
            f"{IMAGENET_MEAN} and std {IMAGENET_STD} (as the DP-AdamBC code does); {augmentation}."))

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        return random_crop_flip(x, generator=self.rng("augmentation")) if self.settings["augment"] else x

    def build_model(self, data: TaskData) -> nn.Module:
        self.classes = 10

        def conv(in_channels, out_channels, padding):
            return _haiku_init(nn.Conv2d(in_channels, out_channels, 3, padding=padding))

        return nn.Sequential(
            Normalize(IMAGENET_MEAN, IMAGENET_STD),
            conv(3, 32, 0), nn.Tanh(), nn.MaxPool2d(2),
            conv(32, 64, 1), nn.Tanh(), nn.MaxPool2d(2),
            conv(64, 128, 1), nn.Tanh(), nn.MaxPool2d(2),
            conv(128, 256, 1), nn.Tanh(),
            conv(256, self.classes, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )


#: Stage names of a first run (:mod:`dpbench.data.stages`).
PRETRAIN_STAGE, FEATURES_STAGE = "pretrain convolutions", "extract features"
#: Where ``cifar10`` pretrains its convolutions: CIFAR-100 (the paper's choice), or the public substitute.
PRETRAINING_SOURCES = ("auto", "cifar100", "cifar10_first10k")
PUBLIC_SLICE = 10_000  # the substitute: the first 10,000 CIFAR-10 training images in the loader's fixed order
#: Non-private pretraining as in the ADADP code (``CIFAR_tests/sgd_train_conv.py``: SGD, lr 0.02, batches of 100
#: reshuffled every epoch, random crop and flip), except momentum 0.9 instead of none, so that the ``pretrain_epochs``
#: (10 by default, the code's 100 take most of an hour on a CPU) converge; seed fixed, so every run shares the layers.
PRETRAINING = {"lr": 0.02, "batch_size": 100, "momentum": 0.9, "augment": "crop4+flip", "seed": 0}


def adadp_convolutions() -> nn.Sequential:
    """ADADP's convolutional part (paper, Section "Experiments"; code ``Net1``): conv 3x3, 64 channels, no padding,
    ReLU, max-pool 3 stride 2, twice, then flatten: 32 -> 30 -> 14 -> 12 -> 5 pixels, 64·5·5 = 1600 features."""
    return nn.Sequential(
        Normalize(CIFAR10_MEAN, CIFAR10_STD),
        nn.Conv2d(3, 64, 3), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 64, 3), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Flatten(),
    )


def pretrain_convolutions(images: torch.Tensor, labels: torch.Tensor, classes: int, epochs: int,
                          description: str) -> nn.Sequential:
    """Train ADADP's convolutions with a 1600-500-``classes`` head non-privately on public images and return the
    convolutions, frozen (``requires_grad`` False; no layer of theirs behaves differently in training). Settings in
    ``PRETRAINING``; the code's 100 epochs are ``epochs`` here. The code passes the last layer's output through a
    ReLU before the cross-entropy; we do not (logits must be able to go negative). Random draws come from a
    generator forked off with the fixed seed, so the caller's random state is untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(PRETRAINING["seed"])
        convolutions = adadp_convolutions()
        network = nn.Sequential(convolutions, nn.Linear(1600, 500), nn.ReLU(), nn.Linear(500, classes))
        optimizer = torch.optim.SGD(network.parameters(), lr=PRETRAINING["lr"], momentum=PRETRAINING["momentum"])
        batch = PRETRAINING["batch_size"]
        steps = epochs * math.ceil(len(images) / batch)
        with stages.bar(total=steps, desc=f"{stages.label(PRETRAIN_STAGE)} on {description}", unit="step") as bar:
            for _ in range(epochs):
                for index in torch.randperm(len(images)).split(batch):
                    loss = F.cross_entropy(network(random_crop_flip(images[index])), labels[index])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    bar.update()
                    stages.advance(len(index))
                    bar.set_postfix_str(f"loss={loss.item():.3f} {stages.eta()}", refresh=False)
    return convolutions.requires_grad_(False)


@torch.no_grad()
def features_of(convolutions: nn.Module, images: torch.Tensor, what: str = "images") -> torch.Tensor:
    """The frozen convolutions' 1600 outputs per image (no augmentation), computed in slices of 1000."""
    if not len(images):
        return torch.zeros(0, 1600)
    outputs = []
    with stages.bar(total=len(images), desc=f"{stages.label(FEATURES_STAGE)} ({what})", unit="image") as bar:
        for chunk in images.split(1000):
            outputs.append(convolutions(chunk))
            bar.update(len(chunk))
            stages.advance(len(chunk), bar)
    return torch.cat(outputs)


class CIFAR10ADADP(Classification):
    """ADADP's CIFAR-10 setting (Koskela & Honkela, Section "Experiments"; code ``CIFAR_tests/main_adadp.py``): the
    convolutions of :func:`adadp_convolutions` pretrained on public data and frozen, and DP training of the fully
    connected head only: 1600 -> 500 -> ReLU -> 500 -> ReLU -> 10, without biases (the code's ``bias=False``),
    softmax cross-entropy. ``x`` is the frozen layers' output, computed once and cached, so the private training
    sees 1600-dimensional features and per-example clipping runs on three linear layers.

    Pretraining (``pretraining`` option): the paper pretrains on CIFAR-100 ("Similarly to the experiments of [1]",
    Abadi et al.), ``cifar100``. Where CIFAR-100 cannot be read (``auto`` with a mirror that lacks it, as here), or
    with ``cifar10_first10k``, the public substitute is the first 10,000 CIFAR-10 training images in the loader's
    fixed order (the JPEG copy: files 0000-0999 of every class; the canonical release: data_batch_1). Those images
    are removed from the private training set, whose data id says so (``cifar10-jpeg-train40k``); the test set is
    never used for pretraining. The substitute is easier than CIFAR-100 (same classes, same distribution), so the
    accuracies it gives are not comparable with the paper's; the record's ``preprocessing`` and ``note`` say which
    pretraining a run used. Pretraining is non-private, once per setting: its weights and the features are cached
    under ``$DPBENCH_HOME/cache/cifar10/``, keyed by everything that determines them (source data id, settings,
    epochs, PyTorch version). For quick tests, ``pretrain_limit`` and ``train_limit`` take prefixes of the public
    and private images; the data ids and the note name them.

    Not as in the code: its DP phase applies random crops and flips to the CIFAR-10 images under the frozen
    convolutions; cached features rule that out, so the DP phase here sees unaugmented images. The code pretrains
    for 100 epochs without momentum; here ``pretrain_epochs`` = 10 with momentum 0.9 (``PRETRAINING``), to keep
    the one-time pretraining to minutes on a CPU (143 s of a 307 s first run on a 2-core CPU; docs/measurements.md).

    Hyperparameters (paper: B = 200, 100 epochs, σ ∈ {2, 4, 6, 8}, ADADP from η0 = 0.1; code: C = 3, δ = 1e-5;
    paper, comparison with DP-Adam: ADADP for 50 epochs, then η_k = η_50 / (1 + 0.1 (k − 50))). ``paper`` profile:
    those, with σ = 2, the setting at which the paper tuned SGD's learning rate (100 epochs take about half an hour
    of CPU time for the head alone). Defaults (no profile), sized for minutes on a CPU: the same with 20 epochs,
    ADADP adapting during the first 10, and ε = 0.6 at δ = 1e-5, which calibrates σ = 2.03 on the 40,000 private
    images here, i.e. the paper's σ = 2 setting cut to 20 epochs (PLD accountant; on 50,000 images after CIFAR-100
    pretraining, σ = 1.84).
    """

    name = "cifar10"
    min_train_examples = 40_000  # images 10,000 onwards (the first 10,000 pretrain)
    description = "ADADP's CIFAR-10 setting: pretrained frozen convolutions, DP training of the 1600-500-500-10 head"
    options = {"pretraining": "auto", "pretrain_epochs": 10, "pretrain_limit": 0, "train_limit": 0}
    defaults = {"epochs": 20, "batch_size": 200, "clip": 3.0, "epsilon": 0.6, "delta": 1e-5}
    # autoclip's η: DP-SGD's default 0.1 times this task's C = 3 (Bu et al.'s convention, methods/autoclip.py)
    method_defaults = {"ada_dp": {"lr": 0.1, "adapt_epochs": 10, "decay": 0.1}, "autoclip": {"lr": 0.3}}
    profiles = {
        "paper": {"batch_size": 200, "clip": 3.0, "epochs": 100, "noise_multiplier": 2.0, "delta": 1e-5,
                  "methods": {"ada_dp": {"lr": 0.1, "adapt_epochs": 50, "decay": 0.1}}},
        "smoke": {"epochs": 1, "train_limit": 2000, "pretrain_epochs": 1, "pretrain_limit": 1000, "epsilon": 0.6},
    }

    def __init__(self, **options):
        super().__init__(**options)
        if self.settings["pretraining"] not in PRETRAINING_SOURCES:
            raise ValueError(f"pretraining must be one of {', '.join(PRETRAINING_SOURCES)}, "
                             f"not {self.settings['pretraining']!r}")
        if self.settings["pretrain_epochs"] < 1:
            raise ValueError(f"pretrain_epochs must be at least 1, got {self.settings['pretrain_epochs']}")
        check_limits(self.settings, ("train_limit", "pretrain_limit"))
        self.convolutions: nn.Module | None = None

    def pretraining_source(self) -> str:
        """``cifar100`` or ``cifar10_first10k``: the ``pretraining`` option, with ``auto`` resolved (CIFAR-100 where
        it is in the mirror or cache, or can be downloaded because no mirror is configured)."""
        choice = self.settings["pretraining"]
        if choice != "auto":
            return choice
        available = cifar.CIFAR100_PYTHON.is_available() or mirror_dir() is None
        return "cifar100" if available else "cifar10_first10k"

    def split(self, cifar10: TaskData):
        """(public images, their labels, number of classes, public data id, description, private ``TaskData``):
        pretraining data and the private training set, with the ``train_limit`` and ``pretrain_limit`` prefixes."""
        if self.pretraining_source() == "cifar100":
            public, classes = cifar.load_cifar100(), 100
            public_images, public_labels, public_id = public.x_train, public.y_train, public.data_id
            private = cifar10
            where = "the 50,000 CIFAR-100 training images (100 fine labels), as in the paper"
        else:
            public_images, public_labels = cifar10.x_train[:PUBLIC_SLICE], cifar10.y_train[:PUBLIC_SLICE]
            public_id, classes = f"{cifar10.data_id}-first10k", 10
            rest = len(cifar10.x_train) - PUBLIC_SLICE
            private = replace(
                cifar10, x_train=cifar10.x_train[PUBLIC_SLICE:], y_train=cifar10.y_train[PUBLIC_SLICE:],
                data_id=f"{cifar10.data_id}-train{rest // 1000}k",
                preprocessing=f"{cifar10.preprocessing} Private training set: images {PUBLIC_SLICE:,} onwards "
                              f"({rest:,}); the first {PUBLIC_SLICE:,} are public, used for pretraining only.",
            )
            where = (f"the first {PUBLIC_SLICE:,} CIFAR-10 training images ({public_id}), a public substitute for "
                     "CIFAR-100, which is not available here; they are excluded from the private training set")
        limit = self.settings["pretrain_limit"]
        if 0 < limit < len(public_images):
            public_images, public_labels = public_images[:limit], public_labels[:limit]
            public_id = f"{public_id}-first{limit}"
            where = f"{where}; only the first {limit:,} of them (pretrain_limit)"
        private = first_examples(private, self.settings["train_limit"])
        return public_images, public_labels, classes, public_id, where, private

    def load_data(self) -> TaskData:
        planned, private = self._stages()
        with stages.planned(planned, training_examples=private) as plan:
            return self._load_data(plan)

    def _stages(self) -> tuple[list[tuple[str, int, str]], int]:
        """The first run's preparation, as far as it can be known before the images are read: decoding,
        pretraining and features (:mod:`dpbench.data.stages`; the cached ones are dropped once known), and the number
        of private training examples, whose training follows."""
        on_cifar100 = self.pretraining_source() == "cifar100"  # else the first CIFAR-10 images, taken out
        public = 50_000 if on_cifar100 else PUBLIC_SLICE
        private = 50_000 if on_cifar100 else 50_000 - PUBLIC_SLICE
        limit, train_limit = self.settings["pretrain_limit"], self.settings["train_limit"]
        public = min(public, limit) if limit > 0 else public
        private = min(private, train_limit) if train_limit > 0 else private
        return [(cifar.DECODE_STAGE, cifar.cifar10_images_to_decode(), "decode"),
                (PRETRAIN_STAGE, self.settings["pretrain_epochs"] * public, "train"),
                (FEATURES_STAGE, private + 10_000, "forward")], private

    def _load_data(self, plan: stages.Plan) -> TaskData:
        public_images, public_labels, classes, public_id, where, private = self.split(cifar.load_cifar10())
        epochs = self.settings["pretrain_epochs"]
        setting = {"source": public_id, "classes": classes, "epochs": epochs, **PRETRAINING,
                   "architecture": "adadp-conv64x2-fc500", "normalize": [CIFAR10_MEAN, CIFAR10_STD],
                   "torch": torch.__version__}
        key = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:16]
        folder = dpbench_home() / "cache" / "cifar10"
        weights_path = folder / f"adadp-convolutions-{key}.pt"
        features_path = folder / f"adadp-features-{key}-{private.data_id}.pt"
        self.convolutions = adadp_convolutions().requires_grad_(False)
        if weights_path.exists():
            plan.drop(PRETRAIN_STAGE)
        if features_path.exists():
            plan.drop(FEATURES_STAGE)
        if weights_path.exists():
            self.convolutions.load_state_dict(torch.load(weights_path, weights_only=True))
        else:
            trained = pretrain_convolutions(public_images, public_labels, classes, epochs, public_id)
            cifar.save_atomically(trained.state_dict(), weights_path)
            self.convolutions.load_state_dict(trained.state_dict())
        if features_path.exists():
            stored = torch.load(features_path, weights_only=True)
        else:
            stored = {"train": features_of(self.convolutions, private.x_train, "training images"),
                      "test": features_of(self.convolutions, private.x_test, "test images")}
            cifar.save_atomically(stored, features_path)
        note = f"convolutions pretrained non-privately on {where}"
        preprocessing = (
            f"{private.preprocessing} Inputs: the 1600 outputs of ADADP's two 3x3x64 convolutions (ReLU, max-pool 3/2) "
            f"on the unaugmented images scaled to [0, 1] and normalized with the ADADP code's published CIFAR-10 "
            f"channel constants mean {CIFAR10_MEAN}, std {CIFAR10_STD}; the convolutions pretrained non-privately "
            f"on {where}: {epochs} epochs of SGD (lr {PRETRAINING['lr']}, batch {PRETRAINING['batch_size']}, "
            f"momentum {PRETRAINING['momentum']}, random crop (pad 4) and flip, seed {PRETRAINING['seed']}) with a "
            f"1600-500-{classes} head that is discarded; then frozen (cache key {key})."
        )
        return replace(private, x_train=stored["train"], x_test=stored["test"], preprocessing=preprocessing,
                       note="; ".join(filter(None, [private.note, note])))

    def build_model(self, data: TaskData) -> nn.Module:
        self.classes = 10
        return nn.Sequential(nn.Linear(1600, 500, bias=False), nn.ReLU(), nn.Linear(500, 500, bias=False), nn.ReLU(),
                             nn.Linear(500, self.classes, bias=False))
