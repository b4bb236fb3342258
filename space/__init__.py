"""cramnas search space: `ArchConfig` and the declarative YAML grammar that draws them.

Knows nothing of torch or training: the trainer consumes `ArchConfig`, the search consumes
`SearchSpace` (load one with `load_space(default_space_path("cpu"))`, draw with `sample`).
"""

from space.arch import ArchConfig, ArchError
from space.draw import Draw, OptunaDraws, RandomDraw
from space.search_space import SearchSpace, SpaceError, default_space_path, load_space, mutate

__all__ = [
    "ArchConfig", "ArchError", "Draw", "OptunaDraws", "RandomDraw", "SearchSpace", "SpaceError",
    "default_space_path", "load_space", "mutate",
]
