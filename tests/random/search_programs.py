"""Search for random programs that minicompile gets wrong, for longer than CI does, and
print each one found as a minimal script that reproduces it.

    TRITON_INTERPRET=1 python tests/random/search_programs.py --backend cpp --examples 5000
    TRITON_INTERPRET=1 python tests/random/search_programs.py --seconds 600   # both backends

Each failure is shrunk by hypothesis to a smallest program that still fails, printed, and
the search goes on with a new seed.  Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# As in tests/conftest.py: Triton and minicompile read these once, at import.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MINICOMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="minicompile-search-"))
# Programs of the same source (``v0 = torch.sin(x0)``) but other inputs would otherwise load
# each other's warm entries from disk (counted as warm_entries, not graphs): the "one graph"
# check would fail on the search's own history.
os.environ["MINICOMPILE_WARM_ENTRIES"] = "0"
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]  # random_programs, this checkout's package

from hypothesis import HealthCheck, given, settings  # noqa: E402

from random_programs import check_program, programs  # noqa: E402


def search(backend: str, examples: int, seconds: float, seed: int, ops: int = 5) -> list[str]:
    """Run up to ``examples`` programs (or for ``seconds``); the minimal repro of each
    failure found."""
    found: list[str] = []
    deadline = time.monotonic() + seconds
    done = 0
    while done < examples and time.monotonic() < deadline:
        failing: list[str] = []
        count = [0, 0]  # programs run; programs run when the first failure was met

        @settings(max_examples=examples - done, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(programs(max_ops=ops))
        def run(program):  # type: ignore[no-untyped-def]
            if time.monotonic() > deadline and not failing:
                return
            count[0] += 1
            problem = check_program(program, backend)
            if problem is not None:
                count[1] = count[1] or count[0]
                failing[:] = [program.repro(backend, problem)]
                raise AssertionError(problem)

        run._hypothesis_internal_use_seed = seed + done  # a reproducible search
        try:
            run()
        except AssertionError:
            found.append(failing[0])
            print(f"---- failure {len(found)} ({backend}) ----\n{failing[0]}", flush=True)
        done += count[1] or count[0]
        print(f"{backend}: {done} programs, {len(found)} failure(s)", flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpp", "triton", "both"), default="both")
    parser.add_argument("--examples", type=int, default=2000, help="programs per backend")
    parser.add_argument("--seconds", type=float, default=1800, help="time per backend")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", type=int, default=5, help="statements per program, at most")
    args = parser.parse_args()
    backends = ("cpp", "triton") if args.backend == "both" else (args.backend,)
    failures = 0
    for backend in backends:
        start = time.monotonic()
        found = search(backend, args.examples, args.seconds, args.seed, args.ops)
        failures += len(found)
        print(f"{backend}: {len(found)} failure(s) in {time.monotonic() - start:.0f}s",
              flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
