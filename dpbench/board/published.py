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
``spread`` is the ± printed beside the value, if any; ``note`` says what the paper says about averaging and tuning;
``where`` is where the number is printed in the plain-text copy of the paper (``/work/shared/papers/``: the copies
have no page numbers, so the file and its line numbers); ``paper_data`` says in words what data the paper trained and
tested on, and ``in_mirror`` whether the offline data mirror holds that data (or the file it is drawn from), so that
``leaderboards/FIDELITY.md`` can say why a board cell is not comparable; ``profile`` is the dpbench profile of
``task`` that reproduces the paper's setting (None: the task's defaults), which the fidelity report prefers.

:data:`FIGURES` lists the seed papers' figures and other printed results that are not accuracies on a dpbench
metric, with the numbers the text gives for them (often none). :mod:`dpbench.board.fidelity` puts every entry of
both lists beside the board.
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
    where: str = ""
    paper_data: str = ""
    in_mirror: bool | None = None
    profile: str | None = None


def _fraction(percent: float) -> float:
    return round(percent / 100, 6)


PAPERS = "/work/shared/papers/"
YU_FILE, ADACLIP_FILE, ADADP_FILE, DPADAM_FILE = (
    "002_e45ed5bb9a81dd44.txt", "000_4a11c3a79d395044.txt", "001_c5223fbf25cfdaab.txt", "003_d1a76a6628de43f8.txt")
#: Where the paper's datasets come from when the text does not say: Yu et al. "use the benchmark datasets provided by
#: iyengar2019towards" (line 268), whose code prepares them (github.com/sunblaze-ucb/dpml-benchmark,
#: ``datasets/preprocess/*.py``, commit 820cc89; Yu et al.'s own dataset table, Appendix B, is not in the copy).
DPML_BENCHMARK = "sunblaze-ucb/dpml-benchmark datasets/preprocess"

# Yu, Zhang, Chen, Yin, Liu, Table 2 ("validation accuracy (in %)" on the held-out 20%), all seven columns.
YU_CITATION = ("Yu, Zhang, Chen, Yin, Liu, \"Gradient Perturbation is Underrated for Differentially Private Convex "
               "Optimization\" (arXiv:1911.11363), Table 2")
YU_NOTE = ("mean of 20 runs; steps and learning rate chosen from grids, not charged to the budget (Section 4); "
           "ε = 0.1 for the binary and ε = 1 for the multi-class datasets, δ = 1/n², as Section 4 and the Table 2 "
           "caption state (the plain-text copy loses these symbols and values, lines 276, 286 and 294: they are "
           "the arXiv version's)")
YU_AMP_NOTE = YU_NOTE + "; AMP on MNIST and Covertype: numbers Yu et al. quote from Iyengar et al. 2019"
_YU_DATASETS = [  # (paper's dataset, its dpbench data id, dpbench task, model, ε, the paper's data, in the mirror?)
    # The benchmark draws 70,000 rows with replacement from the 10% set: task kddcup99_dperm reproduces that sample
    # (tasks/dperm.py); the kddcup99 task's whole 10% set is other data.
    ("KDDCup99", "kddcup99-dperm-70k", "kddcup99_dperm", "logistic regression", 0.1,
     "70,000 rows drawn with replacement from KDD Cup 99's 10% set (the benchmark's sample, seed 10000019)", True),
    ("Adult", "adult", "adult", "logistic regression", 0.1,
     "UCI Adult, adult.data + adult.test without rows holding '?' (45,222 rows)", True),
    # The benchmark pools MNIST's training and test images and splits 80/20: not dpbench's "mnist" (60,000/10,000).
    ("MNIST", None, "mnist_logreg", "softmax regression", 1.0,
     "MNIST's 70,000 images, training and test pooled, split 80/20", False),
    ("Covertype", "covertype", "covertype", "softmax regression", 1.0,
     "all 581,012 Covertype records", False),
    # The benchmark reads UCI's gisette_train (6,000 rows) and splits it 80/20; dpbench's "gisette" is LIBSVM's
    # gisette_scale with its own 1,000-row test file.
    ("Gisette", None, "gisette", "logistic regression", 0.1,
     "UCI's gisette_train.data (6,000 rows), split 80/20", False),
    ("Real-sim", "realsim", "realsim", "logistic regression", 0.1,
     "LIBSVM's real-sim (72,309 rows)", False),
    # The benchmark's RCV1 is 50,000 documents of scikit-learn's RCV1-v2 (label CCAT); dpbench's "rcv1" is LIBSVM's
    # rcv1_train.binary (20,242 rows).
    ("RCV1", None, "rcv1", "logistic regression", 0.1,
     "50,000 documents drawn from the first 500,000 of scikit-learn's RCV1-v2, label CCAT", False),
]
_YU_ROWS = [  # (paper's row, dpbench method, line of the copy, accuracy in % per dataset above)
    ("Non private", "nonprivate", 289, [99.1, 84.8, 91.9, 71.2, 96.6, 93.3, 93.5]),
    ("AMP", "amp", 290, [97.5, 79.3, 71.9, 64.3, 62.8, 73.1, 64.5]),  # the line starts with footnote 1's text
    ("Out-SGD", "output_perturbation", 291, [98.1, 77.4, 69.4, 62.4, 62.3, 73.2, 66.7]),
    ("DP-SGD", "dpsgd", 292, [98.7, 80.4, 87.5, 67.7, 63.0, 73.8, 70.4]),
    ("DP-GD", "dpgd", 293, [98.7, 80.9, 88.6, 66.2, 67.3, 76.1, 74.9]),
]

