"""The seed papers' published test accuracies, for the ``published`` rows of the leaderboards.

Plain data, read from the plain-text copies of the papers (their tables are garbled in places: only numbers that
read unambiguously are here, with the ε they were measured at). Percentages are stored as fractions. These are
the papers' figures, on the papers' own data, splits, models and tuning: the leaderboard shows them in rows of
their own, labelled with the paper and its dataset, and never averages or ranks them with dpbench's measurements.

Fields of :class:`PublishedResult`: ``citation`` names the paper and table, ``source`` is its short form;
``task`` is the dpbench task that trains the same kind of model on the same kind of data (``None`` when dpbench has
none); ``paper_data_id`` is dpbench's data id of the records the paper used (``None`` when no dpbench loader reads
them under an id, or the paper does not say which version it used), so that a table of another data id says that
the data differ; ``paper_method`` is the paper's name for the method and ``method`` the dpbench method it
corresponds to; ``epsilon`` is ``None`` for a non-private baseline; ``delta`` is as the paper states it;
``spread`` is the ± printed beside the value, if any; ``note`` says what the paper says about averaging and tuning.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedResult:
    citation: str
    source: str
    paper_dataset: str
    paper_data_id: str | None
    task: str | None
    setting: str
    paper_method: str
    method: str
    epsilon: float | None
    epsilon_label: str
    delta: str
    metric: str
    value: float
    spread: float | None
    note: str


def _fraction(percent: float) -> float:
    return round(percent / 100, 6)


# Yu, Zhang, Chen, Yin, Liu, Table 2 ("validation accuracy (in %)" on the held-out 20%). Columns KDDCup99, Adult,
# MNIST, Covertype; its Gisette, Real-sim and RCV1 columns have no dpbench task and are left out.
YU_CITATION = ("Yu, Zhang, Chen, Yin, Liu, \"Gradient Perturbation is Underrated for Differentially Private Convex "
               "Optimization\" (arXiv:1911.11363), Table 2")
YU_NOTE = ("mean of 20 runs; steps and learning rate chosen from grids, not charged to the budget (Section 4); "
           "ε = 0.1 for the binary and ε = 1 for the multi-class datasets, δ = 1/n², as Section 4 and the Table 2 "
           "caption state (the symbols are lost in the plain-text copy)")
YU_AMP_NOTE = YU_NOTE + "; AMP on MNIST and Covertype: numbers Yu et al. quote from Iyengar et al. 2019"
_YU_DATASETS = [  # (paper's dataset, its dpbench data id, dpbench task, model, ε)
    # Which KDD Cup 1999 file (full or the 10% set) the DP-ERM benchmark uses is not stated in the text.
    ("KDDCup99", None, "kddcup99", "logistic regression", 0.1),
    ("Adult", "adult", "adult", "logistic regression", 0.1),
    ("MNIST", "mnist", "mnist_logreg", "softmax regression", 1.0),
    ("Covertype", "covertype", "covertype", "softmax regression", 1.0),
]
_YU_ROWS = [  # (paper's row, dpbench method, accuracy in % per dataset above)
    ("Non private", "nonprivate", [99.1, 84.8, 91.9, 71.2]),
    ("AMP", "amp", [97.5, 79.3, 71.9, 64.3]),
    ("Out-SGD", "output_perturbation", [98.1, 77.4, 69.4, 62.4]),
    ("DP-SGD", "dpsgd", [98.7, 80.4, 87.5, 67.7]),
    ("DP-GD", "dpgd", [98.7, 80.9, 88.6, 66.2]),
]

# Pichapati, Suresh, Yu, Reddi, Kumar, Tables 1 and 2: MNIST (60,000 train / 10,000 test), (ε, 1e-5)-DP, moments
# accountant, batch size 600. "(norm bound)" is noise scaled to the gradient norm bound without clipping,
# "(Abadi et al)" is DP-SGD. Section 6's text says "Table 2" for the logistic regression: the captions are taken.
ADACLIP_CITATION = ("Pichapati, Suresh, Yu, Reddi, Kumar, \"AdaCliP: Adaptive Clipping for Private SGD\" (2019), "
                    "Table {}")
ADACLIP_NOTE = "only h2 tuned (Section 6); the ± is printed without saying over how many runs"
_ADACLIP_TABLES = [  # (table, dpbench task, paper's model, rows: (paper's row, dpbench method, {ε: (accuracy %, ±)}))
    (1, "mnist_logreg", "multinomial logistic regression on pixels in [0, 1]", [
        ("norm bound", "norm_bound",
         {0.1: (73.45, 0.23), 0.25: (79.18, 0.18), 0.5: (84.30, 0.13), 1.0: (88.02, 0.08), 2.0: (89.65, 0.04)}),
        ("Abadi et al.", "dpsgd",
         {0.1: (84.23, 0.15), 0.25: (87.81, 0.10), 0.5: (90.13, 0.08), 1.0: (90.74, 0.05), 2.0: (90.97, 0.03)}),
        ("AdaCliP", "adaclip",
         {0.1: (85.37, 0.19), 0.25: (88.11, 0.14), 0.5: (90.29, 0.11), 1.0: (90.87, 0.08), 2.0: (91.15, 0.05)}),
    ]),
    (2, "mnist_mlp", ("pixels projected to 60 dimensions by DP-PCA, then one hidden layer of 1,000 units, the budget "
                      "split between PCA and training (dpbench: --profile paper-adaclip, on 60,000 images)"), [
        ("Abadi et al.", "dpsgd",
         {0.2: (85.55, 0.20), 0.5: (90.23, 0.19), 1.0: (92.92, 0.18), 2.0: (94.96, 0.14), 4.0: (95.91, 0.12)}),
        ("AdaCliP", "adaclip",
         {0.2: (87.18, 0.24), 0.5: (91.26, 0.22), 1.0: (93.71, 0.20), 2.0: (95.56, 0.17), 4.0: (96.31, 0.13)}),
    ]),
]

# Tang, Lécuyer, Section 3 (final accuracies quoted in the text beside Figure 1). The paper's "DP-Adam" is the
# corrected optimizer (dpbench's dpadam_bc), "DP-Adam-Biased" the uncorrected one (dpbench's dpadam). No dpbench
# task trains these models yet: ``task`` is None.
DPADAM_CITATION = ("Tang, Lécuyer, \"DP-Adam: Correcting DP Bias in Adam's Second Moment Estimation\" (2023), "
                   "Section 3 and Figure 1")
DPADAM_NOTE = ("ε ≈ 7 at the end of training (Figure 1 caption), δ not stated; learning rate and γ tuned per "
               "optimizer to maximize test accuracy, not charged to the budget")
_DPADAM = [  # (paper's dataset, paper's setting, rows: (paper's row, dpbench method, accuracy %))
    ("CIFAR-10", "5-layer CNN trained from scratch; C = 1, σ = 1, B = 2048",
     [("DP-SGD", "dpsgd", 61.94), ("DP-Adam-Biased", "dpadam", 56.35), ("DP-Adam", "dpadam_bc", 60.27)]),
    ("SNLI", "BERT-base, its last encoder block and the classifier trained from scratch; C = 0.1, σ = 0.4, B = 256",
     [("DP-SGD", "dpsgd", 41.31), ("DP-Adam-Biased", "dpadam", 53.04), ("DP-Adam", "dpadam_bc", 56.62)]),
]


def _yu() -> list[PublishedResult]:
    return [PublishedResult(
        citation=YU_CITATION, source="Yu et al., Table 2", paper_dataset=dataset, paper_data_id=data_id, task=task,
        setting=f"{model}, 80% train / 20% test of the DP-ERM benchmark data (Iyengar et al. 2019)",
        paper_method=paper_method, method=method, epsilon=None if method == "nonprivate" else epsilon,
        epsilon_label="non-private" if method == "nonprivate" else f"ε = {epsilon:g}", delta="1/n²",
        metric="test_accuracy", value=_fraction(accuracies[column]), spread=None,
        note=YU_AMP_NOTE if method == "amp" and dataset in ("MNIST", "Covertype") else YU_NOTE)
        for paper_method, method, accuracies in _YU_ROWS
        for column, (dataset, data_id, task, model, epsilon) in enumerate(_YU_DATASETS)]


def _adaclip() -> list[PublishedResult]:
    return [PublishedResult(
        citation=ADACLIP_CITATION.format(table), source=f"AdaCliP, Table {table}", paper_dataset="MNIST",
        paper_data_id="mnist", task=task, setting=model, paper_method=paper_method, method=method, epsilon=epsilon,
        epsilon_label=f"ε = {epsilon:g}", delta="1e-5", metric="test_accuracy", value=_fraction(accuracy),
        spread=_fraction(spread), note=ADACLIP_NOTE)
        for table, task, model, rows in _ADACLIP_TABLES
        for paper_method, method, by_epsilon in rows
        for epsilon, (accuracy, spread) in by_epsilon.items()]


def _dpadam() -> list[PublishedResult]:
    return [PublishedResult(
        citation=DPADAM_CITATION, source="Tang & Lécuyer, Section 3", paper_dataset=dataset, paper_data_id=None,
        task=None, setting=setting, paper_method=paper_method, method=method, epsilon=7.0, epsilon_label="ε ≈ 7",
        delta="not stated", metric="test_accuracy", value=_fraction(accuracy), spread=None, note=DPADAM_NOTE)
        for dataset, setting, rows in _DPADAM
        for paper_method, method, accuracy in rows]


PUBLISHED: list[PublishedResult] = [*_yu(), *_adaclip(), *_dpadam()]
