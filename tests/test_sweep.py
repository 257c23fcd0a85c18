"""``dpbench sweep``: tracks, batching, resuming by record identity, refusals, workers."""
import json
from pathlib import Path

import pytest

from dpbench.board import sweep
from dpbench.board.sweep import run_grid
from dpbench.cli import main
from dpbench.results import store
from dpbench.results.identity import identity
from dpbench.trust import record_checks

REPO = Path(__file__).resolve().parents[1]


def test_sweep_batches_the_seeds_it_can_and_resumes(capsys):
    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd", "ada_dp", "amp"], "epsilons": [1.0], "seeds": 2}
    assert run_grid(grid) == {"ran": 6, "already stored": 0, "refused": 0}
    records = store.load()
    batched = {r["method"]: r.get("batched_seeds") for r in records}
    assert batched == {"dpsgd": 2, "ada_dp": 2, "amp": None}  # ADADP batched too (two releases per step)
    assert sorted((r["method"], r["seed"]) for r in records) == sorted(
        (m, s) for m in grid["methods"] for s in (0, 1))
    assert run_grid(grid) == {"ran": 0, "already stored": 6, "refused": 0}


def test_sweep_reruns_a_cell_whose_stored_records_ran_other_settings_code_or_ledger():
    """The sweep counted any stored run of the same (task, method, ε, seed) as done, whatever its ledger version,
    data, δ, hyperparameters or code: records made before a privacy fix would have been reused silently."""
    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd", "output_perturbation"], "epsilons": [1.0], "seeds": 1}
    assert run_grid(grid) == {"ran": 2, "already stored": 0, "refused": 0}
    fresh = store.load()
    for change in [{"ledger_version": 1}, {"delta": 1e-9}, {"data_id": "breast_cancer-v0"},
                   {"hyperparameters": {"lr": 123.0}}, {"code": {"method": {"sha256": "0" * 64}}}]:
        store.default_path().unlink()
        for record in fresh:
            stale = {**record, **change}
            stale["run_id"] = store.content_id(stale)
            store.append(stale)
        assert run_grid(grid) == {"ran": 2, "already stored": 0, "refused": 0}, change
    assert run_grid(grid) == {"ran": 0, "already stored": 2, "refused": 0}


def test_sweep_starts_the_full_data_methods_and_splits_the_unbatched_ones_by_seed():
    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd", "amp", "dpgd"], "epsilons": [1.0], "seeds": 2,
            "tracks": ["none", "validation"], "trials": 2}
    jobs, done, refused = sweep.pending(grid)
    assert done == 0 and not refused
    assert [(cell.track, cell.method, cell.seeds) for cell in jobs] == [
        ("validation", "amp", (0, 1)), ("validation", "dpgd", (0, 1)), ("none", "amp", (0,)), ("none", "amp", (1,)),
        ("none", "dpgd", (0, 1)), ("validation", "dpsgd", (0, 1)), ("none", "dpsgd", (0, 1))]


def test_sweep_workers_give_the_records_of_one_process(isolated_home, monkeypatch):
    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd", "amp", "ada_dp"], "epsilons": [1.0, 2.0], "seeds": 2}
    assert run_grid(grid, workers=2) == {"ran": 12, "already stored": 0, "refused": 0}
    parallel = {(r["method"], r["epsilon_target"], r["seed"]): r["metrics"] for r in store.load()}
    monkeypatch.setenv("DPBENCH_HOME", str(isolated_home.parent / "one-process"))
    assert run_grid(grid) == {"ran": 12, "already stored": 0, "refused": 0}
    assert {(r["method"], r["epsilon_target"], r["seed"]): r["metrics"] for r in store.load()} == parallel




