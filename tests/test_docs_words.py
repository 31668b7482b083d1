"""What ships and what documents it speaks to users: no work sessions, device calls or internal issue numbers
(dates and commits instead); every recorded run a document names can be found with its commit; every probe
backs a rule or row of docs/heuristics.md or docs/performance.md; bench/ stays the product's size."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# (pattern, what it catches); phrases in ALLOWED may contain a match where the word means something else
FORBIDDEN = [
    (re.compile(r"\bsessions?\b", re.I), "a work session"),
    (re.compile(r"\bS\d{1,2}\b"), "a session tag (S13)"),
    (re.compile(r"\bdevice calls?\b", re.I), "a device call"),
    (re.compile(r"\bcalls? [A-Z](?:-[A-Z])?\b(?!['\w])"), "a lettered device call (call Q)"),
    # (not the verb: "issues 16-byte copies", "issues 13% more instructions", "issue 455 instructions per warp")
    (re.compile(r"\bissues? #?\d+\b(?!%|-|\s+(?:\w+\s+)?(?:instructions?|loads?|stores?|copies|bytes?|wgmmas?|"
                r"warps?|requests?|dots?)\b)|\bissue-\d+", re.I), "an internal issue number"),
    (re.compile(r"\bitems? \d+\b", re.I), "an internal item number"),
    (re.compile(r"\bfinal tree\b", re.I), "a session's final tree"),
    (re.compile(r"\bagents?\b", re.I), "an agent"),
]
ALLOWED = ("pytest session", "interactive session", 'scope="session"')


def shipped_and_documented() -> list[Path]:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "ogsgen").rglob("*.py")]
    for folder in ("bench", "tests", "examples", ".ci"):  # the tests' docstrings are read as the docs of behaviour
        for pattern in ("*.py", "*.md", "*.sh"):
            files += (ROOT / folder).rglob(pattern)
    return sorted(path for path in files if path != Path(__file__).resolve())  # (this file spells the patterns)


def forbidden_words(text: str) -> list[str]:
    """``what (line: excerpt)`` for each match of FORBIDDEN in ``text`` outside the ALLOWED phrases."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for phrase in ALLOWED:
            line = re.sub(re.escape(phrase), " " * len(phrase), line, flags=re.I)
        for pattern, what in FORBIDDEN:
            found += [f"{what} ({number}: {match.group(0)!r})" for match in pattern.finditer(line)]
    return found


def test_the_patterns_catch_the_diary_and_pass_ordinary_english():
    diary = ("the twenty-seventh session; [S13, 2026-12-01m]; its test failed before on the GPU (call Q); "
             "calls T-V; three device calls; issue 29; issues 30, 33; the issue-5 misses; item 3; "
             "this session's final tree; the agents")
    assert len(forbidden_words(diary)) == 12
    ordinary = ("Triton issues 16-byte asynchronous copies; its loop issues 13% more instructions; it issues 455 "
                "instructions per warp; a pytest session starts; "
                "tile 16x128x64s2; triton-lang/triton#9433; a call's tiles; calls of 16 rows; sm_90")
    assert forbidden_words(ordinary) == []


@pytest.mark.parametrize("path", shipped_and_documented(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_session_or_internal_issue_words(path):
    assert forbidden_words(path.read_text()) == []


RUN = re.compile(r"\b20\d\d-\d\d-\d\d(?:[a-z]?-[a-z0-9]+|[a-z])\b")  # a run's label, not a plain date


def indexed_runs() -> set[str]:
    """The runs bench/results/README.md lists (first column of its table), with the folders still there."""
    listed = re.findall(r"^\| (20\d\d-\d\d-\d\d\S*) \|", (RESULTS / "README.md").read_text(), re.M)
    return set(listed) | {p.name for p in RESULTS.iterdir() if p.is_dir()}


def test_every_run_a_document_names_is_kept_or_indexed_with_its_commit():
    runs, missing = indexed_runs(), []
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").rglob("*.md"),
                 *(ROOT / "bench").rglob("*.py"), *(ROOT / "ogsgen").rglob("*.py")]:
        text = path.read_text()
        missing += [f"{path.relative_to(ROOT)}: {run}" for run in set(RUN.findall(text)) if run not in runs]
        for ref in re.findall(r"bench/results/([\w-]+(?:[./][\w-]+)*)", text):
            placeholder = re.fullmatch(r"[A-Z]+(?:-\w+)?", ref.split("/")[0])  # DATE, DATE-train, RUN
            if not placeholder and not (RESULTS / ref).exists():
                missing.append(f"{path.relative_to(ROOT)}: bench/results/{ref}")
    assert missing == []
    rows = [row.split(" | ") for row in re.findall(r"^\| 20\d\d-.*$", (RESULTS / "README.md").read_text(), re.M)]
    assert rows and [row[0] for row in rows if not re.match(r"(rec\. )?[0-9a-f]{7}\b", row[1])] == []


def test_every_probe_is_named_where_it_backs_a_rule():
    docs = (ROOT / "docs" / "heuristics.md").read_text() + (ROOT / "docs" / "performance.md").read_text()
    probes = sorted(p.name for p in (ROOT / "bench" / "probes").iterdir() if p.suffix in (".py", ".sh"))
    assert probes and [name for name in probes if name not in docs] == []


def test_bench_stays_the_products_size():
    python_lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "bench").rglob("*.py"))
    # (2000, then 2200 from 2026-12-07 with vLLM's fp8 block path, 2400 with DeepGEMM, 2450 with the fp8 words' GPU
    # timing and the hopper_fp8 layout in the offline check, 2600 with the warp-specialized fp8 block kernel's probe,
    # 2700 with the whole fp8 layer against vLLM's pieces)
    assert python_lines < 2700
    assert sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file()) < 2 * 2 ** 20
    assert not [p for p in RESULTS.rglob("*") if p.suffix in (".py", ".sh")]  # scripts live outside results/
    assert len((ROOT / "docs" / "gpu_runs.md").read_text().splitlines()) < 120
