"""The parsers of the small commands' options, each a named object.

supervisor.fast_spec (generated from the typer app by supervisor.make_fast_spec) names an
option's parser by where it lives here: the fast path (supervisor.fast_path) calls the very
function typer calls, with no typer loaded. A parser that is not named here cannot be put
in the spec, and the generator says so.
"""

from __future__ import annotations

from typing import Final

from queue_worker.records import MAX_TASK_ID
from supervisor.cli_options import FSYNCS, data_directory, one_of, whole
from supervisor.enqueue_input import MAX_ENQUEUE
from supervisor.partitioned_cli import task_parser

#: every command's `--dir`
DATA_DIRECTORY: Final = data_directory
#: `qw enqueue --count`
ENQUEUE_COUNT: Final = whole("a number of tasks", 1, MAX_ENQUEUE)
#: `qw enqueue --fsync`
FSYNC: Final = one_of(*FSYNCS)
#: the ID of `qw task` and `qw why`: 17, or 3:17 on a partitioned queue
TASK_NAME: Final = task_parser(MAX_TASK_ID)