def test_three_tracks_run_every_method_alike_and_resume(capsys):
    """Each track's records say which they are; a second sweep finds every run stored; AMP and the non-private
    baseline are refused by the random-stopping track, with the reason."""
    grid = {"tasks": ["breast_cancer"], "methods": ["nonprivate", "dpsgd", "output_perturbation", "amp"],
            "epsilons": [1.0], "seeds": 2, "tracks": ["none", "validation", "random-stopping"], "trials": 3,
            "neighbouring": "replace-one"}
    counts = run_grid(grid, progress=False)
    assert counts == {"ran": 2 * (4 + 4 + 2), "already stored": 0, "refused": 4}
    err = capsys.readouterr().err
    assert "random-stopping: amp on breast_cancer refused: amp: AMP's privacy is an (ε, δ) theorem" in err
    assert "random-stopping: nonprivate on breast_cancer refused" in err
    by_track = {}
    for record in store.load():
        by_track.setdefault((record.get("tuning") or {}).get("mode", "none"), set()).add(record["method"])
    assert by_track == {"none": {"nonprivate", "dpsgd", "output_perturbation", "amp"},
                        "validation": {"nonprivate", "dpsgd", "output_perturbation", "amp"},
                        "random-stopping": {"dpsgd", "output_perturbation"}}
    private = [r for r in store.load() if r["private"]]
    assert {r["neighbouring"] for r in private} == {"replace-one"}
    validated = [r for r in store.load() if (r.get("tuning") or {}).get("mode") == "validation" and r["private"]]
    assert all(r["tuning"]["private"] is False and "not charged" in r["tuning"]["selected_by"] for r in validated)
    assert all(r["n_train"] == 455 for r in validated)  # the selected configuration trains on all the training data
    released = [r for r in store.load() if (r.get("tuning") or {}).get("mode") == "random-stopping"]
    assert sorted((r["method"], r["seed"]) for r in released) == [("dpsgd", 0), ("dpsgd", 1),
                                                                  ("output_perturbation", 0), ("output_perturbation", 1)]
    assert all(r["epsilon"] <= 1.0 and r["accountant"] == "rdp" for r in released)
    assert run_grid(grid, progress=False) == {"ran": 0, "already stored": 20, "refused": 4}


def test_the_random_stopping_track_runs_the_count_and_correlated_methods_and_resumes(capsys):
    """quantile_clip, bandmf and dpftrl are tuned privately (their trials' own mechanisms); the sweep planned their
    cells' identity with Poisson batches and refused the correlated ones (the rebuild of 27 November)."""
    grid = {"tasks": ["breast_cancer"], "methods": ["quantile_clip", "bandmf", "dpftrl"], "epsilons": [1.0],
            "seeds": 1, "tracks": ["random-stopping"], "trials": 2, "neighbouring": "replace-one"}
    assert run_grid(grid, progress=False) == {"ran": 3, "already stored": 0, "refused": 0}, capsys.readouterr().err
    released = {r["method"]: r for r in store.load()}
    assert {m: r["sampler"] for m, r in released.items()} == {"quantile_clip": "poisson", "bandmf": "cyclic",
                                                              "dpftrl": "cyclic"}
    assert all(r["epsilon"] <= 1.0 and record_checks.check(r) == [] for r in released.values())
    assert run_grid(grid, progress=False) == {"ran": 0, "already stored": 3, "refused": 0}


@pytest.mark.parametrize("grid, message", [
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": 1, "trak": []}, "unknown keys trak"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1]}, "lacks seeds"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [0], "seeds": 1}, "positive numbers"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": 1, "tracks": ["best"]}, "unknown tracks"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": 1, "neighbouring": "swap"},
     "neighbouring must be"),
    ({"tasks": ["nope"], "methods": ["dpsgd"], "epsilons": [1], "seeds": 1}, "unknown methods or tasks"),
    ([1, 2], "not a JSON object"),
    # Issue 35, item 7: the error names the field and what it takes.
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": [0, 1, 2]},
     "seeds must be a whole number from 1 to 10000 (how many seeds: 0, 1, ... run), or a mapping of task names and "
     '"default" to such numbers, got [0, 1, 2]'),
    ({"tasks": "digits", "methods": ["dpsgd"], "epsilons": [1], "seeds": 1},
     'tasks must be a non-empty list of names, got "digits"'),
    ({"tasks": ["digits"], "methods": [], "epsilons": [1], "seeds": 1}, "methods must be a non-empty list of names"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": 1, "seeds": 1},
     "epsilons must be a non-empty list of positive numbers, got 1"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": 1, "trials": 0},
     "trials must be a whole number from 1 to 10000 (configurations or the mean of K per cell), got 0"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": 1, "tracks": "none"},
     "tracks must be a non-empty list of names"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": {"breast_cancer": 3, "default": 2}},
     "seeds names tasks not in the grid: breast_cancer"),
    ({"tasks": ["digits", "adult"], "methods": ["dpsgd"], "epsilons": [1], "seeds": {"digits": 3}},
     'seeds gives no count for adult (and no "default")'),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": {"digits": 0}}, "seeds must be"),
    ({"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1], "seeds": {}}, "seeds must be"),
])
def test_bad_grids_are_refused(refused, tmp_path, grid, message):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    assert message in refused("sweep", str(path))


