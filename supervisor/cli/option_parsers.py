"""The parsers of the small commands' options: `qw task` and `qw why` share their ID."""

from __future__ import annotations

from typing import Annotated, Final

import typer

from queue_worker.protocol.records import MAX_TASK_ID
from supervisor.cli.enqueue_input import MAX_ENQUEUE
from supervisor.cli.partitioned_commands import task_parser
from supervisor.options import FSYNCS, one_of, whole

#: `qw enqueue --count`
ENQUEUE_COUNT: Final = whole("a number of tasks", 1, MAX_ENQUEUE)
#: `qw enqueue --fsync`
FSYNC: Final = one_of(*FSYNCS)
#: the ID of `qw task` and `qw why`: 17, or 3:17 on a partitioned queue
TASK_NAME: Final = task_parser(MAX_TASK_ID)
#: the ID argument of `qw task` and `qw why`
TaskArgument = Annotated[
    str,
    typer.Argument(
        parser=TASK_NAME,
        metavar="ID",
        help="The task id (its index in the tasks log); PARTITION:ID on a partitioned queue.",
    ),
]
