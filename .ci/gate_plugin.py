"""pytest plugin of the GPU gate (.ci/gpu): shards the suite by recorded durations and logs every test as it ends.

* ``--gate-shard I/N`` keeps the I-th of N shards (1-based). Files stay whole (the suite runs with
  ``--dist loadfile``: a file's tests share a worker, and test_numerics.py checks what its own tests launched), and
  are dealt to shards longest first, each to the shard with the least recorded time so far, from
  ``--gate-durations FILE`` (JSON: file -> seconds; a file with no record counts as the median file).
* ``--gate-log FILE`` appends one JSON line per test as its report reaches the controller (node id, outcome,
  seconds, the peak of torch's GPU cache that tests/conftest.py records, the traceback of a failure), so that a
  shard cut off by a device command's time limit still tells what ran, what failed and how long each test took. ``.ci/gpu_durations.py`` folds such logs into the durations file.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("ogsgen GPU gate")
    group.addoption("--gate-shard", default=None, help="I/N: run the I-th of N shards of the suite's files")
    group.addoption("--gate-durations", default=None, help="JSON file -> seconds recorded on a GPU")
    group.addoption("--gate-log", default=None, help="append one JSON line per test report to this file")


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--gate-shard must be I/N with integers, e.g. 2/4; got {text!r}") from None
    if not 1 <= index <= count:
        raise pytest.UsageError(f"--gate-shard {text}: I must be between 1 and N")
    return index, count


def deal_files(seconds: dict[str, float], count: int) -> list[list[str]]:
    """Files into ``count`` shards of about equal recorded time: longest first, each to the least loaded shard."""
    shards: list[list[str]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for name in sorted(seconds, key=lambda n: (-seconds[n], n)):
        lightest = loads.index(min(loads))
        shards[lightest].append(name)
        loads[lightest] += seconds[name]
    return shards


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("gate_shard")
    if not shard or not items:
        return
    index, count = _parse_shard(shard)
    recorded: dict[str, float] = {}
    if config.getoption("gate_durations"):
        recorded = json.loads(Path(config.getoption("gate_durations")).read_text())
    files = sorted({item.nodeid.split("::")[0] for item in items})
    default = statistics.median(recorded.values()) if recorded else 1.0
    keep = set(deal_files({f: recorded.get(f, default) for f in files}, count)[index - 1])
    selected = [item for item in items if item.nodeid.split("::")[0] in keep]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid.split("::")[0] not in keep])
    items[:] = selected


def pytest_runtest_logreport(report):
    if _log_path is None:
        return
    # Every call; setups and teardowns that failed or took time (a module's fixture may build kernels).
    if report.when == "call" or not report.passed or report.duration >= 0.05:
        entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
                 "seconds": round(report.duration, 3), **dict(report.user_properties)}
        if report.failed:
            entry["longrepr"] = str(report.longrepr)[-6000:]
        with open(_log_path, "a") as stream:
            stream.write(json.dumps(entry) + "\n")


_log_path: str | None = None


def pytest_configure(config):
    global _log_path
    # Only the controller writes: it receives every worker's reports.
    _log_path = None if hasattr(config, "workerinput") else config.getoption("gate_log")