def test_plugins_reach_the_sweep_before_or_after_the_command(capsys, tmp_path):
    """Issue 35, item 5: ``--plugins`` was refused by ``dpbench sweep`` both before and after the command."""
    plugins = str(REPO / "examples" / "plugins")
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"tasks": ["digits"], "methods": ["dp_nesterov"], "epsilons": [1], "seeds": 1}))
    assert main(["--plugins", plugins, "sweep", str(path)]) == 0
    assert capsys.readouterr().out == "1 ran, 0 already stored, 0 refused\n"
    assert main(["sweep", str(path), "--plugins", plugins]) == 0
    assert capsys.readouterr().out == "0 ran, 1 already stored, 0 refused\n"
    [record] = store.load()
    assert record["method"] == "dp_nesterov" and record["code"]["method"]["external"]
    assert main(["leaderboard", "--plugins", plugins, "--format", "html", "--out", str(tmp_path / "board.html")]) == 0
    assert "DP-SGD with Nesterov momentum (example plugin)" in (tmp_path / "board.html").read_text()


def test_random_stopping_cells_run_one_study_per_seed_each_with_its_own_secret(capsys):
    """Issue 31: the board's studies no longer draw K from their (public) seed. A cell still runs one study per
    seed, named after its seed and settings, whose record has that seed; each study has its own secret and id; the
    board groups them into one cell, and a second sweep finds them stored."""
    import optuna

    from dpbench.board import model as board_model
    from dpbench.tuning.study import default_storage, study_secret

    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd"], "epsilons": [1.0], "seeds": 3,
            "tracks": ["random-stopping"], "trials": 2}
    assert run_grid(grid, progress=False) == {"ran": 3, "already stored": 0, "refused": 0}
    released = store.load()
    assert sorted(r["seed"] for r in released) == [0, 1, 2]
    assert all(f"-seed{r['seed']}-" in r["tuning"]["study"] for r in released)
    assert len({r["tuning"]["study_id"] for r in released}) == 3
    storage = optuna.storages.RDBStorage(default_storage())
    studies = [optuna.load_study(study_name=r["tuning"]["study"], storage=storage) for r in released]
    assert len({study_secret(study) for study in studies}) == 3
    [table] = board_model.build_tables(released)
    assert [cell.n_seeds for cell in table.cells.values()] == [3]
    assert run_grid(grid, progress=False) == {"ran": 0, "already stored": 3, "refused": 0}
    # A record of the tuning that drew K from the public seed (its config without "coins") is not a stored run of
    # this one: a sweep over an old store reruns the study instead of keeping a record whose K can be recomputed.

    old = json.loads(json.dumps(released[0]))
    del old["tuning"]["config"]["coins"]
    [cell] = sweep.cells(grid)
    assert sweep.identity(cell) == identity(released[0]) != identity(old)


def test_seeds_may_be_given_per_task(tmp_path):
    """``seeds`` as a mapping: a task's own count, else the default; every track and method of the task."""
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"tasks": ["digits", "breast_cancer", "adult"], "methods": ["nonprivate", "dpsgd"],
                                "epsilons": [1, 2], "seeds": {"default": 2, "breast_cancer": 4, "adult": 1},
                                "tracks": ["none", "validation"]}))
    grid = sweep.load_grid(str(path))
    found = {(cell.task, cell.track, cell.method, cell.epsilon): cell.seeds for cell in sweep.cells(grid)}
    assert len(found) == 3 * 2 * 3
    for (task, *_), seeds in found.items():
        assert seeds == tuple(range({"digits": 2, "breast_cancer": 4, "adult": 1}[task])), (task, seeds)
    assert {cell.seeds for cell in sweep.cells({**grid, "seeds": 3})} == {(0, 1, 2)}


