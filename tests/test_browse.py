"""``dpbench runs`` and ``dpbench show``: what a run's summary points to can be found again."""
import json

from dpbench.cli import main
from dpbench.results import store


def test_a_run_says_where_it_went_and_show_prints_that_record(capsys):
    assert main(["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--epochs", "2",
                 "--no-wandb"]) == 0
    summary = capsys.readouterr().out
    run_id = summary.rsplit("  run ", 1)[1].split()[0]
    assert f"stored in {store.default_path()}" in summary
    assert main(["show", run_id[:8]]) == 0
    assert json.loads(capsys.readouterr().out) == store.load()[0]
    assert main(["runs", "--method", "dpsgd"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and table[1].startswith(run_id) and "dpsgd" in table[1] and "none" in table[1]


def test_unknown_runs_are_one_line_refusals(capsys):
    assert main(["show", "feedface"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["runs", "--task", "adult"]) == 2
    assert "no runs matching task=adult" in capsys.readouterr().err
