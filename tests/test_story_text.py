"""`qw why` piped prints its story without rich (supervisor.story_text): exactly what rich
prints for the same story, or nothing (and rich renders it)."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_worker.proof.explain import Step, TaskStory
from supervisor.console import PLAIN_WIDTH, plain_console
from supervisor.report_text import render_story
from supervisor.story_text import PLAIN_WIDTH as STORY_PLAIN_WIDTH
from supervisor.story_text import plain_story
from tests.examples import examples


@pytest.fixture(autouse=True)
def piped_without_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both layouts at the piped width, 80 (tests/conftest.py sets a wide COLUMNS)."""
    monkeypatch.delenv("COLUMNS", raising=False)


KINDS = ("TASK", "CLAIM", "RENEW", "DONE", "FAIL", "OP")
# one-column ASCII, the separator of worker labels, markup and emoji material (`[`, `:`),
# spaces and tabs (printable makes a tab a space), and characters two columns wide
ALPHABET = "ab Z09:-_[]/\\·\té中🙂"
plain_texts = st.text(alphabet="ab Z09:-_/\\·", max_size=30)  # what the plain path takes
texts = st.one_of(
    plain_texts,
    plain_texts,
    st.text(alphabet=ALPHABET, max_size=30),
    st.text(alphabet="ab :", min_size=150, max_size=210),  # around the plain width
    st.sampled_from([":100:", ":smile:", "12:34:56", "[bold]x[/bold]", "a  ", "  a", ""]),
)


def _stories(texts: st.SearchStrategy[str]) -> st.SearchStrategy[TaskStory]:
    workers = st.one_of(
        st.none(),
        st.sampled_from(["w6-6975-4ede", "w0@box-11704-d3af", "w12-1-ab"]),
        texts,
    )
    steps = st.builds(
        Step,
        position=st.integers(0, 2**53),
        kind=st.sampled_from(KINDS),
        worker=workers,
        at=st.one_of(st.just(0), st.integers(1, 2**62 // 1000)),
        verdict=st.sampled_from(["won", "lost: held", "published"]),
        why=texts,
    )
    return st.builds(
        TaskStory,
        task=st.integers(0, 10**6),
        published=st.booleans(),
        steps=st.lists(steps, min_size=1, max_size=6).map(tuple),
        state=texts,
    )


# half the stories of text the plain path takes (or of lengths around the plain width)
stories = st.one_of(
    _stories(plain_texts),
    _stories(st.one_of(plain_texts, st.text(alphabet="ab :", min_size=150, max_size=210))),
    _stories(texts),
)


def _rich(story: TaskStory, name: str | None) -> str:
    out = io.StringIO()  # not a terminal: the plain console supervisor.console makes
    console = plain_console(out)
    assert not console.is_terminal
    console.print(render_story(story, plain=True, name=name))
    return out.getvalue()


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(story=stories, name=st.one_of(st.none(), st.sampled_from(["3", "p1:7"])))
def test_the_plain_story_is_what_rich_prints(story: TaskStory, name: str | None) -> None:
    text = plain_story(story, name)
    if text is not None:
        assert text + "\n" == _rich(story, name)


def test_a_usual_story_is_printed_without_rich() -> None:
    # a story as a queue writes it: the plain path takes it (else it would never be used)
    story = TaskStory(
        task=7,
        published=True,
        steps=(
            Step(112, "TASK", None, 1_764_527_023_016_000, "published", 'payload {"n": 7}'),
            Step(4096, "CLAIM", "w6-6975-4ede", 1_764_527_023_020_000, "won", "won"),
            Step(4160, "DONE", "w6-6975-4ede", 1_764_527_023_030_000, "done", "accepted"),
        ),
        state="done",
    )
    text = plain_story(story)
    assert text is not None
    assert text + "\n" == _rich(story, None)
    assert text.splitlines()[0] == "task 7: done"


def test_what_rich_would_lay_out_otherwise_is_left_to_rich() -> None:
    step = Step(1, "CLAIM", "w1-2-ab", 0, "won", "x")
    for why in ("[bold]x", "a :smile: b", "中", "x" * 200):
        story = TaskStory(task=1, published=True, steps=(step._replace(why=why),), state="held")
        assert plain_story(story) is None, why


def test_the_widths_agree() -> None:
    assert STORY_PLAIN_WIDTH == PLAIN_WIDTH
