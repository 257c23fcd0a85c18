"""Fuzzed input (Hypothesis): every malformed command line, grid file, search-space file, plugin file, ``--set``
value, stored record or records file ends in exactly one line on stderr starting ``dpbench: error:`` (what the
loggers and warnings would print counted too), exit code 2, and nothing written (results store, study storage and
the files the command names unchanged); nothing ends in a traceback or another exit code (but 1 for ``verify`` and
``leaderboard --check``, which exit 1 when they find problems in the records they are given).

The CLI runs in this process (``dpbench.cli.main``). Validation is the real code; what comes after it is replaced,
so that each case takes milliseconds: training (Lightning's ``Trainer.fit``, the output/objective perturbation
solvers, a sweep once its cells are planned, a tuning study) raises :class:`Trained`, which counts as exit 0, and the engine's
accountant (calibration and ε of a run) returns a constant. The accountant itself is fuzzed through
``dpbench privacy``, which runs it for real. Tasks are the bundled ones (no download). Every test runs at least
200 generated inputs under a fixed profile (derandomized, no deadline): the same inputs on every CI run, after the
explicit examples, which are the bugs found while writing these tests. ``DPBENCH_FUZZ_EXAMPLES=N`` runs N per test
instead, e.g. to search further before a release (0: the explicit examples only).
"""
import contextlib
import io
import json
import logging
import os
import sqlite3
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from dpbench import choices, registry
from dpbench.board import sweep
from dpbench.cli import main
from dpbench.release import runner
from dpbench.results import store, tracking
from dpbench.results.records import LEDGER_VERSION
from dpbench.run import planning
from dpbench.spec import ENGINE_DEFAULTS
from dpbench.tuning import plan as tuning_plan, tune

