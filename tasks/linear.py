"""Linear models on real data: logistic regression (2 classes) and softmax regression (more), the DP-ERM tasks.

One model for every method: a linear model with a bias, θᵀx + b (the option ``bias``, default true; ``false`` for
the bias-free model of Yu et al. 2020 and the DP-ERM benchmark). The gradient methods and the non-private baseline
fit b as ``nn.Linear``'s bias; output and objective perturbation (``dpbench/release/mechanisms.py``) fit it as the weight of
a constant feature 1 appended to each row before the rows are clipped to their norm bound, which is the same
model: a positive rescaling of (x, 1) never changes the sign of θᵀ(x, 1). Weights start at 0. A per-example gradient
is (σ(z) − y)·(x, 1) for the logistic loss and (p − e_y) ⊗ (x, 1) for the softmax cross-entropy (without bias: x),
so with inputs of norm ≤ R its norm is at most √(R² + 1) (|σ(z) − y| ≤ 1), or √2·√(R² + 1) (‖p − e_y‖² =
(1 − p_y)² + Σ_{k≠y} p_k² ≤ 2(1 − p_y)² ≤ 2); without bias R or √2·R. R is public: rows of the tabular sets are
scaled to unit norm, and MNIST pixels in [0, 1] give R = √784 = 28. (Without a bias the breast cancer set, whose
features are all non-negative, is not separable through the origin: non-private accuracy 0.87 instead of 0.97.)

Hyperparameters: ``defaults`` are the task's epochs and batch size, and the steps of full-batch methods (their
epochs), the same for every method (the board's "none" track: each method with its own defaults, no per-method
value chosen by looking at test accuracy). ``search_lists`` are what every method's tuned trials draw epochs, batch
sizes and full-batch steps from (issue 33, "budgets that do not bind"): epochs from about a quarter to four times
the default, four or five batch sizes from a quarter of the default up (each small enough for ADADP's two batches a
step on the 90% the validation track trains on), full-batch steps 25–800 (:data:`STEPS`). The lists go past the
default's compute so that a selection at a list's end is the method's, not the budget's: ``dpbench leaderboard
--boundary-hits`` reports how often a selection sits at an end.
"""
import math

from torch import nn

from dpbench.data import mnist, tabular
from dpbench.task import Classification, TaskData

STEPS = [25, 50, 100, 200, 400, 800]  # full-batch steps: Yu et al.'s T ∈ {50, 200, 800}, and between and around them


def yu2020(epsilon: float) -> dict:
    """``--profile yu2020``: Yu, Zhang, Chen, Yin, Liu, "Gradient Perturbation is Underrated for Differentially
    Private Convex Optimization" (IJCAI 2020), Section 4, as far as the paper and the DP-ERM benchmark of Iyengar et
    al. 2019 (sunblaze-ucb/dpml-benchmark, whose data and baselines it uses) state it. The seed's plain text lost the
    numbers; they are the ICLR 2020 submission's, whose Section 4 is otherwise word for word the same:

    * no bias (the benchmark's models have none); δ = 1/n² (the task's default); ε = 0.1 for the binary and 1 for
      the multi-class datasets (Table 2's caption), under replace-one neighbours (their Section 2's definition);
    * per-example gradients clipped at 1; ℓ2 regularization coefficient 1e-4 (``weight_decay``);
    * DP-GD: T ∈ {50, 200, 800} full-batch steps, η ∈ {0.1, 1, 5}; here the middle of each grid, T = 200, η = 1;
    * DP-SGD: sampling ratio 0.1, T from the same grid (T = 200: 20 epochs), η twice DP-GD's (2), "divided by 2 at
      the middle of training" (``halve_at`` 0.5);
    * output perturbation and AMP: "the implementation and hyperparameters in Iyengar et al.": the middle of the
      benchmark's grids (convex bolt-on SGD, η = 0.01, 10 passes, b = 50, L = 1; AMP ε3/ε1 = 0.95, ε2/ε = 0.01,
      L = 1); the grids themselves are the methods' search spaces.

    Not recovered or not reproduced: how T and η were picked from the grids (the paper calls its numbers
    "validation accuracy" but describes only an 80/20 train/test split; the benchmark takes the best grid point on
    the test set); the benchmark's preprocessing (Adult's continuous columns divided by their maximum and no row
    normalization; KDDCup99 as 70,000 rows drawn with replacement from the 10% file, continuous columns unscaled) —
    dpbench keeps its own loaders (min-max scaling, unit-norm rows, the whole 10% file, its own 80/20 split); the
    datasets' sizes (the paper's Appendix B table was not found); 20 runs per setting (a grid's ``seeds``)."""
    return {"bias": False, "clip": 1.0, "weight_decay": 1e-4, "epsilon": epsilon, "neighbouring": "replace-one",
            "methods": {"dpgd": {"epochs": 200, "lr": 1.0},
                        "dpsgd": {"sample_rate": 0.1, "epochs": 20, "lr": 2.0, "halve_at": 0.5},
                        "output_perturbation": {"variant": "convex", "lr": 0.01, "epochs": 10, "batch_size": 50,
                                                "input_norm": 1.0},
                        "amp": {"noise_fraction": 0.95, "out_fraction": 0.01, "input_norm": 1.0}}}


