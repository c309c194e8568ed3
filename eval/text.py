"""Evaluation text: the committed public-domain Pride and Prejudice excerpt, or any user text file.

The default text is ``tests/data/pride_and_prejudice_head.txt`` (first ~80 KB of the novel; source and
form in ``tests/data/README.md``): paragraphs on one line each, blank lines kept as in the source. That
form is the one whose first 40,000 characters tokenise to 9,499 SmolLM2 tokens and give the reference
perplexity 27.774 of notes/realdata.md.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "pride_and_prejudice_head.txt"
REFERENCE_CHARS = 40_000  # the reference perplexity protocol scores the first 40,000 characters

# A sentence ends at . ! or ? (optionally followed by a closing quote) before whitespace; common
# abbreviations of the period (Mr., Mrs., Dr., St.) do not end one.
_SENTENCE_END = re.compile(r'(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?:(?<=[.!?])|(?<=[.!?]["\'\u201d\u2019_)]))\s+')


def load_text(path: str | Path | None = None) -> str:
    """The evaluation text (UTF-8). ``path=None`` gives the committed Pride and Prejudice excerpt."""
    p = Path(path) if path is not None else DEFAULT_TEXT
    if not p.is_file():
        hint = "" if path is not None else " (the repository's tests/data is needed; or pass --text FILE)"
        raise FileNotFoundError(f"evaluation text: no file {p}{hint}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"evaluation text {p}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if not text.strip():
        raise ValueError(f"evaluation text {p}: the file is empty")
    return text


def sentences(text: str, count: int | None, *, min_words: int = 4, max_words: int = 60) -> list[str]:
    """The first ``count`` distinct sentences of ``text`` with ``min_words..max_words`` words (all of them
    for ``count=None``).

    Headings and very short fragments (fewer than ``min_words`` words) are skipped; whitespace is
    collapsed. Raises ValueError naming the shortfall if the text holds fewer such sentences.
    """
    out: list[str] = []
    seen = set()
    for paragraph in re.split(r"\n\s*\n", text):
        for s in _SENTENCE_END.split(" ".join(paragraph.split())):
            s = s.strip()
            words = len(s.split())
            if min_words <= words <= max_words and s not in seen:
                seen.add(s)
                out.append(s)
                if len(out) == count:
                    return out
    if count is None:
        return out
    raise ValueError(f"evaluation text: found only {len(out)} sentences of {min_words}-{max_words} words, "
                     f"{count} requested")