EXAMPLES = int(os.environ.get("DPBENCH_FUZZ_EXAMPLES", "200"))  # 0: only the explicit examples (the bugs found)
FUZZ = settings(max_examples=max(EXAMPLES, 1), derandomize=True, deadline=None, database=None, print_blob=True,
                phases=[Phase.explicit] if EXAMPLES == 0 else list(Phase),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

METHODS = sorted(registry.methods())
TASKS = ["digits", "breast_cancer", "adaclip_regression"]  # bundled or generated: no download
GRID = {"tasks": ["digits"], "methods": ["dpsgd", "nonprivate"], "epsilons": [1], "seeds": 2}
WANDB_RECORDS: list = []  # what the replaced W&B reader returns


class Trained(BaseException):
    """Raised where the replaced work would start: the input passed validation."""


def _trained(*args, **kwargs):
    raise Trained


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A folder for the paths the generated commands name (an empty folder, a file, a grid...), with training and
    the engine's accountant replaced (module docstring)."""
    monkeypatch.setattr(pl.Trainer, "fit", _trained)
    monkeypatch.setattr(runner, "output_perturbation", _trained)
    monkeypatch.setattr(runner, "approximate_minima_perturbation", _trained)
    pending = sweep.pending  # the grid's cells checked and planned (stored records read), then no cell runs

    def planned_then_trained(grid):
        pending(grid)
        raise Trained

    monkeypatch.setattr(sweep, "pending", planned_then_trained)
    monkeypatch.setattr(tune, "open_study", _trained)
    monkeypatch.setattr(tuning_plan, "calibrate_trial_noise", lambda *args: 1.0)
    monkeypatch.setattr(tuning_plan, "score_noise_multiplier", lambda trial: 1.0)
    monkeypatch.setattr(planning, "calibrate_noise_multiplier", lambda *args: 1.0)
    monkeypatch.setattr(planning.GaussianReleases, "epsilon", lambda self, delta, accountant="pld": 1.0)
    monkeypatch.setattr(tracking, "records_from_wandb", lambda path: WANDB_RECORDS)  # no network
    folder = tmp_path / "sandbox"
    (folder / "empty").mkdir(parents=True)
    (folder / "file").write_text("not a folder\n")
    monkeypatch.chdir(folder)
    return folder


def _state(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``roots`` with its size and modification time; data caches excepted."""
    found = {}
    for root in roots:
        if root.exists():
            for path in root.rglob("*"):
                if path.is_file() and "cache" not in path.relative_to(root).parts[:1]:
                    stat = path.stat()
                    found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


class _Logged(logging.Handler):
    """What the loggers would have printed (pytest captures logging and warnings, a terminal shows them)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += self.format(record).splitlines()


def _printing_loggers() -> list[logging.Logger]:
    """The root logger and the libraries' loggers that print on their own handler instead of passing records up."""
    names = ("pytorch_lightning", "lightning.pytorch", "optuna")
    return [logging.getLogger(), *(logging.getLogger(name) for name in names if not logging.getLogger(name).propagate)]


def check(argv: list[str], sandbox: Path, exits: tuple[int, ...] = (0, 2)) -> int:
    """Run ``dpbench ARGV``; assert the property (module docstring); return the exit code. ``exits``: the codes
    allowed (``verify`` and ``leaderboard --check`` exit 1 when they find problems: their answer, not an error)."""
    home = Path(os.environ["DPBENCH_HOME"])
    before = _state(home, sandbox)
    out, err, logged, loggers = io.StringIO(), io.StringIO(), _Logged(), _printing_loggers()
    for logger in loggers:
        logger.addHandler(logged)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            try:
                code = main(argv)
            except SystemExit as exit_:  # --help
                code = exit_.code
            except Trained:
                code = 0
    finally:
        for logger in loggers:
            logger.removeHandler(logged)
    error = err.getvalue()
    assert "Traceback" not in error, error
    assert code in exits, (code, error)
    if code == 2:
        lines = [*logged.lines, *(str(warning.message) for warning in warned), *error.strip().splitlines()]
        assert len(lines) == 1 and lines[0].startswith("dpbench: error: "), lines
        assert _state(home, sandbox) == before, "a refused command wrote files"
    event("accepted" if code == 0 else "refused: " + " ".join(error.split()[2:5]))  # --hypothesis-show-statistics
    return code


# ---- values ------------------------------------------------------------------------------------------------------

#: Text a shell can pass (no NUL byte), any script.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
SPECIAL_NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", "0", "-0", "-1", "1e308", "1e309", "-1e308", "1e-320",
                   "5e-324", "1e-300", "0x10", "1_000", " 1", "1e", "", "٣", "½", "1.5", "9" * 40, "-" + "9" * 40,
                   "1e30", "true", "None", "0.0001", "2147483648", "9223372036854775808"]
BAD = st.one_of(st.sampled_from(SPECIAL_NUMBERS), st.integers(-10**30, 10**30).map(str),
                st.floats(allow_nan=True, allow_infinity=True).map(repr), TEXT)


def mostly(*good: str, bad: st.SearchStrategy = BAD) -> st.SearchStrategy[str]:
    """One of ``good`` nine times in ten, else anything from ``bad``: most inputs get past the first checks."""
    return st.sampled_from([*good * (9 // len(good) + 1), None]).flatmap(
        lambda value: bad if value is None else st.just(value))


PATH = st.one_of(st.sampled_from(["empty", "file", "missing", "missing/deeper", "file/child", ".", "", "ü ß/名",
                                  "empty/new"]), TEXT)
JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                        st.floats(allow_nan=True, allow_infinity=True), TEXT)
JSON = st.recursive(JSON_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
BARE = st.none()  # a flag without a value
JUNK = st.one_of(*[st.just([])] * 6, st.lists(st.one_of(TEXT, st.sampled_from(
    ["--", "-h", "--unknown", "-x", "--epsilon=1", "--set", "--method"])), min_size=1, max_size=2))


def options(table: dict[str, st.SearchStrategy]) -> st.SearchStrategy[list[str]]:
    """A few of ``table``'s options (flag → strategy of its value, :data:`BARE` for a flag without one) in random
    order, now and then with stray words."""
    def pairs(names: list[str]):
        return st.tuples(*[table[name].map(lambda value, name=name: [name] if value is None else [name, value])
                           for name in names])

    chosen = st.lists(st.sampled_from(list(table)), max_size=4).flatmap(pairs)
    return st.tuples(chosen, JUNK, st.randoms(use_true_random=False)).map(
        lambda parts: _shuffled([*parts[0], *([word] for word in parts[1])], parts[2]))


def _shuffled(groups: list[list[str]], rng) -> list[str]:
    rng.shuffle(groups)
    return [word for group in groups for word in group]


def name_of(known: list[str]) -> st.SearchStrategy[str]:
    return mostly(*known, bad=TEXT)


#: Plausible values of the hyperparameters and task options by name, else by the type of their default.
CHOICES = {"variant": ("paper", "code", "convex", "strongly_convex"), "optimizer": ("sgd", "adam"),
           "network": ("relu256", "adadp", "adaclip"), "dim": ("1", "3", "20"), "init_scale": ("0", "1")}


def _plausible(key: str, default) -> tuple[str, ...]:
    if key in CHOICES:
        return CHOICES[key]
    if isinstance(default, bool):
        return ("true", "false", "1", "0")
    if isinstance(default, int):
        return ("1", "2", "3")
    if isinstance(default, float):
        return ("0.5", "0.9", "1e-3", "2")
    return ("0.5", "1", "2")


def set_value(method: str, task: str) -> st.SearchStrategy[str]:
    """``--set`` arguments: mostly a key of ``method`` on ``task`` with a plausible value."""
    methods, tasks = registry.methods(), registry.tasks()
    defaults = {**ENGINE_DEFAULTS, **(methods[method].defaults if method in methods else {}),
                **(tasks[task].options if task in tasks else {})}
    entries = [st.sampled_from(_plausible(key, default)).map(lambda value, key=key: f"{key}={value}")
               for key, default in defaults.items()]
    anything = st.tuples(st.one_of(st.sampled_from(sorted(defaults)), TEXT), BAD).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.one_of(*entries, anything, anything, TEXT)


# ---- the command line --------------------------------------------------------------------------------------------

RUN = ["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--no-wandb"]  # valid: a prefix for examples
TUNE = ["tune", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--no-wandb"]

def run_options(method: str, task: str) -> dict[str, st.SearchStrategy]:
    return {
        "--epsilon": mostly("0.5", "1", "2", "8"), "--noise-multiplier": mostly("0.8", "1", "2"),
        "--delta": mostly("1e-5", "1e-7", "1e-3"), "--force-delta": BARE, "--seed": mostly("0", "1", "7"),
        "--epochs": mostly("1", "2", "3"), "--batch-size": mostly("8", "16", "64"), "--lr": mostly("0.01", "1"),
        "--clip": mostly("0.5", "1", "4"), "--profile": mostly("smoke", "paper", bad=TEXT),
        "--set": set_value(method, task), "--sampler": mostly("poisson", "shuffle", bad=TEXT),
        "--accountant": mostly("pld", "rdp", bad=TEXT), "--neighbouring": mostly("add-remove", "replace-one", bad=TEXT),
        "--accelerator": mostly("cpu", "auto", bad=TEXT), "--clipping": mostly("fast", "reference", bad=TEXT),
        "--noise": mostly("fast", "torch", bad=TEXT), "--checkpoint-dir": PATH, "--resume": PATH,
        "--checkpoint-every": mostly("1", "10"), "--plugins": PATH, "--json": BARE, "--wandb-project": TEXT,
        "--wandb-entity": TEXT,
    }


@st.composite
def run_command(draw, set_only: bool = False) -> list[str]:
    method, task = draw(name_of(METHODS)), draw(name_of(TASKS))
    table = run_options(method, task)
    if set_only:  # --set values with the budget a private method needs
        table = {"--set": table["--set"]}
        rest = [*draw(options(table)), *([] if method == "nonprivate" else ["--epsilon", "1"])]
    else:
        rest = draw(options(table))
    return ["run", "--method", method, "--task", task, *rest, "--no-wandb"]


@FUZZ
# Found while writing these tests; each example failed the property before its fix:
@example(argv=[*RUN, "--bogus"])  # argparse's usage text, then "dpbench run: error: ..."
@example(argv=[*RUN, "x\ny"])  # a line break in the user's words
@example(argv=[*RUN, "--accelerator", ""])  # Lightning's ValueError
@example(argv=[*RUN, "--accelerator", "cuda"])  # Lightning's MisconfigurationException
@example(argv=["run", "--method", "dpsgd", "--task", "adaclip_regression", "--epsilon", "1", "--set",
               "dim=99999999999"])  # torch's RuntimeError: cannot allocate 400 TB
@given(argv=run_command())
def test_run_command_lines(sandbox, argv):
    check(argv, sandbox)


@FUZZ
@example(argv=["run", "--method", "dpsgd", "--task", "adaclip_regression", "--epsilon", "1", "--set",
               "dim=9999999999999999999999999"])  # torch's TypeError: overflow
@given(argv=run_command(set_only=True))
def test_set_values(sandbox, argv):
    check(argv, sandbox)


@st.composite
def tune_command(draw) -> list[str]:
    method, task = draw(name_of(METHODS)), draw(name_of(TASKS))
    table = {
        "--delta": mostly("1e-5", "1e-7"), "--mode": mostly(*choices.TUNING_MODES, bad=TEXT), "--trials": mostly("1", "2", "3.5"),
        "--k-distribution": mostly(*choices.K_DISTRIBUTIONS, bad=TEXT), "--eta": mostly("0", "1"),
        "--search": mostly(*choices.SEARCH_SAMPLERS, bad=TEXT), "--search-space": PATH,
        "--validation-fraction": mostly("0.1", "0.5"), "--seed": mostly("0", "3"), "--epochs": mostly("1", "2"),
        "--batch-size": mostly("16", "64"), "--set": set_value(method, task),
        "--storage": mostly("sqlite:///study.db", "sqlite:///missing/x/study.db", "sqlite:///file/x.db",
                            "sqlite:///empty", "postgresql://x", "notaurl", "sqlite://", bad=TEXT),
        "--study": TEXT, "--heartbeat-interval": mostly("1", "10"), "--plugins": PATH, "--json": BARE,
    }
    return ["tune", "--method", method, "--task", task, "--epsilon", draw(mostly("0.5", "1", "8")),
            *draw(options(table)), "--no-wandb"]


@FUZZ
@example(argv=[*TUNE, "--storage", "sqlite:///file/x.db"])  # FileExistsError making its folder
@example(argv=[*TUNE, "--trials", "nan", "--mode", "adaptive"])  # int(nan): ValueError
@given(argv=tune_command())
def test_tune_command_lines(sandbox, argv):
    check(argv, sandbox)


PRIVACY_OPTIONS = {
    "--sample-rate": mostly("0.01", "0.1", "1"), "--noise-multiplier": mostly("0.8", "1", "3", "1e300", "1e-300"),
    "--epsilon": mostly("0.5", "1", "8", "1e300", "1e-300"), "--steps": mostly("1", "5", "20"),
    "--delta": mostly("1e-5", "0.01", "1e-300"), "--accountant": mostly("pld", "rdp", bad=TEXT),
    "--neighbouring": mostly("add-remove", "replace-one", bad=TEXT), "--json": BARE,
}


@FUZZ
@example(rest=["--sample-rate", "0.5", "--noise-multiplier", "1e300", "--steps", "1", "--delta", "0.1"])  # Overflow
@example(rest=["--sample-rate", "1e-300", "--noise-multiplier", "1e-300", "--steps", "1", "--delta", "0.1"])
@example(rest=["--sample-rate", "0.5", "--noise-multiplier", "1", "--steps", "99999999999999", "--delta", "0.1"])
@given(rest=options(PRIVACY_OPTIONS))
def test_privacy_command_lines(sandbox, rest):
    check(["privacy", *rest], sandbox)


@FUZZ
@given(rest=options({"--task": name_of(TASKS), "--format": mostly("md", "csv", "html", "jsonl", bad=TEXT),
                     "--out": PATH, "--from-wandb": TEXT}))
def test_leaderboard_command_lines(sandbox, rest):
    check(["leaderboard", *rest], sandbox)


@FUZZ
@given(what=mostly("methods", "tasks", bad=TEXT), rest=options({"--plugins": PATH}))
def test_list_command_lines(sandbox, what, rest):
    check(["list", what, *rest], sandbox)


@FUZZ
@given(argv=st.lists(st.one_of(TEXT, st.sampled_from(["run", "tune", "list", "privacy", "sweep", "leaderboard",
                                                       "--method", "--task", "--epsilon", "-h", "--help", "methods"])),
                     max_size=6))
def test_any_words(sandbox, argv):
    check(argv, sandbox)


# ---- files -------------------------------------------------------------------------------------------------------

PLUGIN_PARTS = [
    "from dpbench.method import Method\n\nclass FuzzMethod(Method):\n    name = {name}\n    description = 'x'\n",
    "from dpbench.task import Task\n\nclass FuzzTask(Task):\n    name = {name}\n    description = 'x'\n",
    "raise {error}('at import')\n", "import dpbench_no_such_module\n", "def broken(:\n", "x = 1 / 0\n",
    "y = undefined_name\n",
]


@st.composite
def plugin_file(draw) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(PLUGIN_PARTS), TEXT.map(lambda text: text + "\n")),
                          min_size=1, max_size=2))
    name = draw(st.one_of(st.sampled_from(["'fuzz_plugin'", "'dpsgd'", "'digits'", "''", "3", "None", "['x']"]),
                          TEXT.map(repr)))
    error = draw(st.sampled_from(["ValueError", "RuntimeError", "KeyError", "ImportError", "TypeError"]))
    return "".join(part.replace("{name}", name).replace("{error}", error) for part in parts)


@FUZZ
@example(source="def broken(:\n", command=["list", "methods"])  # SyntaxError
@example(source=PLUGIN_PARTS[0].replace("{name}", "3"), command=["list", "methods"])  # sorted(): int < str
@given(source=plugin_file(), command=st.sampled_from([
    ["list", "methods"], ["list", "tasks"],
    ["run", "--method", "dpsgd", "--task", "digits", "--epsilon", "1", "--no-wandb"],
    ["run", "--method", "fuzz_plugin", "--task", "digits", "--epsilon", "1", "--no-wandb"]]))
def test_plugin_files(sandbox, source, command):
    """A plugin folder (``--plugins``) holding a file that does not import, or whose classes have no valid name."""
    folder = sandbox / "plugins"
    folder.mkdir(exist_ok=True)
    (folder / "fuzzed.py").write_text(source, encoding="utf-8")
    check([*command, "--plugins", str(folder)], sandbox)


@st.composite
def mutated(draw, valid: dict, extra_keys: tuple[str, ...] = ()) -> dict:
    """``valid`` with a few of its keys (or ``extra_keys``) removed or set to any JSON value."""
    result = dict(valid)
    for key in draw(st.lists(st.sampled_from([*valid, *extra_keys]), max_size=3)):
        if draw(st.booleans()):
            result.pop(key, None)
        else:
            result[key] = draw(JSON)
    return result


@st.composite
def grid(draw):
    """A grid near the format (``dpbench.board.sweep.load_grid``; the keys the lead adds, tracks, trials and
    neighbouring, included), or any JSON."""
    valid = {"tasks": draw(st.lists(name_of(TASKS), max_size=2)), "methods": draw(st.lists(name_of(METHODS),
                                                                                               max_size=2)),
             "epsilons": draw(st.lists(st.sampled_from([1, 0.5, 8]), max_size=2)), "seeds": draw(st.integers(1, 2))}
    return draw(st.one_of(*[mutated(valid, ("tracks", "trials", "neighbouring"))] * 4, JSON))


def grid_text() -> st.SearchStrategy[str]:
    return st.one_of(grid().map(json.dumps), TEXT, st.sampled_from(["", "{", "[]", "null", "{\"tasks\": }"]))


@FUZZ
@example(text="null", workers=None)  # TypeError
@example(text=json.dumps({**GRID, "seeds": "2"}), workers=None)  # range("2"): TypeError
@example(text=json.dumps({**GRID, "seeds": 10**20}), workers=None)  # would plan 10^20 runs
@example(text=json.dumps({**GRID, "epsilons": ["1"]}), workers=None)  # math.isfinite("1"): TypeError
@given(text=grid_text(), workers=st.one_of(st.none(), mostly("1", "2")))
def test_sweep_grid_files(sandbox, text, workers):
    path = sandbox / "grid.json"
    path.write_text(text, encoding="utf-8")
    check(["sweep", str(path), *([] if workers is None else ["--workers", workers])], sandbox)


@FUZZ
@given(path=PATH, rest=st.lists(TEXT, max_size=2))
def test_sweep_command_lines(sandbox, path, rest):
    check(["sweep", path, *rest], sandbox)


@st.composite
def search_space(draw):
    """A search space near the format (``dpbench.tuning.search.load_search_space``), or any JSON."""
    entries = {"lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
               "clip": {"type": "float", "low": 0.1, "high": 10.0},
               "momentum": {"type": "categorical", "choices": [0.0, 0.9]},
               "epochs": {"type": "int", "low": 1, "high": 3}, "tol": {"type": "float", "low": 0.5, "high": 2.0},
               "h2": {"type": "float", "low": 1e-6, "high": 1.0, "log": True}}
    names = draw(st.lists(st.one_of(*[st.sampled_from(sorted(entries))] * 3, TEXT), min_size=1, max_size=3,
                          unique=True))
    space = {name: draw(st.one_of(*[mutated(entries.get(name, entries["lr"]), ("step", "choices", "type"))] * 3,
                                  JSON)) for name in names}
    return draw(st.one_of(*[st.just(space)] * 4, JSON))


@FUZZ
@given(method=st.sampled_from(["dpsgd", "ada_dp", "adaclip", "nonprivate"]),
       text=st.one_of(search_space().map(json.dumps), TEXT), mode=st.sampled_from(choices.TUNING_MODES))
def test_search_space_files(sandbox, method, text, mode):
    path = sandbox / "space.json"
    path.write_text(text, encoding="utf-8")
    check(["tune", "--method", method, "--task", "digits", "--epsilon", "1", "--mode", mode, "--trials", "2",
           "--search-space", str(path), "--no-wandb"], sandbox)


# ---- stored records ----------------------------------------------------------------------------------------------

def valid_record(seed: int = 0) -> dict:
    """A record shaped like the engine's (as in tests/test_leaderboard.py)."""
    return {
        "task": "digits", "method": "dpsgd", "data_id": "digits", "data_note": None, "n_train": 1000, "n_test": 200,
        "seed": seed, "hyperparameters": {"lr": 1.0, "epochs": 3}, "overrides": {}, "private": True,
        "epsilon": 0.99, "epsilon_target": 1.0, "delta": 1e-6, "noise_multiplier": 1.1, "sample_rate": 0.1,
        "steps": 30, "gradient_evaluations": 30, "accountant": "pld", "sampler": "poisson", "train_seconds": 1.0,
        "metrics": {"test_accuracy": 0.8, "test_loss": 0.5}, "versions": {}, "git_commit": "abc",
        "created_at": "2025-01-01T00:00:00+00:00", "neighbouring": "add-remove", "ledger_version": LEDGER_VERSION,
        "profile": None, "code": {"method": {"name": "dpsgd", "file": "methods/dpsgd.py", "external": False,
                                              "sha256": "0"}, "task": {"name": "digits"}}, "run_id": f"run{seed}",
    }


RECORD_KEYS = sorted(valid_record()) + ["tuning", "privacy_ledger", "validation"]


@st.composite
def stored_record(draw) -> dict:
    """A valid record with some fields removed or replaced by any JSON value."""
    record = valid_record(draw(st.integers(0, 3)))
    for key in draw(st.lists(st.sampled_from(RECORD_KEYS), max_size=3)):
        if draw(st.booleans()):
            record.pop(key, None)
        else:
            record[key] = draw(st.one_of(JSON, st.fixed_dictionaries({"mode": JSON}, optional={"trials": JSON})))
    return record


def _store_raw(records: list[dict]) -> None:
    """Put records in the store as they are (the indexed columns get their JSON text where not a string)."""
    path = store.default_path()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(store.SQLITE_SCHEMA)
        for number, record in enumerate(records):
            columns = [record.get(key, f"fuzz{number}" if key == "run_id" else None)
                       for key in ("run_id", "task", "method", "data_id", "created_at")]
            connection.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                               [*(c if isinstance(c, str) else json.dumps(c) for c in columns),
                                json.dumps(record, sort_keys=True)])
    connection.close()


