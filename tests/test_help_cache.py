"""`qw --help` from the build's cache (supervisor.help_cache) against typer's own output.

The cache is built here into tmp_path (QW_HELP_CACHE points `qw` at it); at every width
the `qw` script must print what supervisor.cli.main prints, byte for byte, without
importing typer; without a cache of the current sources it is typer's answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor import help_cache

#: the `qw` script's main; reports on stderr whether typer was imported
SCRIPT = (
    "import sys\n"
    "from supervisor.entry import main\n"
    "sys.argv = ['qw', '--help']\n"
    "code = main()\n"
    "sys.stdout.flush()\n"
    "print('typer' in sys.modules, file=sys.stderr)\n"
    "sys.exit(code)\n"
)
TYPER = "import sys\nfrom supervisor.cli import main\nsys.exit(main(['--help']))\n"


def _run(code: str, columns: int, cache: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "COLUMNS": str(columns), help_cache.CACHE_ENV: str(cache)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("help-cache")
    help_cache.build(str(where))
    return where


@pytest.mark.parametrize("columns", [30, 50, 52, 64, 79, 80, 81, 200])
def test_the_cached_help_is_typers_byte_for_byte(cache: Path, columns: int) -> None:
    fast = _run(SCRIPT, columns, cache)
    typer = _run(TYPER, columns, cache)
    assert fast.returncode == typer.returncode == 0
    assert fast.stdout == typer.stdout
    assert fast.stderr == b"False\n"  # typer never imported
    assert typer.stderr == b""


def test_without_a_cache_of_these_sources_typer_answers(tmp_path: Path) -> None:
    fast = _run(SCRIPT, 80, tmp_path)  # nothing built there
    typer = _run(TYPER, 80, tmp_path)
    assert fast.returncode == 0
    assert fast.stdout == typer.stdout
    assert fast.stderr == b"True\n"


def _copy_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the sources in tmp_path, which the key is then taken of."""
    for package in help_cache.PACKAGES:
        src = Path(help_cache.ROOT) / package
        for path in src.rglob("*.py"):
            if "_compiled" in path.parts or "__pycache__" in path.parts:
                continue
            target = tmp_path / package / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    monkeypatch.setattr(help_cache, "ROOT", str(tmp_path))


def test_the_key_changes_with_any_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy_sources(tmp_path, monkeypatch)  # one file then edited
    before = help_cache.source_key()
    assert before == help_cache.source_key()
    cli = tmp_path / "supervisor" / "cli.py"
    cli.write_text(cli.read_text() + "\n# an edit\n")
    assert help_cache.source_key() != before


def _later() -> int:
    """A clock late enough that the files just written are old enough to be stamped."""
    return time.time_ns() + help_cache.STAMP_MARGIN_NS + 1


def test_a_stamped_cache_gives_the_key_without_hashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _copy_sources(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    key = help_cache.source_key()
    (cache / key).mkdir(parents=True)  # (a build's directory of that key)
    assert help_cache.current_key(str(cache)) == key  # too young to stamp
    assert not (cache / key / help_cache.STAMP_FILE).exists()
    assert help_cache.current_key(str(cache), _later()) == key  # hashed, then stamped
    assert (cache / key / help_cache.STAMP_FILE).is_file()

    def no_hash(*_: object) -> str:
        raise AssertionError("hashed")

    monkeypatch.setattr(help_cache, "source_key", no_hash)
    assert help_cache.current_key(str(cache), _later()) == key


@pytest.mark.parametrize("change", ["same size, mtime set back", "a new file"])
def test_a_change_after_a_stamp_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    _copy_sources(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    key = help_cache.source_key()
    (cache / key).mkdir(parents=True)
    help_cache.current_key(str(cache), _later())
    assert (cache / key / help_cache.STAMP_FILE).is_file()
    cli = tmp_path / "supervisor" / "cli.py"
    if change == "a new file":
        (tmp_path / "supervisor" / "new.py").write_text("")
    else:  # a write changes the ctime, which cannot be set back
        before = cli.stat()
        text = cli.read_text()
        cli.write_text(text.replace('"""', "'''", 1).replace('"""', "'''", 1))
        os.utime(cli, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (cli.stat().st_size, cli.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    new = help_cache.current_key(str(cache), _later())
    assert new == help_cache.source_key() != key
