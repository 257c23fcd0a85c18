"""The step-time benchmark runs end to end and reports side-by-side ratios and peak memory; its allocator settings."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dpbench.run.allocator import keep_freed_memory

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_time.py"


def test_step_time_reports_every_variant_against_the_non_private_step(tmp_path):
    out = tmp_path / "step_time.json"
    subprocess.run([sys.executable, str(SCRIPT), "--models", "logreg", "--variants", "dpbench", "dpbench_torch_noise",
                    "gaussian_draw", "torch_randn", "opacus_ghost", "--warmup", "1", "--repeats", "3", "--json", str(out)], check=True,
                   capture_output=True)
    rows = {row["variant"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"nonprivate", "dpbench", "dpbench_torch_noise", "gaussian_draw", "torch_randn", "opacus_ghost"}
    assert rows["nonprivate"]["time_ratio"] == 1.0 and rows["nonprivate"]["memory_ratio"] == 1.0
    for row in rows.values():
        assert row["median_seconds"] > 0 and row["time_ratio"] > 0 and row["peak_rss_mb"] > 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the mallopt settings are glibc's")
def test_glibc_takes_the_allocator_settings():
    assert keep_freed_memory()


REUSE = """
import resource, threading
import dpbench, torch
from dpbench.run.allocator import keep_freed_memory
assert keep_freed_memory()
torch.set_num_threads(1)
rows, index = torch.rand(4000, 784), torch.randint(0, 4000, (20000,))  # a 64 MB gather, as a batched step's
faults = []
def step():
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        gathered = rows.index_select(0, index)
        del gathered
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
worker = threading.Thread(target=step)  # a sweep's Dask worker trains in a thread of its own
worker.start(); worker.join()
print(max(faults[2:]))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the mallopt settings are glibc's")
@pytest.mark.parametrize("setting", ["dpbench", "no THP_MEM_ALLOC_ENABLE"])
def test_a_large_tensor_freed_by_one_step_is_reused_by_the_next_in_a_worker_thread(setting):
    """dpbench/run/allocator.py: with its settings a repeated 64 MB tensor comes from memory already mapped (a few page
    faults, not the 15,600 of fresh 4 KB pages); without PyTorch's page alignment it does not (the check can fail)."""
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1" if setting == "dpbench" else "0"}
    faults = int(subprocess.run([sys.executable, "-c", REUSE], check=True, capture_output=True, text=True,
                                env=env).stdout)
    assert (faults < 1000) == (setting == "dpbench")


def test_every_privacy_mutant_finds_its_snippet_exactly_once():
    """A mutant whose snippet no longer matches the code (after an edit or a move) plants nothing: the runner
    refuses it only when someone runs it. Checked here, where every change runs."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "privacy_mutants.py"
    spec = importlib.util.spec_from_file_location("privacy_mutants", path)
    mutants = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutants  # its dataclass looks its module up there
    spec.loader.exec_module(mutants)
    root = path.parents[1]
    stale = {m.name: (root / m.file).read_text().count(m.old) for m in mutants.MUTANTS
             if (root / m.file).read_text().count(m.old) != 1}
    assert not stale, f"mutants whose snippet does not occur exactly once (name: occurrences): {stale}"
    assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS), "two mutants share a name"
    # a catcher that does not exist made pytest exit 4 or 5, which the runner counted as caught (split-label-unchecked
    # after its test was renamed, 27 November)
    missing = [m.name for m in mutants.MUTANTS if m.first and not (
        (root / m.first.split("::")[0]).is_file()
        and ("::" not in m.first or f"def {m.first.split('::')[1].split('[')[0]}(" in (root / m.first.split("::")[0])
             .read_text()))]
    assert not missing, f"mutants whose first test does not exist: {missing}"


def test_a_resumed_mutant_run_keeps_only_outcomes_measured_on_the_same_mutant(tmp_path):
    """privacy_mutants.py --resume: a caught outcome is kept only while its mutant's defect, file, change and first
    test are those it was measured on; an edited mutant, one given another first test, a survivor (the tests may
    have been fixed), or a row without a fingerprint (files older than --resume) runs again."""
    import dataclasses

    mutants = _script("privacy_mutants")
    chosen = mutants.MUTANTS[:3]
    path = tmp_path / "outcomes.json"
    mutants.write(path, [mutants.Outcome(chosen[1].name, "a", "d", True, "t", 1.0),
                         mutants.Outcome(chosen[0].name, "a", "d", True, "t", 2.0)], chosen)
    assert [row["name"] for row in json.loads(path.read_text())] == [chosen[0].name, chosen[1].name]
    assert [o.name for o in mutants.resumed(path, chosen)] == [chosen[0].name, chosen[1].name]
    edited = [chosen[0], dataclasses.replace(chosen[1], new=chosen[1].new + " "), chosen[2]]
    assert [o.name for o in mutants.resumed(path, edited)] == [chosen[0].name]
    other_first = [chosen[0], dataclasses.replace(chosen[1], first="tests/test_cli.py"), chosen[2]]
    assert [o.name for o in mutants.resumed(path, other_first)] == [chosen[0].name]
    rows = json.loads(path.read_text())
    del rows[0]["mutant"]
    path.write_text(json.dumps(rows))
    assert [o.name for o in mutants.resumed(path, chosen)] == [chosen[1].name]
    mutants.write(path, [mutants.Outcome(chosen[1].name, "a", "d", False, None, 9.0),
                         mutants.Outcome(chosen[0].name, "a", "d", True, "t", 2.0)], chosen)
    assert [o.name for o in mutants.resumed(path, chosen)] == [chosen[0].name]  # the survivor runs again


def _script(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "benchmarks" /
                                                  f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("learning_seeds, batch", [(0, 32), (2, 32), (0, 64)])
def test_a_transcription_explains_a_collapse_only_where_every_board_seed_collapses(tmp_path, capsys, monkeypatch,
                                                                                learning_seeds, batch):
    """violation_causes.py's quantile-clip-stall: a transcription that scores the majority rate at the cell's σ and
    without noise, with a control that learns, explains an untuned collapsed cell whose every seed is at the
    majority rate; where two of the board's five seeds learn (the cell still collapsed: not significantly above
    the rate), the transcription's claim is not the board's, and where its command line names another batch size
    than the records' it is another experiment: the cell stays unexplained."""
    from tests.test_leaderboard import add_run

    causes = _script("violation_causes")
    hp = {"batch_size": 32, "epochs": 3, "lr": 0.1, "clip": 1.0}
    for seed in range(5):
        accuracy = 0.1 + (0.02 + 0.01 * seed if seed >= 5 - learning_seeds else 0.0)
        add_run(accuracy, method="quantile_clip", seed=seed, test_majority_rate=0.1, hyperparameters=hp)
    (tmp_path / "quantile_clip_transcription_digits.txt").write_text(
        f"# python benchmarks/root_causes.py --quantile-clip --task digits --batch {batch} --epochs 3 --sigma 0 1.1 "
        "--seeds 0 1\n# quantile clipping\nsigma seed accuracy\n0.0 0 0.1\n0.0 1 0.1\n1.1 0 0.1\n1.1 1 0.1\n"
        "# control: the clip pinned\nsigma seed accuracy\n1.1 0 0.5\n1.1 1 0.5\n")
    monkeypatch.setattr(causes, "TRANSCRIPTIONS", tmp_path)
    records = tmp_path / "results.jsonl"
    from dpbench.cli import main

    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    capsys.readouterr()
    assert causes.main([str(records)]) == 0
    out = capsys.readouterr().out
    explained = out.split("\nquantile-clip-stall: ")[1].split("\n")[0]
    assert "collapsed: digits (add-remove) · none · quantile_clip · ε = 1" in out
    assert (explained, out.split("unexplained: ")[1].split("\n")[0]) == (("1", "0") if (learning_seeds, batch) == (
        0, 32) else ("0", "1")), out