@FUZZ
@example(records=[{**valid_record(), "metrics": {"test_accuracy": [0.5]}}], command=["leaderboard"])  # TypeError
@example(records=[{**valid_record(), "ledger_version": 1}], command=["leaderboard"])  # a note, then the refusal
@example(records=[valid_record()], command=["leaderboard", "--out", "empty"])  # IsADirectoryError
@example(records=[{**valid_record(), "seed": [0]}], command=["sweep", "grid.json"])  # unhashable list
@given(records=st.lists(stored_record(), min_size=1, max_size=4),
       command=st.sampled_from([["leaderboard"], ["leaderboard", "--format", "csv"],
                                ["leaderboard", "--format", "html"], ["leaderboard", "--format", "jsonl"],
                                ["leaderboard", "--task", "digits"], ["leaderboard", "--out", "board.md"],
                                ["leaderboard", "--out", "empty"], ["leaderboard", "--out", "file/child"],
                                ["leaderboard", "--from-wandb", "entity/project"], ["sweep", "grid.json"]]))
def test_stored_records(sandbox, records, command):
    """The paths that read records: the leaderboard (from the store or W&B) and the sweep (which skips runs
    already stored)."""
    (sandbox / "board.md").unlink(missing_ok=True)
    (sandbox / "grid.json").write_text(json.dumps(GRID))
    _store_raw(records)
    WANDB_RECORDS[:] = records
    check(command, sandbox)


