"""Reading the files people hand to somatile: YAML they wrote and .npz arrays they bring.

Shared by the board loader (boards/config.py), the parameter files (model/params.py), `somatile compare` /
`calibrate` inputs (model/compare.py) and `somatile device` (host/device_cli.py), so that every path refuses
the same traps: a YAML key given twice, a YAML 1.1 boolean (yes/no/on/off), an .npz that declares or inflates
to more than a size limit, pickled objects.
"""

from __future__ import annotations

import re
import zipfile

import numpy as np
import yaml


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two YAML 1.1 traps closed: a key given twice in one mapping is an error (not
    the last one silently winning), and only true/false are booleans; an unquoted yes/no/on/off, which YAML 1.1
    reads as a boolean and YAML 1.2 as a string, is an error asking for true/false or quotes."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_ambiguous_boolean(self, node):
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.value!r} is a boolean in YAML 1.1 and a string in YAML 1.2: write true or false, "
            f"or quote it for a string", node.start_mark)


_BOOL_TAG = "tag:yaml.org,2002:bool"
_AMBIGUOUS_TAG = "tag:somatile:ambiguous-boolean"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_StrictLoader.add_implicit_resolver(_AMBIGUOUS_TAG, re.compile(r"^(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"),
                                    list("yYnNoO"))
_StrictLoader.add_constructor(_AMBIGUOUS_TAG, _StrictLoader.construct_ambiguous_boolean)


def load_yaml(text: str):
    """``yaml.safe_load`` for files people write: a duplicate key or a YAML 1.1 boolean (yes/no/on/off)
    raises ``yaml.YAMLError`` with its line, instead of being read silently one way or the other."""
    return yaml.load(text, Loader=_StrictLoader)


# Largest array an input .npz may declare (checked from its headers before anything is read): a header that
# claims 10^12 elements, or a small file that inflates to gigabytes, is refused instead of loaded.
MAX_NPZ_ARRAY_BYTES = 1 << 30


def read_npz(path: str, what: str, max_bytes: int = MAX_NPZ_ARRAY_BYTES) -> dict[str, np.ndarray]:
    """The arrays of the .npz at ``path`` (``what`` names the option in messages). ValueError naming the
    file and the array when it cannot be read, holds pickled objects, or declares an array (or a member that
    inflates to) more than ``max_bytes``."""
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                name = member.filename.removesuffix(".npy")
                if member.file_size > max_bytes + 4096:  # the .npy header is at most a few KiB
                    raise ValueError(f"{what} {path}: array {name!r} inflates to {member.file_size} bytes; "
                                     f"the limit is {max_bytes}")
                with archive.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(f)
                size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if size > max_bytes:
                    raise ValueError(f"{what} {path}: array {name!r} declares shape {shape} of {dtype} "
                                     f"({size} bytes); the limit is {max_bytes}")
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{what} {path}: cannot read it as .npz ({exc})") from None
