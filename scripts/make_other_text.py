"""Write the second evaluation text: Ambrose Bierce's The Devil's Dictionary (1911, public domain) from Debian's
dict-devil package (``apt-get install dict-devil``), from its first entry on, runs of blanks folded.

    .venv/bin/python scripts/make_other_text.py build/eval/devil.txt

`make eval` runs it; the quality targets of docs/results.md must hold on this text as well as on the committed
Pride and Prejudice excerpt (a dictionary of sardonic definitions: another author, century and register).
"""

import gzip
import re
import sys
from pathlib import Path

SOURCE = Path("/usr/share/dictd/devil.dict.dz")  # dictzip: a gzip file with an index in its header
FIRST_ENTRY = "ABASEMENT"


def main(out: str) -> int:
    if not SOURCE.is_file():
        print(f"make_other_text: no {SOURCE}; install Debian's dict-devil (apt-get install dict-devil)",
              file=sys.stderr)
        return 2
    text = gzip.decompress(SOURCE.read_bytes()).decode("utf-8", errors="strict")
    start = text.find(FIRST_ENTRY)
    if start < 0:
        print(f"make_other_text: {SOURCE} has no entry {FIRST_ENTRY!r}", file=sys.stderr)
        return 2
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(re.sub(r"[ \t]+", " ", text[start:]), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/eval/devil.txt"))