# Pichapati, Suresh, Yu, Reddi, Kumar, Tables 1 and 2: MNIST (60,000 train / 10,000 test), (ε, 1e-5)-DP, moments
# accountant, batch size 600. "(norm bound)" is noise scaled to the gradient norm bound without clipping,
# "(Abadi et al)" is DP-SGD. Section 6's text says "Table 2" for the logistic regression: the captions are taken.
ADACLIP_CITATION = ("Pichapati, Suresh, Yu, Reddi, Kumar, \"AdaCliP: Adaptive Clipping for Private SGD\" (2019), "
                    "Table {}")
ADACLIP_NOTE = "only h2 tuned (Section 6); the ± is printed without saying over how many runs"
MNIST_CANONICAL = "MNIST's 60,000 training / 10,000 test images"
_ADACLIP_TABLES = [  # (table, dpbench task, its profile, paper's model, rows: (paper's row, dpbench method, line,
    #                   {ε: (accuracy %, ±)}))
    (1, "mnist_logreg", None, "multinomial logistic regression on pixels in [0, 1]", [
        ("norm bound", "norm_bound", 262,
         {0.1: (73.45, 0.23), 0.25: (79.18, 0.18), 0.5: (84.30, 0.13), 1.0: (88.02, 0.08), 2.0: (89.65, 0.04)}),
        ("Abadi et al.", "dpsgd", 263,
         {0.1: (84.23, 0.15), 0.25: (87.81, 0.10), 0.5: (90.13, 0.08), 1.0: (90.74, 0.05), 2.0: (90.97, 0.03)}),
        ("AdaCliP", "adaclip", 264,
         {0.1: (85.37, 0.19), 0.25: (88.11, 0.14), 0.5: (90.29, 0.11), 1.0: (90.87, 0.08), 2.0: (91.15, 0.05)}),
    ]),
    (2, "mnist_mlp", "paper-adaclip", (
        "pixels projected to 60 dimensions by DP-PCA, then one hidden layer of 1,000 units, the budget split between "
        "PCA and training (dpbench: --profile paper-adaclip, on 60,000 images)"), [
        ("Abadi et al.", "dpsgd", 267,
         {0.2: (85.55, 0.20), 0.5: (90.23, 0.19), 1.0: (92.92, 0.18), 2.0: (94.96, 0.14), 4.0: (95.91, 0.12)}),
        ("AdaCliP", "adaclip", 268,
         {0.2: (87.18, 0.24), 0.5: (91.26, 0.22), 1.0: (93.71, 0.20), 2.0: (95.56, 0.17), 4.0: (96.31, 0.13)}),
    ]),
]

# Koskela & Honkela print one accuracy; every other result of theirs is a figure (:data:`FIGURES`).
ADADP_CITATION = ("Koskela, Honkela, \"Learning Rate Adaptation for Federated and Differentially Private Learning\" "
                  "(2018), Section \"Datasets and test architectures\"")
