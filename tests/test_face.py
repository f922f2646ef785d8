"""The package's face: `from queue_worker import …` for the names a user needs, one root error
over the package's errors, and a face that loads nothing a module does not need."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import queue_worker
from logstore import LogError
from queue_worker import Queue, QwError, TaskContext, time_limit


def test_the_face_names_are_the_real_things() -> None:
    from queue_worker.partitions.jobs import Queue as JobsQueue
    from queue_worker.producer import Queue as ProducerQueue
    from queue_worker.worker.handlers import TaskContext as HandlersContext
    from queue_worker.worker.handlers import time_limit as handlers_time_limit

    assert Queue is JobsQueue and issubclass(Queue, ProducerQueue)  # (partitions: jobs.py)
    assert TaskContext is HandlersContext
    assert time_limit is handlers_time_limit
    for name in queue_worker.__all__:
        assert getattr(queue_worker, name) is not None, name
        assert name in dir(queue_worker)


def test_every_package_error_is_a_qw_error_and_keeps_its_other_base() -> None:
    errors = [
        getattr(queue_worker, name)
        for name in queue_worker.__all__
        if isinstance(getattr(queue_worker, name), type)
        and issubclass(getattr(queue_worker, name), BaseException)
    ]
    assert {e.__name__ for e in errors} == {
        "QwError",
        "RecordDecodeError",
        "TaskIdRangeError",
        "RecordEncodeError",
        "CheckpointError",
        "CheckpointRefused",
        "SettleError",
        "TaskCancelled",
        "TaskFailed",
        "ResultRemovedError",
        "HandlerLoadError",
        "ReportInputError",
    }
    for error in errors:
        assert issubclass(error, QwError), error
    # callers that catch ValueError or LogError still catch these
    assert issubclass(queue_worker.RecordDecodeError, ValueError)
    assert issubclass(queue_worker.RecordEncodeError, ValueError)
    assert issubclass(queue_worker.SettleError, LogError)
    assert issubclass(queue_worker.HandlerLoadError, ValueError)
    with pytest.raises(QwError, match="not a record"):
        raise queue_worker.RecordDecodeError("not a record")


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Worker'"):
        queue_worker.Worker  # noqa: B018  (the worker is not on the face)
    from queue_worker.worker import loop as worker  # a submodule is still imported by name

    assert worker.Worker.__name__ == "Worker"


def test_importing_the_fold_loads_neither_the_worker_nor_the_producer() -> None:
    probe = (
        "import json, sys, queue_worker.protocol.state; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('queue_worker'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = set(json.loads(out))
    assert "queue_worker.protocol.state" in loaded
    assert not loaded & {
        "queue_worker.worker.loop",
        "queue_worker.producer",
        "queue_worker.worker.handlers",
    }


def test_no_submodule_shadows_a_name_of_the_face() -> None:
    # Importing a submodule sets it as an attribute of the package: a module named like a
    # face name (queue_worker/time_limit.py once did) replaces that name for everyone.
    import importlib
    import pkgutil
    import types

    for module in pkgutil.iter_modules(queue_worker.__path__):
        importlib.import_module(f"queue_worker.{module.name}")
    for name in queue_worker.__all__:
        assert not isinstance(getattr(queue_worker, name), types.ModuleType), name
