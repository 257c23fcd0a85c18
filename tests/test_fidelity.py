"""``dpbench fidelity`` (dpbench/board/fidelity.py): every published number beside the closest board cell, a
difference only on the paper's data at the paper's ε."""
import json
import re
from pathlib import Path

import pytest

from dpbench.board import fidelity
from dpbench.board.published import FIGURES, PAPERS, PUBLISHED
from dpbench.cli import main
from dpbench.results import store
from dpbench.results.records import LEDGER_VERSION


def record(accuracy, **fields):
    """A record shaped like the engine's: dpgd on adult at target ε = 0.1, untuned, unless told otherwise."""
    found = {
        "task": "adult", "method": "dpgd", "data_id": "adult", "data_note": None, "n_train": 36177, "n_test": 9045,
        "seed": 0, "hyperparameters": {"lr": 1.0, "epochs": 3}, "private": True, "epsilon": 0.0999,
        "epsilon_target": 0.1, "delta": 1e-9, "noise_multiplier": 5.0, "sample_rate": 1.0, "steps": 30,
        "gradient_evaluations": 30, "accountant": "rdp", "sampler": "poisson", "train_seconds": 1.0,
        "metrics": {"test_accuracy": accuracy, "test_loss": 0.5}, "versions": {}, "git_commit": "abc",
        "created_at": "2025-01-01T00:00:00+00:00", "neighbouring": "replace-one", "ledger_version": LEDGER_VERSION,
    } | fields
    found["run_id"] = store.content_id(found)
    return found


NONPRIVATE = {"method": "nonprivate", "private": False, "epsilon": None, "epsilon_target": None, "delta": None,
              "accountant": None, "sampler": "shuffle", "noise_multiplier": 0.0, "neighbouring": None}