ADADP_NOTE = ("\"around 96%\": no decimals, no number of runs; \"without additional noise (σ = 0)\", whether the "
              "gradients were still clipped is not said")

# Tang, Lécuyer, Section 3 (final accuracies quoted in the text beside Figure 1). The paper's "DP-Adam" is the
# corrected optimizer (dpbench's dpadam_bc), "DP-Adam-Biased" the uncorrected one (dpbench's dpadam). The tasks
# cifar10_cnn and snli train these models (the snli task offline with a smaller encoder than BERT-base).
DPADAM_CITATION = ("Tang, Lécuyer, \"DP-Adam: Correcting DP Bias in Adam's Second Moment Estimation\" (2023), "
                   "Section 3 and Figure 1")
DPADAM_NOTE = ("ε ≈ 7 at the end of training (Figure 1 caption), δ not stated; learning rate and γ tuned per "
               "optimizer to maximize test accuracy, not charged to the budget")
_DPADAM = [  # (paper's dataset, dpbench data id, task, paper's setting, paper's data, rows: (row, method, accuracy %))
    ("CIFAR-10", "cifar10", "cifar10_cnn", "5-layer CNN trained from scratch; C = 1, σ = 1, B = 2048",
     "CIFAR-10's original 50,000 training / 10,000 test images",
     [("DP-SGD", "dpsgd", 61.94), ("DP-Adam-Biased", "dpadam", 56.35), ("DP-Adam", "dpadam_bc", 60.27)]),
    ("SNLI", "snli", "snli",
     "BERT-base, its last encoder block and the classifier trained from scratch; C = 0.1, σ = 0.4, B = 256",
     "SNLI 1.0's 549,367 training pairs",
     [("DP-SGD", "dpsgd", 41.31), ("DP-Adam-Biased", "dpadam", 53.04), ("DP-Adam", "dpadam_bc", 56.62)]),
]


def _yu() -> list[PublishedResult]:
    return [PublishedResult(
        citation=YU_CITATION, source="Yu et al., Table 2", paper_dataset=dataset, paper_data_id=data_id, task=task,
        setting=f"{model}, 80% train / 20% test of the DP-ERM benchmark data (Iyengar et al. 2019; as its code "
                f"prepares them: {DPML_BENCHMARK}/)",
        paper_method=paper_method, method=method, epsilon=None if method == "nonprivate" else epsilon,
        epsilon_label="non-private" if method == "nonprivate" else f"ε = {epsilon:g}", delta="1/n²",
        metric="test_accuracy", value=_fraction(accuracies[column]), spread=None,
        note=YU_AMP_NOTE if method == "amp" and dataset in ("MNIST", "Covertype") else YU_NOTE,
        where=f"{YU_FILE} line {line} (Table 2: header line 288, caption line 294)", paper_data=paper_data,
        in_mirror=in_mirror)
        for paper_method, method, line, accuracies in _YU_ROWS
        for column, (dataset, data_id, task, model, epsilon, paper_data, in_mirror) in enumerate(_YU_DATASETS)]


def _adaclip() -> list[PublishedResult]:
    return [PublishedResult(
        citation=ADACLIP_CITATION.format(table), source=f"AdaCliP, Table {table}", paper_dataset="MNIST",
        paper_data_id="mnist", task=task, setting=model, paper_method=paper_method, method=method, epsilon=epsilon,
        epsilon_label=f"ε = {epsilon:g}", delta="1e-5", metric="test_accuracy", value=_fraction(accuracy),
        spread=_fraction(spread), note=ADACLIP_NOTE,
        where=f"{ADACLIP_FILE} line {line} (Table {table}: caption line {260 if table == 1 else 265})",
        paper_data=MNIST_CANONICAL, in_mirror=False, profile=profile)
        for table, task, profile, model, rows in _ADACLIP_TABLES
        for paper_method, method, line, by_epsilon in rows
        for epsilon, (accuracy, spread) in by_epsilon.items()]


