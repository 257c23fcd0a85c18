"""A plain (non-editable) install carries every subpackage, the built-in methods and tasks, and the compiled noise
sampler."""
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_contains_builtin_methods_and_tasks(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("dpbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in (("methods", "dpbench/methods"), ("tasks", "dpbench/tasks")):
        files = {f"{package}/{path.name}" for path in (REPO / folder).glob("*.py")}
        assert files and files <= names, files - names
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "dpbench").rglob("*.py")}
    assert modules <= names, modules - names  # every subpackage is listed in pyproject.toml
    assert any(name.endswith("entry_points.txt") and "dist-info" in name for name in names)
    assert any(name.startswith("dpbench/privacy/_philox.") and name.endswith((".so", ".pyd")) for name in names)