def test_board_spread_compares_each_random_stopping_cell_with_its_validation_twin(tmp_path, capsys):
    """Random stopping spread 4× validation's, on three seeds: the ratio, the seeds a 0.1-wide interval needs, and
    the wide ties counted (dpsgd's and dpgd's random-stopping cells, tied; dpsgd's validated twin is narrow)."""
    from tests.test_leaderboard import add_run

    spread = _script("board_spread")
    for seed, offset in enumerate([-0.01, 0.0, 0.01]):
        add_run(0.8 + offset, seed=seed, tuning={"mode": "validation"}, test_majority_rate=0.1)
        add_run(0.8 + 4 * offset, seed=seed, tuning={"mode": "random-stopping"}, test_majority_rate=0.1)
        add_run(0.79 + 4 * offset, method="dpgd", seed=seed, tuning={"mode": "random-stopping"}, test_majority_rate=0.1)
    records = tmp_path / "results.jsonl"
    from dpbench.cli import main

    assert main(["leaderboard", "--format", "jsonl", "--out", str(records)]) == 0
    capsys.readouterr()
    assert spread.main([str(records)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [row] = [line for line in lines if line.startswith("digits") and " dpsgd " in line]
    assert row.split()[3:] == ["0.0400", "0.0100", "4.00", "5", "wide,", "undecided"], row
    # 2·t(0.975, 3)·0.04/√4 = 0.127 > 0.1 ≥ 2·t(0.975, 4)·0.04/√5 = 0.0993
    assert spread.seeds_for_width(0.04) == 5
    assert "median sd ratio (random stopping / validation) 4.00" in "\n".join(lines)
    assert "2 wide undecided random-stopping cells; the validation twin of 1 of them is not wide" in lines


def test_release_noise_reads_the_ratio_from_the_ledger(tmp_path, capsys, mirror):
    """An output-perturbation record whose noise std is 2 on digits (p = 65) at radius 10: σ·√p/R = 1.61."""
    noise = _script("release_noise")
    record = {"kind": "run", "task": "digits", "method": "output_perturbation", "epsilon_target": 1.0,
              "hyperparameters": {"radius": 10.0}, "test_majority_rate": 0.1, "metrics": {"test_accuracy": 0.1},
              "privacy_ledger": [{"what": f"output noise, classifier {k} (one-vs-all)", "epsilon": 0.1,
                                  "noise_std": 2.0} for k in range(10)]}
    (tmp_path / "r.jsonl").write_text(json.dumps(record) + "\n")
    assert noise.main([str(tmp_path / "r.jsonl")]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("digits")]
    assert row.split()[3:7] == ["1", "10", "0.1", "1.61"], row
