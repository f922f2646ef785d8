"""The Lua scripts are package data: every `.lua` file the code reads is in the `lua/`
folder of its package and matched by that package's `[tool.setuptools.package-data]` glob,
so that an install from a wheel or an sdist ships it (logstore.redis.scripts)."""

from __future__ import annotations

import fnmatch
import importlib
from importlib import resources
from pathlib import Path

import pytest

from logstore.redis import scripts

REPO = Path(__file__).resolve().parents[1]
#: every module that reads scripts (at import)
SCRIPT_MODULES = (
    "logstore.redis.log",
    "logstore.redis.trim",
    "logstore.redis.verdict_mode",
    "queue_worker.redis.server_verdicts",
    "queue_worker.redis.server_claim",
    "queue_worker.redis.task_options",
    "queue_worker.compaction.verdict_trim",
    "queue_worker.history.redis_checkpoint",
)


def read_files() -> set[tuple[str, str]]:
    for module in SCRIPT_MODULES:
        importlib.import_module(module)
    return set(scripts.READ)


def test_every_script_read_is_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11 on)
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs: dict[str, list[str]] = data["package-data"]
    read = read_files()
    assert {package for package, _ in read} == {"logstore.redis", "queue_worker.redis"}
    for package, name in sorted(read):
        path = f"{scripts.FOLDER}/{name}"
        assert resources.files(package).joinpath(scripts.FOLDER).joinpath(name).is_file()
        assert any(fnmatch.fnmatch(path, g) for g in globs.get(package, [])), (
            f"{package}/{path} is read by the code but no package-data glob of {package} "
            f"ships it: {globs.get(package)}"
        )


def test_every_script_file_is_read() -> None:
    """No file in a lua/ folder is left over from a script that went."""
    read = read_files()
    on_disk = {
        (package, path.name)
        for package in ("logstore.redis", "queue_worker.redis")
        for path in (REPO / package.replace(".", "/") / scripts.FOLDER).glob("*.lua")
    }
    assert on_disk == read


def test_a_missing_script_file_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        scripts.lua_file("logstore.redis", "no-such-script.lua")
