"""The privacy cache (:mod:`dpbench.privacy.cache`) never returns a value that other accounting code computed: a fix to
``privacy/accounting.py`` (then ``privacy.py``) once left a sweep's cache returning the ε the old code stored (issue 31, item 9)."""
from pathlib import Path

import pytest

from dpbench.privacy import cache


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPBENCH_HOME", str(tmp_path))
    cache._salt.cache_clear()
    yield
    cache._salt.cache_clear()


def test_a_stored_value_is_returned_for_the_same_code_and_arguments(fresh_cache):
    assert cache.memoized("epsilon", (1, 0.5), lambda: 1.0) == 1.0
    assert cache.memoized("epsilon", (1, 0.5), lambda: 2.0) == 1.0
    assert cache.memoized("epsilon", (1, 0.6), lambda: 3.0) == 3.0


@pytest.mark.parametrize("module", cache.COMPUTED_BY)
def test_a_change_to_the_accounting_code_misses_the_cache(fresh_cache, monkeypatch, module):
    assert cache.memoized("epsilon", (1, 0.5), lambda: 1.0) == 1.0
    read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read(self) + b"\n# fixed\n" if self.as_posix().endswith("/" + module)
                        else read(self))
    cache._salt.cache_clear()
    assert cache.memoized("epsilon", (1, 0.5), lambda: 2.0) == 2.0


def test_every_privacy_module_the_cached_code_computes_with_is_part_of_the_key():
    """``privacy/correlated.py`` (banded and tree events, sensitivities) was left out of the key: an edit there kept
    serving the old ε and σ (hostile review of 26 November 2026). Every ``dpbench.privacy`` module a listed module
    imports is listed, but the cache itself and the random streams (no ε or σ is computed from them)."""
    import ast

    package = Path(cache.__file__).parents[1]
    missing = set()
    for name in cache.COMPUTED_BY:
        for node in ast.walk(ast.parse((package / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "dpbench.privacy":
                imported = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpbench.privacy."):
                imported = {node.module.rsplit(".", 1)[1]}
            else:
                continue
            missing |= {f"privacy/{module}.py" for module in imported - {"cache", "streams"}} - set(cache.COMPUTED_BY)
    assert not missing
