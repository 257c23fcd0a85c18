"""The step-time benchmark runs end to end and reports side-by-side ratios and peak memory; its allocator settings."""
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dpbench.allocator import keep_freed_memory

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
