"""Telling a looping reply from a real one.

Small models (SmolLM2-135M above all) fall into loops: one line or phrase repeated
until the output cap. The measure used here, by ``bench/local_model.py`` and by anyone
filtering model text before keeping it (the memory flush), is the share of a text's
words covered by word n-grams that occur more than once:

- words are the whitespace-separated tokens, lower-cased, with the punctuation around
  them stripped (so "Hello!" and "hello," are one word; a token of punctuation alone
  is dropped);
- every window of ``n`` consecutive words (default 4) is an n-gram; a word is covered
  when at least one n-gram containing it occurs 2 or more times in the text;
- ``loop_share`` = covered words / all words, in [0, 1]; a text of fewer than ``2 * n``
  words cannot hold a repeat and scores 0.

A reply is looping when its share is over one half (``LOOP_THRESHOLD``): the repeat is
then most of what it says. Ordinary prose repeats a 4-gram now and then ("at the end
of"), which covers a few words, far from half; a list whose items share a 4-word
opening stays well under it as long as the items say something beyond it.
"""

from __future__ import annotations

from collections import Counter

DEFAULT_NGRAM = 4
LOOP_THRESHOLD = 0.5
# Stripped from both ends of a token: "Hello," and "hello" are one word.
_PUNCTUATION = "\"'`.,;:!?()[]{}<>*_-–—…«»“”‘’/\\|#~"


def words(text: str) -> list[str]:
    """The text's words as ``loop_share`` counts them (lower-cased, punctuation stripped)."""
    out = []
    for token in text.split():
        word = token.strip(_PUNCTUATION).lower()
        if word:
            out.append(word)
    return out


def loop_share(text: str, n: int = DEFAULT_NGRAM) -> float:
    """The share of words covered by a word n-gram that occurs 2+ times (module docstring)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    tokens = words(text)
    if len(tokens) < 2 * n:
        return 0.0
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    counts = Counter(grams)
    covered = [False] * len(tokens)
    for start, gram in enumerate(grams):
        if counts[gram] >= 2:
            for i in range(start, start + n):
                covered[i] = True
    return sum(covered) / len(tokens)


def is_looping(text: str, *, n: int = DEFAULT_NGRAM, threshold: float = LOOP_THRESHOLD) -> bool:
    """Is most of ``text`` a repeat (``loop_share`` over ``threshold``)?"""
    return loop_share(text, n) > threshold
