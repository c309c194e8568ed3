"""Rebuild tests/data/pride_and_prejudice_head.txt from Debian's r-cran-janeaustenr (run once, by hand).

    cd /tmp && apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb janeaustenr
    .venv/bin/python scripts/make_eval_text.py /tmp/janeaustenr

R's lazy-load database: ``Rdata.rdx`` (an RDS file) maps each object to (offset, length) in ``Rdata.rdb``,
where each record is a 4-byte big-endian length followed by a zlib stream of a serialised R object.
"""

import re
import sys
import zlib
from pathlib import Path

import rdata

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "pride_and_prejudice_head.txt"
MIN_CHARS = 80_000


def main(root: str) -> int:
    data = Path(root) / "usr/lib/R/site-library/janeaustenr/data"
    index = rdata.conversion.convert(rdata.parser.parse_file(data / "Rdata.rdx", extension=".rds"))
    offset, length = (int(x) for x in index["variables"]["prideprejudice"])
    record = (data / "Rdata.rdb").read_bytes()[offset:offset + length]
    lines = [str(s) for s in rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(record[4:]),
                                                                             extension=".rds"))]
    # One paragraph per line: single line breaks become spaces, blank-line runs stay.
    text = re.sub(r"(?<!\n)\n(?!\n)", " ", "\n".join(lines))
    end = text.index("\n\n", MIN_CHARS)
    OUT.write_text(text[:end] + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({end + 1} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