def write(tmp_path: Path, records: list[dict]) -> str:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def generate(tmp_path: Path, records: list[dict]) -> str:
    out = tmp_path / "FIDELITY.md"
    assert main(["fidelity", "--records", write(tmp_path, records), "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def row(text: str, dataset: str, method: str, source: str = "## Yu et al., Table 2", epsilon: str = "") -> list[str]:
    """The table row of a published entry (at ``epsilon``, where a method has several), as its cells."""
    section = text.split(source, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith(f"| {dataset} | {method} | {epsilon}")]
    assert len(lines) == 1, lines
    return [cell.strip() for cell in lines[0].strip("|").split(" | ")]


def test_rows_give_board_minus_published_from_the_closest_cell_on_the_papers_data(tmp_path):
    validation = {"tuning": {"mode": "validation"}}
    records = [
        # dpgd, adult, ε = 0.1: mean 81.00 against Yu's 80.9, in the validation track, the papers' protocol
        record(0.80, seed=0, **validation), record(0.82, seed=1, **validation),
        record(0.70, seed=0), record(0.72, seed=1),  # the untuned track comes after it
        record(0.60, seed=0, epsilon_target=0.5, epsilon=0.5, **validation),  # another ε: not the closest cell
        record(0.851, seed=0, **NONPRIVATE), record(0.853, seed=1, **NONPRIVATE),  # 85.20 against 84.8
        record(0.79, seed=0, method="dpsgd", epsilon_target=1.0, epsilon=1.0),  # dpsgd only at ε = 1
        # AMP: the paper's ε in the untuned track comes before the validation track at another ε
        record(0.78, seed=0, method="amp"), record(0.80, seed=1, method="amp"),
        record(0.60, seed=0, method="amp", epsilon_target=0.5, epsilon=0.5, **validation),
    ]
    text = generate(tmp_path, records)
    assert fidelity.COMMAND.split(" --records")[0] in text and f"--out {tmp_path / 'FIDELITY.md'}" in text
    dpgd = row(text, "Adult", "DP-GD → dpgd")
    assert dpgd[2:4] == ["ε = 0.1", "80.9"] and dpgd[4].startswith("81.00 [")
    assert "n = 2; adult · adult · ε = 0.1 · validation)" in dpgd[4]
    assert dpgd[5] == "+0.10" and dpgd[6].startswith("published value inside the cell's 95% interval; within 1.5")
    baseline = row(text, "Adult", "Non private → nonprivate")
    assert baseline[4].startswith("85.20 [") and baseline[5] == "+0.40"
    amp = row(text, "Adult", "AMP → amp")
    assert "79.00 [" in amp[4] and "ε = 0.1 · none)" in amp[4] and amp[5] == "-0.30"
    # The nearest ε is not the paper's: shown beside it, but no difference.
    dpsgd = row(text, "Adult", "DP-SGD → dpsgd")
    assert dpsgd[4].startswith("79.00 (n = 1;") and dpsgd[5] == "—"
    assert dpsgd[6] == "not comparable: the nearest board ε is ε = 1, the paper's ε = 0.1"
    assert row(text, "Adult", "Out-SGD → output_perturbation")[4:6] == ["—", "—"]
    assert "- 67 published numbers" in text and "4 have a board cell of the closest protocol; 3 of those are " \
        "comparable (the same data and ε), 3 of them within 1.5 points." in text


def test_every_published_number_and_figure_is_listed(tmp_path):
    text = generate(tmp_path, [record(0.8)])
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| dataset |", "| paper |", "| ---"))]
    numbers = [tuple(cells[:4] + cells[7:]) for cells in rows if len(cells) == 8]
    assert len(numbers) == len(PUBLISHED) == 67
    for entry in PUBLISHED:
        spread = f" ± {entry.spread * 100:.2f}" if entry.spread is not None else ""
        assert (entry.paper_dataset, f"{entry.paper_method} → {entry.method}", entry.epsilon_label,
                f"{entry.value * 100:g}{spread}", entry.where) in numbers, entry
    yu = {(e.paper_dataset, e.method): e.value for e in PUBLISHED if e.source == "Yu et al., Table 2"}
    assert len(yu) == 35 and yu["Gisette", "dpgd"] == 0.673 and yu["Real-sim", "dpsgd"] == 0.738 \
        and yu["RCV1", "output_perturbation"] == 0.667
    for figure in FIGURES:
        assert f"| {figure.source} | {figure.figure} |" in text
    figure2 = next(line for line in text.splitlines() if line.startswith("| AdaCliP | Figure 2 |"))
    assert "the text says only" in figure2
    assert "| Yu et al. | Figure 3 |" in text and "none: the figure has no printed numbers" in text


def test_another_data_id_is_not_comparable_and_gets_no_difference(tmp_path):
    mnist = {"task": "mnist_logreg", "data_id": "mnist-5k-train", "n_train": 4000, "epsilon_target": 1.0,
             "epsilon": 1.0, "method": "dpsgd", "data_note": "a 5,000-image subset"}
    records = [record(0.875, seed=0, **mnist), record(0.875, seed=1, **mnist),  # Yu's own MNIST DP-SGD value
               record(0.80, seed=0, data_id="adult-first1k"), record(0.81, seed=1, data_id="adult-first1k")]
    text = generate(tmp_path, records)
    cells = row(text, "MNIST", "DP-SGD → dpsgd")
    assert cells[4].startswith("87.50 [") and cells[5] == "—"
    assert cells[6] == ("not comparable: data not in the offline mirror: the board's data is mnist-5k-train, not "
                        "MNIST's 70,000 images, training and test pooled, split 80/20")
    adult = row(text, "Adult", "DP-GD → dpgd")
    assert adult[5] == "—" and adult[6].startswith("not comparable: the board's data is adult-first1k, not UCI Adult")
    # AdaCliP's MNIST is the canonical one: still not the board's subset.
    adaclip = row(text, "MNIST", "Abadi et al. → dpsgd", "## AdaCliP, Table 1", "ε = 1 |")
    assert adaclip[5] == "—" and "the board's data is mnist-5k-train, not MNIST's 60,000" in adaclip[6]
    assert "0 of those are comparable" in text
    assert "- MNIST: the paper's data is MNIST's 70,000 images" in text and "`mnist-5k-train` (a 5,000-image " \
        "subset)" in text


def test_an_entry_without_the_papers_data_id_is_never_comparable(tmp_path):
    """Gisette: the benchmark's 80/20 split of UCI's gisette_train has no dpbench data id (None), so no board data
    matches it."""
    gisette = {"task": "gisette", "data_id": "gisette", "n_train": 6000}
    text = generate(tmp_path, [record(0.673, seed=0, **gisette), record(0.673, seed=1, **gisette)])
    cells = row(text, "Gisette", "DP-GD → dpgd")
    assert cells[5] == "—" and cells[6].startswith("not comparable: data not in the offline mirror: the board's data "
                                                   "is gisette, not UCI's gisette_train.data")


def test_kddcup99_is_compared_on_the_benchmarks_sample(tmp_path):
    """KDDCup99: task kddcup99_dperm reproduces the DP-ERM benchmark's 70,000-row sample (data id
    kddcup99-dperm-70k): its cells get a difference; the kddcup99 task's whole 10% set is not the paper's data."""
    dperm = {"task": "kddcup99_dperm", "data_id": "kddcup99-dperm-70k", "n_train": 56000,
             "tuning": {"mode": "validation"}}
    kdd = {"task": "kddcup99", "data_id": "kddcup99-10pct", "n_train": 395216}
    records = [record(0.977, seed=0, **dperm), record(0.979, seed=1, **dperm),
               record(0.990, seed=0, **kdd), record(0.990, seed=1, **kdd)]
    cells = row(generate(tmp_path, records), "KDDCup99", "DP-GD → dpgd")
    assert cells[4].startswith("97.80 [") and "kddcup99_dperm · kddcup99-dperm-70k" in cells[4]
    assert cells[5] == "-0.90" and "within 1.5 points" in cells[6]
    kdd_only = row(generate(tmp_path, records[2:]), "KDDCup99", "DP-GD → dpgd")
    assert kdd_only[5] == "—" and kdd_only[6].startswith("no board cell: the records hold no runs of task "
                                                         "kddcup99_dperm")


def test_fidelity_needs_records(refused):
    assert "--records" in refused("fidelity")


@pytest.mark.skipif(not Path(PAPERS).is_dir(), reason="the plain-text copies of the papers are not here")
def test_every_number_is_printed_on_the_line_it_cites():
    for entry in PUBLISHED:
        name, _, rest = entry.where.partition(" line ")
        line = Path(PAPERS, name).read_text(encoding="utf-8").splitlines()[int(rest.split()[0]) - 1]
        printed = {f"{entry.value * 100:.2f}", f"{entry.value * 100:.1f}", f"{entry.value * 100:g}"}
        assert any(re.search(rf"(?<![0-9.]){re.escape(p)}(?![0-9])", line) for p in printed), (entry, line[:80])
        if entry.spread is not None:
            assert f"{entry.spread * 100:.2f}" in line