def _adadp() -> list[PublishedResult]:
    return [PublishedResult(
        citation=ADADP_CITATION, source="Koskela & Honkela, Experiments", paper_dataset="MNIST",
        paper_data_id="mnist", task="mnist_mlp",
        setting="feedforward network, 2 hidden layers of 256 ReLU units (dpbench: --profile paper-256)",
        paper_method="no noise (σ = 0)", method="nonprivate", epsilon=None, epsilon_label="non-private",
        delta="none", metric="test_accuracy", value=0.96, spread=None, note=ADADP_NOTE,
        where=f"{ADADP_FILE} line 198", paper_data=MNIST_CANONICAL, in_mirror=False, profile="paper-256")]


def _dpadam() -> list[PublishedResult]:
    return [PublishedResult(
        citation=DPADAM_CITATION, source="Tang & Lécuyer, Section 3", paper_dataset=dataset, paper_data_id=data_id,
        task=task, setting=setting, paper_method=paper_method, method=method, epsilon=7.0, epsilon_label="ε ≈ 7",
        delta="not stated", metric="test_accuracy", value=_fraction(accuracy), spread=None, note=DPADAM_NOTE,
        where=f"{DPADAM_FILE} line 96 (Figure 1 caption, line 99)", paper_data=paper_data, in_mirror=False,
        profile="paper")
        for dataset, data_id, task, setting, paper_data, rows in _DPADAM
        for paper_method, method, accuracy in rows]


PUBLISHED: list[PublishedResult] = [*_yu(), *_adaclip(), *_adadp(), *_dpadam()]


@dataclass(frozen=True)
class PublishedFigure:
    """A figure or table of a seed paper that prints no accuracy on a dpbench metric: what it shows, the numbers
    the text gives for it ("" if none), and the board's records of the same setting, if any (``board``)."""

    source: str
    figure: str
    where: str
    shows: str
    printed: str
    board: str = ""


