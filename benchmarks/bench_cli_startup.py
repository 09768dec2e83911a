"""Start-up time of `perseus --help`: this checkout against another commit, in one run.

    python benchmarks/bench_cli_startup.py --baseline 9961b1e [--runs 15]

Checks the baseline commit out into a temporary git worktree, then alternates the two
(`python -c "from perseus.cli import app; app()" --help` with each tree first on
`PYTHONPATH`), so both see the same machine load. Prints the median of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_CODE = "import sys; sys.argv = ['perseus', '--help']; from perseus.cli import app; app()"


def _time_once(tree: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _CODE],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git commit to compare against")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old), args.baseline],
            cwd=REPO,
            check=True,
        )
        try:
            _time_once(old), _time_once(REPO)  # warm the file cache
            before, after = [], []
            for _ in range(args.runs):
                before.append(_time_once(old))
                after.append(_time_once(REPO))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO)
    b, a = statistics.median(before), statistics.median(after)
    print(f"perseus --help, median of {args.runs}: {args.baseline} {b:.3f} s, this tree {a:.3f} s")
    print(f"ratio (this tree / baseline): {a / b:.2f}")


if __name__ == "__main__":
    main()
