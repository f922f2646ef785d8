"""The fast part of the attack list (tests/attacks): each must be HELD. `make attack` runs
them all, slow ones included, and prints the verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attacks.catalog import ATTACKS, Attack
from tests.attacks.harness import Verdict


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.fast], ids=lambda a: a.name)
def test_attack_is_held(attack: Attack, tmp_path: Path) -> None:
    finding = attack.run(tmp_path)
    assert finding.verdict is Verdict.HELD, finding.detail
