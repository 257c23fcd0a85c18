"""Issue 34, item 4: one of the new methods written as an external plugin against the public contract only
(``examples/plugins/my_quantile_clip.py``: ``dpbench.method`` and nothing of ``methods/``), run as a user would through
``dpbench run``, ``sweep``, ``audit`` and ``leaderboard``."""
import json
from pathlib import Path

from dpbench.cli import main
from dpbench.results import store

PLUGINS = str(Path(__file__).resolve().parents[1] / "examples" / "plugins")


def _record(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_quantile_clipping_plugin_imports_the_public_contract_only():
    source = (Path(PLUGINS) / "my_quantile_clip.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import math", "import torch", "from dpbench.method import CountRelease, Method, apply_gradient"]


def test_the_plugin_is_the_builtin_quantile_clip_step_for_step(capsys):
    """The same releases, clip trajectory, count charges and ε as ``methods/quantile_clip.py`` (momentum 0)."""
    plugin = _record(capsys, "--plugins", PLUGINS, "--method", "my_quantile_clip", "--task", "digits", "--epsilon", "1",
                     "--lr", "0.1", "--epochs", "3")
    builtin = _record(capsys, "--method", "quantile_clip", "--task", "digits", "--epsilon", "1", "--lr", "0.1",
                      "--epochs", "3")
    assert plugin["code"]["method"]["external"] and not builtin["code"]["method"]["external"]
    for key in ("metrics", "clip_norms", "epsilon", "noise_multiplier", "combined_noise_multiplier", "extra_releases",
                "gradient_evaluations"):
        assert plugin[key] == builtin[key], key


def test_the_plugin_goes_through_sweep_audit_and_leaderboard(capsys, tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"tasks": ["digits"], "methods": ["my_quantile_clip"], "epsilons": [1], "seeds": 2}))
    assert main(["--plugins", PLUGINS, "sweep", str(grid)]) == 0
    assert capsys.readouterr().out == "2 ran, 0 already stored, 0 refused\n"
    assert main(["audit", "--plugins", PLUGINS, "--method", "my_quantile_clip", "--task", "digits", "--epsilon", "1",
                 "--canaries", "200", "--epochs", "3", "--json"]) == 0
    audited = json.loads(capsys.readouterr().out)
    assert audited["passed"] and audited["extra_releases"] and audited["epsilon_lower_bound"] <= audited["epsilon_claimed"]
    records = [r for r in store.load() if r["method"] == "my_quantile_clip"]
    assert len(records) == 2 and all(r["epsilon"] <= 1.0 for r in records)
    out = tmp_path / "board.md"
    assert main(["leaderboard", "--plugins", PLUGINS, "--out", str(out)]) == 0
    # the audit ran 3 epochs under replace-one, the sweep's runs the task's default: evidence for other settings only
    assert ("my_quantile_clip [external plugin, unverified: in-process plugin, audit passed at other "
            "settings]") in out.read_text()
