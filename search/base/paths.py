"""Where the repository keeps what a study reads: device profiles, run configs and search spaces.
A module of its own so that every reader (search.run, search.study.warm_start, search.confirm) imports
the paths without importing the others."""

from pathlib import Path

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"
SPACES = Path(__file__).resolve().parents[2] / "space" / "spaces"