def nonprivate_defaults(classes: int, input_norm: float = 1.0) -> dict:
    """The non-private baseline's defaults on a linear task: heavy-ball SGD (momentum 0.9) with η = 1/β, β the
    loss's smoothness bound over the task's inputs (public: the rows' norm bound R and the bias): the logistic
    loss's second derivative is at most ¼ and the softmax cross-entropy's Hessian in the logits (diag p − ppᵀ) at
    most ½ in norm, so β = ¼(R² + 1) for 2 classes and ½(R² + 1) for more (η = 1/β is the classical step of
    gradient descent on a β-smooth loss; no value read off any test accuracy)."""
    beta = (input_norm**2 + 1) * (0.25 if classes == 2 else 0.5)
    return {"optimizer": "sgd", "momentum": 0.9, "lr": 1 / beta}


def autoclip_defaults(classes: int, input_norm: float = 1.0) -> dict:
    """``autoclip``'s default rate on a binary linear task: η = 1/β for β the smoothness of the loss AUTO-S descends.

    Normalizing each per-example gradient, g ↦ g/(‖g‖ + γ), turns the logistic loss ℓ(z) of the margin z = ±θᵀx̃ into
    ψ(θ) = φ(z)/‖x̃‖ with φ'(z) = −s/(s + γ'), s = σ(−z), γ' = γ/‖x̃‖; its curvature φ'' = γ's(1 − s)/(s + γ')² is at
    most ¼ for every γ (AM–GM), so ψ is (‖x̃‖/4)-smooth and β = ¼√(R² + 1) over the task's public input bound R (with
    the bias feature). η = 1/β is the rule of the non-private baseline's default (:func:`nonprivate_defaults`), for
    the loss the method actually descends; DP-SGD's η = 0.1 (the method's own default) is 28 times smaller on adult
    and left the model at the majority rate (its implicit loss needs ‖θ‖ ≈ 30–50, margins ≈ log(√2/γ) ≈ 5: at
    σ = 0 too). Only derived for 2 classes; softmax tasks keep the method's default. No value read off any test
    accuracy."""
    return {"lr": 4 / math.sqrt(input_norm**2 + 1)} if classes == 2 else {}


class LinearClassification(Classification):
    """A linear model (with a bias unless ``bias=false``) with the logistic loss for 2 classes and the softmax
    cross-entropy for more."""

    max_input_norm: float = 1.0  # R, a bound that holds by construction of the features
    options = {"bias": True}

    def build_model(self, data: TaskData) -> nn.Module:
        # the dataset's public number of classes where the task declares it, not one read off the labels
        self.classes = getattr(type(self), "classes", None) or int(data.y_train.max()) + 1
        model = nn.Linear(data.x_train.shape[1], 1 if self.classes == 2 else self.classes, bias=self.settings["bias"])
        nn.init.zeros_(model.weight)
        if model.bias is not None:
            nn.init.zeros_(model.bias)
        return model

    def gradient_norm_bound(self) -> float:
        bound = math.sqrt(self.max_input_norm**2 + 1) if self.settings["bias"] else self.max_input_norm
        return bound if self.classes == 2 else math.sqrt(2) * bound


