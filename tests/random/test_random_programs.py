"""Random programs compiled on both backends match eager (tests/random/random_programs.py).

CI runs a fixed sequence of programs (derandomized: the same programs on every run) within
a time budget; ``tests/random/search_programs.py`` searches longer, with new seeds, and
prints each failure as a minimal reproduction.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings

from random_programs import check_program, programs

PROGRAMS_PER_BACKEND = 500
# Seconds per backend: the programs stop there (a slow machine runs fewer; the count run is
# checked below, so a budget cut short fails rather than passing quietly).
BUDGET_S = 400.0


def test_random_programs_match_eager(backend: str) -> None:
    start = time.monotonic()
    ran = []

    @settings(max_examples=PROGRAMS_PER_BACKEND + 20, derandomize=True, deadline=None,
              database=None, suppress_health_check=list(HealthCheck), print_blob=True)
    @given(programs())
    def run(program) -> None:  # type: ignore[no-untyped-def]
        if time.monotonic() - start > BUDGET_S:
            return
        problem = check_program(program, backend)
        assert problem is None, program.repro(backend, problem)
        ran.append(1)

    run()
    assert len(ran) >= PROGRAMS_PER_BACKEND, (
        f"only {len(ran)} programs ran within {BUDGET_S:.0f}s")