FIGURES: list[PublishedFigure] = [
    PublishedFigure("Yu et al.", "Figure 1", f"{YU_FILE} line 181 (text lines 171-179)",
                    "minimum and average curvature of regularized logistic regression on Adult over training", ""),
    PublishedFigure("Yu et al.", "Figure 2", f"{YU_FILE} line 182",
                    "an illustration of a loss in the high-dimensional setting (Negahban et al.'s Figure 3)", ""),
    PublishedFigure("Yu et al.", "Figure 3", f"{YU_FILE} line 296 (text line 286)",
                    "validation accuracy against ε for every dataset and method of Table 2, with the non-private "
                    "baseline", ""),
    PublishedFigure("Yu et al.", "Appendix C figure", f"{YU_FILE} line 171",
                    "curvatures on KDDCup99 (\"similar to Figure 2\"); the appendix is not in the plain-text copy",
                    ""),
    PublishedFigure("AdaCliP", "Figure 1", f"{ADACLIP_FILE} line 60", "an outline of private SGD (a diagram)", ""),
    PublishedFigure("AdaCliP", "Figure 2",
                    f"{ADACLIP_FILE} line 257 (caption; text line 270, which calls it \"Figure 3\")",
                    "ℓ2² regression error against the dimension d for Abadi et al.'s clipping and AdaCliP on the "
                    "synthetic regression (1,000 points x_i = (±1, 0, …, 0); clip 1.0, σ = 0.1, 10 epochs, "
                    "batch 1, learning rate 0.01)",
                    "none: the text says only that Abadi et al.'s error is \"much higher\" and that AdaCliP's "
                    "\"remains independent of the number of dimensions\"",
                    "task adaclip_regression reproduces the setting (metric ||θ||²)"),
    PublishedFigure("AdaCliP", "Figure 3", f"{ADACLIP_FILE} line 259 (text line 278)",
                    "average noise per gradient, E||g − g̃||, against ε for the (ε, 1e-5)-DP neural network",
                    "the ratio of AdaCliP's noise to Abadi et al.'s is \"around 0.8 for all ε\""),
    PublishedFigure("AdaCliP", "Figure 4 (Appendix B)", f"{ADACLIP_FILE} lines 400-404 (text line 423)",
                    "SGD with momentum factors β on the MNIST logistic regression without clipping (noise scaled to "
                    "the norm bound 28): (a) convergence at (0.5, 1e-5), (b) accuracy against ε",
                    "none: \"converge to almost similar accuracies\""),
    PublishedFigure("Koskela & Honkela", "Figure 1", f"{ADADP_FILE} lines 206-210 (text line 204)",
                    "federated averaging on CIFAR-10, 5 clients, ADADP against learning-rate-tuned SGD: (a) data "
                    "interpolated between the pathological split and uniform, (b) the pathological split", "",
                    "leaderboards/federated/ (records.jsonl, README.md, figure1.png) reproduce it on "
                    "cifar10-jpeg-train40k"),
    PublishedFigure("Koskela & Honkela", "Figure 2", f"{ADADP_FILE} lines 211-215 (text line 217)",
                    "federated CIFAR-10 test accuracy after 200 rounds against the share of random data and against "
                    "the (initial) learning rate, averages of three runs", "",
                    "leaderboards/federated/ (figure2.png; 50 rounds, not 200)"),
    PublishedFigure("Koskela & Honkela", "Figure 3", f"{ADADP_FILE} lines 221-222 (text line 219)",
                    "federated averaging with Adam clients, 33% random data, several initial learning rates", "",
                    "leaderboards/federated/ (figure3.png)"),
    PublishedFigure("Koskela & Honkela", "Figure 4", f"{ADADP_FILE} lines 223-227 (text lines 231-235)",
                    "DP training, ADADP against Adam with the best and second-best initial learning rate, (a) MNIST, "
                    "(b) CIFAR-10, |B| = 200, 100 epochs, δ = 1e-5", "",
                    "leaderboards/deep/ (mnist_mlp and cifar10 ada_dp runs, one seed each)"),
    PublishedFigure("Koskela & Honkela", "Figure 5", f"{ADADP_FILE} lines 242-246 (text lines 239-240)",
                    "ADADP against SGD whose learning rate was tuned at σ = 2, at σ = 4, 6, 8, (a) MNIST, "
                    "(b) CIFAR-10", "", "leaderboards/deep/ (mnist_mlp dpsgd and ada_dp runs at σ = 2)"),
    PublishedFigure("Tang & Lécuyer", "Table 1", f"{DPADAM_FILE} lines 105-110",
                    "summary statistics of the clean (v_t^c) and private (v_t^p) second-moment estimates on SNLI",
                    "min, Q1, median, Q3, max, mean at t = 5000: v_t^c 4.757e-21, 1.802e-13, 6.333e-13, 1.481e-12, "
                    "2.647e-8, 4.050e-12; v_t^p 2.025e-8, 2.363e-8, 2.426e-8, 2.463e-8, 5.324e-8, 2.436e-8; at "
                    "t = 20000: v_t^c 6.584e-22, 5.867e-14, 2.925e-13, 8.372e-13, 1.060e-8, 3.673e-12; v_t^p "
                    "2.065e-8, 2.408e-8, 2.460e-8, 2.513e-8, 3.657e-8, 2.461e-8"),
    PublishedFigure("Tang & Lécuyer", "Figure 1", f"{DPADAM_FILE} line 99 (text line 96)",
                    "test accuracy over training of DP-SGD, DP-Adam-Biased and DP-Adam on CIFAR-10 and SNLI",
                    "the final accuracies (the six Tang & Lécuyer rows above); the text's differences \"a 444 "
                    "percentage points improvement\" and \"3.53.53.5 percentage points\" are the copy's garbling "
                    "of 4 and 3.5 (60.27 − 56.35 = 3.92; 56.62 − 53.04 = 3.58)"),
    PublishedFigure("Tang & Lécuyer", "Figure 2", f"{DPADAM_FILE} line 115 (text line 112)",
                    "histograms of the clean, private and corrected first and second moments and Adam updates on SNLI "
                    "(B = 256, C = 0.1, σ = 0.4, β2 = 0.999)", "Φ ≈ 2.441e-8 (the bias subtracted)"),
    PublishedFigure("Tang & Lécuyer", "Figure 3", f"{DPADAM_FILE} line 126 (text lines 119-130)",
                    "accuracy when subtracting other values Φ′, tuning γ′ (DP-Adam), γ and β (DP-Adam-Biased)",
                    "settings only: Φ = 2.4e-8 against Φ′ = 1e-7 and 1e-9; β1 = 0.9, β2 = 0.99 the defaults; "
                    "learning rates 1e-4 to 1e-2"),
]