def _records_text(draw_records: list, junk: list[str]) -> str:
    return "".join(json.dumps(r) + "\n" for r in draw_records) + "".join(line + "\n" for line in junk)


RECORDS_FILE = st.tuples(st.lists(st.one_of(*[stored_record()] * 4, JSON), max_size=3),
                         st.lists(st.one_of(TEXT, st.sampled_from(["{", "[]", "null", "{\"run_id\": 1}"])),
                                  max_size=1)).map(lambda parts: _records_text(*parts))


@FUZZ
@given(text=st.one_of(*[RECORDS_FILE] * 4, TEXT), command=st.sampled_from([
    ["leaderboard", "--records", "records.jsonl"], ["leaderboard", "--records", "records.jsonl", "--format", "csv"],
    ["leaderboard", "--records", "records.jsonl", "--check"], ["verify", "records.jsonl"]]))
def test_record_files(sandbox, text, command):
    """Records files (``leaderboard --records``, ``verify``): a record with fields removed or replaced by any JSON,
    a line that is not a record, text that is not JSON lines. ``verify`` recomputes ε with dp-accounting."""
    (sandbox / "records.jsonl").write_text(text, encoding="utf-8")
    check(command, sandbox, exits=(0, 1, 2))


AUDIT_OPTIONS = {
    "--method": name_of(METHODS), "--task": name_of(TASKS), "--epsilon": mostly("0.5", "1", "8"),
    "--delta": mostly("1e-5", "1e-6"), "--seed": mostly("0", "1"), "--canaries": mostly("10", "100", "1000"),
    "--threat-model": mostly("white-box", "black-box", bad=TEXT), "--epochs": mostly("1", "2"),
    "--batch-size": mostly("16", "64"), "--lr": mostly("0.1", "1"), "--set": mostly("lr=0.5", "clip=1"),
    "--plugins": PATH, "--json": BARE,
}


