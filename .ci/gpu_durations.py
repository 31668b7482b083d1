"""Fold the GPU gate's test logs (.ci/gpu's suite-*.jsonl) into .ci/gpu_durations.json, the seconds per test file
that the gate's shards are dealt by: python .ci/gpu_durations.py LOG.jsonl [LOG.jsonl ...]. Files absent from the
logs keep their recorded seconds."""
import collections
import json
import sys
from pathlib import Path

DURATIONS = Path(__file__).with_name("gpu_durations.json")


def main(logs: list[str]) -> None:
    seconds: dict[str, float] = collections.defaultdict(float)
    for log in logs:
        for line in Path(log).read_text().splitlines():
            entry = json.loads(line)
            seconds[entry["test"].split("::")[0]] += entry["seconds"]
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    recorded.update({name: round(s, 1) for name, s in seconds.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