def test_a_job_trains_every_epsilon_of_a_track_together_with_the_records_of_cell_by_cell(monkeypatch):
    """The tuned cells of one track, task and method are one job: the trials of both ε train as one batch (2 ε × 2
    configurations × 2 trial seeds), then their final runs; the records are those of the cells run one by one (the
    selections, accuracies and ε exactly). An untuned cell is a job of its own (a release method's: one per seed)."""
    from dpbench.run import multiseed

    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd", "amp"], "epsilons": [0.5, 2.0], "seeds": 2,
            "tracks": ["none", "validation"], "trials": 2, "neighbouring": "replace-one"}
    pending, _, _ = sweep.pending(grid)
    grouped = sweep.jobs(pending)
    assert [(job[0].track, job[0].method, [(cell.epsilon, cell.seeds) for cell in job]) for job in grouped] == [
        ("validation", "amp", [(0.5, (0, 1)), (2.0, (0, 1))]),
        *[("none", "amp", [(epsilon, (seed,))]) for epsilon in (0.5, 2.0) for seed in (0, 1)],
        ("validation", "dpsgd", [(0.5, (0, 1)), (2.0, (0, 1))]), ("none", "dpsgd", [(0.5, (0, 1))]),
        ("none", "dpsgd", [(2.0, (0, 1))])]
    batches, run_batch = [], multiseed.run_batch
    monkeypatch.setattr(multiseed, "run_batch", lambda specs: batches.append(len(specs)) or run_batch(specs))
    together = {(cell.track, cell.epsilon, record["seed"]): record
                for job in grouped[-3:] for cell, records, _ in sweep.run_job(job) for record in records}
    assert batches == [8, 4, 2, 2]
    alone = {(cell.track, cell.epsilon, record["seed"]): record
             for cell in pending if cell.method == "dpsgd" for _, records, _ in [sweep.run_cell(cell)]
             for record in records}
    assert batches[4:] == [4, 2, 4, 2, 2, 2]
    assert together.keys() == alone.keys() and len(alone) == 8
    for key, record in alone.items():  # the test loss to float rounding: the batches' sums run in other orders
        assert together[key]["metrics"] == pytest.approx(record["metrics"], rel=1e-6, abs=0), key
        for field in ("hyperparameters", "noise_multiplier", "epsilon", "tuning", "steps"):
            assert together[key].get(field) == record.get(field), (key, field)


def test_a_refusal_raised_while_a_job_trains_together_refuses_only_its_own_cell(monkeypatch):
    from dpbench.errors import UsageError
    from dpbench.run import multiseed

    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd"], "epsilons": [0.5, 2.0], "seeds": 1,
            "tracks": ["validation"], "trials": 2}
    [job] = sweep.jobs(sweep.pending(grid)[0])
    run_many = multiseed.run_many

    def refusing(specs, *args, **kwargs):
        if any(spec.epsilon == 0.5 for spec in specs):
            raise UsageError("planted refusal at ε = 0.5")
        return run_many(specs, *args, **kwargs)

    monkeypatch.setattr(multiseed, "run_many", refusing)
    [(low, low_records, low_refusal), (high, high_records, high_refusal)] = sweep.run_job(job)
    assert (low.epsilon, low_records, low_refusal) == (0.5, [], "planted refusal at ε = 0.5")
    assert (high.epsilon, high_refusal, [r["epsilon_target"] for r in high_records]) == (2.0, None, [2.0])


def test_the_untuned_records_of_a_sweep_over_several_epsilons_rerun_exactly(tmp_path, capsys):
    """``dpbench verify --rerun`` trains a batched record again with the seeds of its own cell: a job that batched
    the seeds of every ε together made every such record refused as "trained in a batch of 4 seeds, of which the
    file holds 2" (found by review)."""
    grid = {"tasks": ["digits"], "methods": ["dpsgd"], "epsilons": [1.0, 8.0], "seeds": 2,
            "neighbouring": "replace-one"}
    assert run_grid(grid, progress=False) == {"ran": 4, "already stored": 0, "refused": 0}
    assert {r["batched_seeds"] for r in store.load()} == {2}
    out = tmp_path / "records.jsonl"
    assert main(["leaderboard", "--format", "jsonl", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--rerun", "4"]) == 0, capsys.readouterr().out


def test_a_job_that_raises_fails_its_cells_alone_and_the_sweep_exits_non_zero(monkeypatch, tmp_path, capsys):
    """An error no refusal explains (a bug, a guard) ended the whole sweep, losing every cell still running; now the
    failed job's cells are reported with their traceback, nothing of them is stored, the other cells run, the sweep
    exits 1, and a second sweep retries only the failed cells."""
    grid = {"tasks": ["breast_cancer"], "methods": ["dpsgd", "dpgd"], "epsilons": [1.0], "seeds": 2,
            "tracks": ["none"]}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    run_job = sweep.run_job

    def failing(job):
        if job[0].method == "dpgd":
            raise RuntimeError("planted failure")
        return run_job(job)

    monkeypatch.setattr(sweep, "run_job", failing)
    assert main(["sweep", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.strip() == "2 ran, 0 already stored, 0 refused, 2 failed"
    assert "sweep: none breast_cancer dpgd eps=1 failed, nothing stored for it:\nTraceback" in err
    assert "RuntimeError: planted failure" in err and "run the sweep again to retry them" in err
    assert sorted({r["method"] for r in store.load()}) == ["dpsgd"]
    monkeypatch.setattr(sweep, "run_job", run_job)
    assert main(["sweep", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "2 ran, 2 already stored, 0 refused"
