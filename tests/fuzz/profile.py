"""Hypothesis profiles for the fuzz suite.

"ci" (default): few examples, derandomized (the same examples every run, no example database), so CI is
bounded and reproducible. "long" (FUZZ_PROFILE=long): many more, randomized, with an example database
outside the repository so a failure found once is replayed first next time.
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILE = os.environ.get("FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"FUZZ_PROFILE must be ci or long, not {PROFILE!r}")

# Calls against a real cluster are slow for hypothesis' taste, and huge strings are deliberate.
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
          HealthCheck.function_scoped_fixture]

settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET, print_blob=True)
settings.register_profile(
    "long", max_examples=20 * 50, deadline=None, derandomize=False, suppress_health_check=_QUIET,
    print_blob=True, database=DirectoryBasedExampleDatabase(
        os.environ.get("FUZZ_DB", os.path.join(tempfile.gettempdir(), "rip18-fuzz-hypothesis"))))

SCALE = 1 if PROFILE == "ci" else 50


def fuzz_settings(ci_examples: int) -> settings:
    """The active profile with `ci_examples` examples in CI (50x that in the long profile)."""
    return settings(settings.get_profile(PROFILE), max_examples=ci_examples * SCALE)
