#!/usr/bin/env bash
# check-redistribution: kill -9 a worker that holds a task; a survivor must finish that task.
#
# The original's scenario on our stack. Starts `qw up --no-tui` on a fresh temporary data
# directory (lease 8 s, work 4 s by default), finds a worker that is working a task (from
# the workers' stats snapshots, <dir>/run/*.json), kills it with SIGKILL, then polls the
# claims log (the story `qw task ID` prints) until that task is done — within lease + margin
# seconds of the kill — and checks that the worker that finished it is a survivor: one that
# was running when the victim was killed. Not the victim, and not the victim's replacement
# (the supervisor restarts the dead slot as a new worker id; the pick rules leave the dead
# worker's task to the survivors). A kill that lands just after the victim finished its task
# proves nothing and is tried again on another holder. Finally `qw report` must exit 0.
#
# Usage: bin/check-redistribution.sh [--lease S] [--work-ms MS] [--workers N] [--margin S]
#                                    [--dir DIR] [--keep]
# Environment (flags win): QW_LEASE, QW_WORK_MS, QW_WORKERS, QW_MARGIN, QW_DIR; QW (the qw
# command, default: the repository's .venv/bin/qw, else qw on PATH); PYTHON (reads the
# snapshots and the log).
#
# Exit 0: redistributed and the report is clean. 1: it was not (the message says why).
# 2: bad usage or qw could not start. Every process it started is ended on any way out.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LEASE="${QW_LEASE:-8}"
WORK_MS="${QW_WORK_MS:-4000}"
WORKERS="${QW_WORKERS:-3}"
MARGIN="${QW_MARGIN:-30}"
DIR="${QW_DIR:-}"
KEEP=0

usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }
die() { echo "check-redistribution: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --lease) LEASE="${2:?--lease needs seconds}"; shift 2 ;;
        --work-ms) WORK_MS="${2:?--work-ms needs milliseconds}"; shift 2 ;;
        --workers) WORKERS="${2:?--workers needs a number}"; shift 2 ;;
        --margin) MARGIN="${2:?--margin needs seconds}"; shift 2 ;;
        --dir) DIR="${2:?--dir needs a directory}"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
if ! [[ "$WORKERS" =~ ^[0-9]+$ ]] || [ "$WORKERS" -lt 2 ]; then
    die "--workers is '$WORKERS'; expected 2 or more"
fi
[[ "$WORK_MS" =~ ^[0-9]+$ ]] || die "--work-ms is '$WORK_MS'; expected milliseconds"
[[ "$LEASE" =~ ^[0-9]*\.?[0-9]+$ ]] || die "--lease is '$LEASE'; expected seconds"
[[ "$MARGIN" =~ ^[0-9]*\.?[0-9]+$ ]] || die "--margin is '$MARGIN'; expected seconds"

if [ -z "${QW:-}" ]; then
    if [ -x "$ROOT/.venv/bin/qw" ]; then QW="$ROOT/.venv/bin/qw"
    elif command -v qw >/dev/null 2>&1; then QW="qw"
    else die "no qw command: run 'make test' once, or set QW"; fi
fi
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

MADE_DIR=0
if [ -z "$DIR" ]; then
    DIR="$(mktemp -d "${TMPDIR:-/tmp}/qw-redistribution.XXXXXX")"
    MADE_DIR=1
else
    mkdir -p "$DIR" || die "cannot create --dir '$DIR'"
fi
SUPERVISOR_PID=""
PASSED=0

now_ms() { date +%s%3N; }
alive() { kill -0 "$1" 2>/dev/null; }

# Wait (polling) until process $1 is gone or $2 ms have passed.
wait_gone() {
    local deadline=$(( $(now_ms) + $2 ))
    while alive "$1" && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.05; done
    ! alive "$1"
}

cleanup() {
    local code=$?
    trap - EXIT INT TERM
    if [ -n "$SUPERVISOR_PID" ] && alive "$SUPERVISOR_PID"; then
        # The first SIGTERM drains, a second kills the workers at once; SIGKILL if all else
        # fails (the workers die with their supervisor: they watch their parent).
        kill -TERM "$SUPERVISOR_PID" 2>/dev/null || true
        wait_gone "$SUPERVISOR_PID" 1000 || {
            kill -TERM "$SUPERVISOR_PID" 2>/dev/null || true
            wait_gone "$SUPERVISOR_PID" 3000 || kill -KILL "$SUPERVISOR_PID" 2>/dev/null || true
        }
        wait "$SUPERVISOR_PID" 2>/dev/null || true
    fi
    if [ "$MADE_DIR" = 1 ]; then
        if [ "$KEEP" = 1 ] || [ "$PASSED" != 1 ]; then
            echo "check-redistribution: data kept in $DIR" >&2
        else
            rm -rf "$DIR"
        fi
    fi
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "check-redistribution: FAIL: $*" >&2; exit 1; }
say() { echo "check-redistribution: $*"; }

