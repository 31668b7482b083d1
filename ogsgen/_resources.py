"""Where the shipped data folders (templates/, generated/) live.

In a source checkout they sit beside the package; in an installed wheel they are shipped inside
it as ``ogsgen/templates`` and ``ogsgen/generated``.
"""
from functools import lru_cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"ogsgen's {name}/ folder is missing next to {_PACKAGE_DIR}; reinstall ogsgen")


def installed() -> bool:
    """Whether this ogsgen is an installed package, whose data folders pip put inside it (and removes by its record
    of the files it installed), rather than a source checkout (data folders beside the package)."""
    return data_dir("generated").parent == _PACKAGE_DIR