@FUZZ
@given(rest=options(AUDIT_OPTIONS), method=name_of(["dpsgd", "nonprivate", "dpadam_bc"]))
def test_audit_command_lines(sandbox, rest, method):
    check(["audit", "--method", method, "--task", "digits", *rest], sandbox)


@FUZZ
@given(path=PATH, rest=options({
    "--rerun": mostly("0", bad=st.sampled_from(["-1", "-" + "9" * 20, "x", "1.5", "", "nan"])),
    "--seed": mostly("0", "1")}))
def test_verify_command_lines(sandbox, path, rest):
    """``verify`` with any path and options (reruns are not drawn: they would train)."""
    (sandbox / "empty" / "records.jsonl").write_text(json.dumps(valid_record()) + "\n", encoding="utf-8")
    check(["verify", path, *rest], sandbox, exits=(0, 1, 2))


def test_a_w_and_b_project_that_cannot_be_read_is_refused(monkeypatch, refused):
    """``--from-wandb`` without an API key raised wandb's own UsageError as a traceback."""
    import wandb

    def no_key(*args, **kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "Api", no_key)
    assert "cannot read the records of W&B project entity/project" in refused("leaderboard", "--from-wandb",
                                                                             "entity/project")


@pytest.mark.parametrize("argv, message", [
    ([*RUN, "--lr", "nan"], "lr must be a finite number"),  # trained on NaN
    ([*RUN, "--clip", "inf"], "clip must be a finite number"),  # trained with infinite noise
    ([*RUN, "--set", "momentum=nan"], "momentum must be a finite number"),
    ([*TUNE, "--trials", "1e9", "--mode", "oracle"], "--trials must lie in [1, 1000]"),  # enqueued 10^9 trials
    ([*TUNE, "--heartbeat-interval", "99999999999"], "heartbeat interval must lie in"),  # OverflowError in a thread
    (["sweep", "grid.json", "--workers", "100000"], "workers must lie in"),  # started 100,000 processes
    (["privacy", "--sample-rate", "0.01", "--noise-multiplier", "1", "--steps", "1000000000", "--delta", "1e-5"],
     "dpbench accounts at most 10,000,000"),  # the PLD accountant was killed at 24 GB
])
def test_input_that_was_accepted_and_misbehaved_is_refused(refused, tmp_path, monkeypatch, argv, message):
    """What the property cannot see (it ran, or hung, or failed later): refused now, with the real code."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.json").write_text(json.dumps(GRID))
    assert message in refused(*argv)