# Two JSON readers (python: the project's own interpreter, so nothing else is needed).
# A worker working a task, from the workers' stats snapshots (<dir>/run/*.json, read
# directly: quicker than `qw status`, so the task is less likely to finish before the kill):
# "pid task worker-id running-ids" of the alive one that started its task last, where
# running-ids is every alive worker's id, comma-separated (the survivors-to-be, and it);
# nothing until all argv[2] workers have published (a survivor must be known by its id).
read -r -d '' HOLDER_OF <<'PY' || true
import glob, json, os, sys
best = None
running = []
for path in glob.glob(os.path.join(sys.argv[1], "run", "*.json")):
    try:
        with open(path) as f:
            w = json.load(f)
        os.kill(int(w["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        continue
    if w.get("state") == "exited":
        continue
    running.append(str(w["worker"]))
    if w.get("state") == "working" and w.get("current_task") is not None:
        if best is None or (w.get("current_since") or 0) > (best.get("current_since") or 0):
            best = w
if best is not None and len(running) >= int(sys.argv[2]):
    print(best["pid"], best["current_task"], best["worker"], ",".join(running))
PY
# The worker whose DONE for task argv[2] was accepted: the same story `qw task ID` tells
# (queue_worker.proof.explain over the claims log), without the command line's start-up time.
read -r -d '' FINISHER_OF <<'PY' || true
import sys
from queue_worker.proof.explain import explain_task
from queue_worker.proof.report import read_claims
story = explain_task(int(sys.argv[2]), None, read_claims(sys.argv[1]))
print(next((s.worker for s in story.steps if s.kind == "DONE" and s.verdict == "done"), ""))
PY

# How people see a worker id (w6-6975-4ede -> w6·6975): queue_worker.names.worker_label.
read -r -d '' LABEL_OF <<'PY' || true
import sys
from queue_worker.names import worker_label
print(worker_label(sys.argv[1]))
PY

find_holder() { "$PYTHON" -c "$HOLDER_OF" "$DIR" "$WORKERS" 2>/dev/null || true; }
finisher() { (cd "$ROOT" && "$PYTHON" -c "$FINISHER_OF" "$DIR" "$1" 2>/dev/null) || true; }
label() { (cd "$ROOT" && "$PYTHON" -c "$LABEL_OF" "$1" 2>/dev/null) || echo "$1"; }

say "lease ${LEASE}s, work ${WORK_MS}ms, ${WORKERS} workers, data in $DIR"
"$QW" up --dir "$DIR" --workers "$WORKERS" --work-ms "$WORK_MS" --lease "$LEASE" \
    --tasks $(( WORKERS * 4 )) --no-tui >"$DIR/up.out" 2>&1 &
SUPERVISOR_PID=$!

# Kill a holder. With short work times its DONE may land before the kill does: then
# nothing was redistributed, and another holder is tried (the supervisor restarts the dead).
start_deadline=$(( $(now_ms) + 30000 ))
limit_ms=$(awk -v l="$LEASE" -v m="$MARGIN" 'BEGIN { printf "%d", (l + m) * 1000 }')
done_by=""
for _ in 1 2 3; do
    holder=""
    while [ -z "$holder" ]; do
        alive "$SUPERVISOR_PID" || { cat "$DIR/up.out" >&2; die "qw up exited early"; }
        [ "$(now_ms)" -lt "$start_deadline" ] || fail "no worker was working a task within 30 s"
        holder="$(find_holder)"
        [ -n "$holder" ] || sleep 0.05
    done
    read -r VICTIM_PID TASK VICTIM RUNNING <<<"$holder"
    kill -9 "$VICTIM_PID" 2>/dev/null || continue  # it exited meanwhile: find another
    killed_at=$(now_ms)
    say "kill -9 $VICTIM_PID ($(label "$VICTIM")), which held task $TASK"
    done_by="$(finisher "$TASK")"
    if [ "$done_by" = "$VICTIM" ]; then
        say "task $TASK was finished by $VICTIM just before the kill; trying another holder"
        done_by=""
        continue
    fi
    # Poll with a deadline: a survivor may claim the task once the lease has run out.
    deadline=$(( killed_at + limit_ms ))
    while [ -z "$done_by" ]; do
        [ "$(now_ms)" -lt "$deadline" ] ||
            fail "task $TASK was not finished within lease + margin ($(( limit_ms / 1000 )) s) of the kill"
        sleep 0.1
        done_by="$(finisher "$TASK")"
    done
    break
done
[ -n "$done_by" ] || fail "every kill landed after its task was finished; try a longer --work-ms"
took_ms=$(( $(now_ms) - killed_at ))
VICTIM_LABEL="$(label "$VICTIM")"
TAKER_LABEL="$(label "$done_by")"
[ "$done_by" != "$VICTIM" ] || fail "task $TASK was finished by the victim $VICTIM_LABEL itself"
case ",$RUNNING," in
    *",$done_by,"*) ;;
    *) fail "task $TASK was finished by $TAKER_LABEL, which was not running when $VICTIM_LABEL was killed (the victim's replacement): not a survivor" ;;
esac
say "task $TASK finished by $TAKER_LABEL (a survivor), $(( took_ms / 1000 )).$(( took_ms % 1000 / 100 )) s after the kill"

set +e
"$QW" report --dir "$DIR"
report_code=$?
set -e
[ "$report_code" = 0 ] || fail "qw report exited $report_code"
PASSED=1
say "OK: task $TASK was redistributed from $VICTIM_LABEL to $TAKER_LABEL (a survivor); qw report exit 0"
