"""The attack list: what an attacker (or bad luck) did to qw, kept as a suite anyone can run.

`make attack` (``python -m tests.attacks``) runs every attack against the real `qw` in a
temporary directory and prints one line each: HELD (refused or survived as the README
promises), DEGRADED (nothing lost, but not the clean refusal promised: a traceback, a
wrong exit code, a hang ended by the harness) or BROKEN (a task lost or run twice while
the report says OK, or data already in the log damaged). `tests/test_attacks.py` runs the
fast ones in the suite (CI) and requires every one of them to be HELD.
"""