class Digits(LinearClassification):
    name = "digits"
    min_train_examples = 1_437
    description = "softmax regression on scikit-learn's bundled 8x8 digits (1,797 images, 10 classes); no download"
    classes = 10
    load_data = staticmethod(tabular.load_digits)
    profiles = {"yu2020": yu2020(1.0)}
    defaults = {"epochs": 30, "batch_size": 64, "steps": 200}
    search_lists = {"epochs": [8, 15, 30, 60, 120], "batch_size": [16, 64, 256, 512], "steps": STEPS}
    method_defaults = {"nonprivate": nonprivate_defaults(classes)}


class BreastCancer(LinearClassification):
    name = "breast_cancer"
    min_train_examples = 455
    description = "logistic regression on scikit-learn's bundled Wisconsin breast cancer set (569 rows); no download"
    classes = 2
    load_data = staticmethod(tabular.load_breast_cancer)
    profiles = {"yu2020": yu2020(0.1)}
    defaults = {"epochs": 30, "batch_size": 32, "steps": 200}
    search_lists = {"epochs": [8, 15, 30, 60, 120], "batch_size": [8, 16, 32, 64, 128], "steps": STEPS}
    method_defaults = {"nonprivate": nonprivate_defaults(classes), "autoclip": autoclip_defaults(classes)}


class Adult(LinearClassification):
    name = "adult"
    min_train_examples = 36_177
    description = "logistic regression on UCI Adult (income > 50K; 45,222 complete rows, 80/20 split)"
    classes = 2
    load_data = staticmethod(tabular.load_adult)
    profiles = {"yu2020": yu2020(0.1)}
    defaults = {"epochs": 20, "batch_size": 256, "steps": 200}
    search_lists = {"epochs": [5, 10, 20, 40, 80], "batch_size": [64, 256, 1024, 4096], "steps": STEPS}
    method_defaults = {"nonprivate": nonprivate_defaults(classes), "autoclip": autoclip_defaults(classes)}


class KDDCup99(LinearClassification):
    name = "kddcup99"
    min_train_examples = 395_216
    description = "logistic regression on KDD Cup 1999, 10% set: normal traffic vs attack (494,021 rows)"
    classes = 2
    load_data = staticmethod(tabular.load_kddcup99)
    profiles = {"yu2020": yu2020(0.1)}
    defaults = {"epochs": 2, "batch_size": 1024, "steps": 200}
    search_lists = {"epochs": [1, 2, 4, 8], "batch_size": [256, 1024, 4096, 16384], "steps": STEPS}
    method_defaults = {"nonprivate": nonprivate_defaults(classes), "autoclip": autoclip_defaults(classes)}


class Covertype(LinearClassification):
    name = "covertype"
    min_train_examples = 8_000  # the mirror's first 10,000 rows, 80% of them; more when downloaded
    description = "softmax regression on UCI Covertype (7 forest cover types); the mirror's 10,000-row subset offline"
    classes = 7
    load_data = staticmethod(tabular.load_covertype)
    profiles = {"yu2020": yu2020(1.0)}
    defaults = {"epochs": 20, "batch_size": 128, "steps": 200}
    search_lists = {"epochs": [5, 10, 20, 40, 80], "batch_size": [32, 128, 512, 2048], "steps": STEPS}
    method_defaults = {"nonprivate": nonprivate_defaults(classes)}


class MNISTLogReg(LinearClassification):
    name = "mnist_logreg"
    min_train_examples = 5_000  # the mirror's mnist-5k-train; 60,000 when downloaded
    description = "softmax regression on MNIST pixels in [0, 1] (per-example input norm ≤ 28)"
    classes = 10
    load_data = staticmethod(mnist.load_mnist)
    profiles = {"yu2020": yu2020(1.0)}
    max_input_norm = 28.0
    defaults = {"epochs": 10, "batch_size": 256, "steps": 200}
    search_lists = {"epochs": [3, 5, 10, 20, 40], "batch_size": [64, 256, 1024, 2048], "steps": STEPS}
    method_defaults = {"nonprivate": nonprivate_defaults(classes, max_input_norm)}
