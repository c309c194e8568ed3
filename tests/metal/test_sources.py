"""The .metal sources stay inside the subset of MSL that both Apple's compiler and the g++ shim accept.

g++ is more permissive than Metal in places; these textual rules catch what it would let through (Metal has
no double, no C++ standard library, no recursion-prone or dynamic features) and what the shim cannot
translate (``threadgroup`` outside a kernel-scope declaration)."""

import re

import pytest

from somatile.host import metal_emu

SOURCES = sorted(metal_emu.METAL_DIR.glob("*.metal"))
FORBIDDEN = {
    r"\bdouble\b": "Metal has no double",
    r"\bstd::": "no C++ standard library in Metal",
    r"\b(printf|malloc|free|new|delete|throw|try|catch|goto)\b": "not available in Metal kernels",
    r"#include\s*\"": "Metal's runtime compiler cannot resolve includes of user files (metal_kernels assembles)",
    r"\bstatic\b": "the shim turns threadgroup into static storage; other statics would be shared by all threads",
    r"(?<![\w.])\d+\.\d*(?![\w.])|(?<![\w.])\d+e-?\d+(?![\w])": "an unsuffixed float literal is a double",
}


def code_of(path):
    text = re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_source_uses_the_shared_msl_subset(path):
    code = code_of(path)
    for pattern, reason in FORBIDDEN.items():
        match = re.search(pattern, code)
        assert match is None, f"{path.name}: {match.group(0)!r}: {reason}"
    for line in code.splitlines():
        if re.search(r"\bthreadgroup\b(?!_)", line):
            assert re.match(r"\s*threadgroup\s+\w+\s+\w+\[\w+\];\s*$", line), \
                f"{path.name}: {line.strip()!r}: threadgroup only on kernel-scope array declarations"


def test_every_family_file_is_listed():
    from somatile.host import metal_kernels

    listed = {name for files in metal_kernels.FAMILIES.values() for name in files}
    assert listed == {p.name for p in SOURCES}
