"""pytest plugin (entry point ``ogsgen``): under Triton's interpreter (TRITON_INTERPRET=1), correct its known
defects before any test runs (``ogsgen.numerics.interpreter``). Disable with ``-p no:ogsgen``."""
import os


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        from .numerics.interpreter import install  # imports torch and triton: only when interpreting

        install()
