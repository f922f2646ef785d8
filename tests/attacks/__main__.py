"""`python -m tests.attacks [--fast] [NAME …]`: run the attacks and print a verdict each.

Exit 0 when every attack run was HELD, 1 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.attacks.catalog import ATTACKS, Attack
from tests.attacks.harness import Finding, Verdict, degraded


def run_one(attack: Attack) -> Finding:
    with tempfile.TemporaryDirectory(prefix="qw-attack-") as work:
        try:
            return attack.run(Path(work))
        except subprocess.TimeoutExpired as e:
            return degraded(f"hung: {' '.join(map(str, e.cmd))[-80:]} ran past {e.timeout} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.attacks", description=__doc__)
    parser.add_argument("--fast", action="store_true", help="only the attacks CI runs")
    parser.add_argument("names", nargs="*", help="run only attacks whose name has this text")
    args = parser.parse_args(argv)
    chosen = [
        a
        for a in ATTACKS
        if (a.fast or not args.fast) and (not args.names or any(n in a.name for n in args.names))
    ]
    counts = dict.fromkeys(Verdict, 0)
    for attack in chosen:
        started = time.monotonic()
        finding = run_one(attack)
        counts[finding.verdict] += 1
        took = time.monotonic() - started
        print(f"{finding.verdict.value.upper():<9} {attack.name}  ({took:.1f} s)")
        print(f"          {finding.detail}", flush=True)
    print(", ".join(f"{n} {v.value}" for v, n in counts.items()))
    return 0 if counts[Verdict.HELD] == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
