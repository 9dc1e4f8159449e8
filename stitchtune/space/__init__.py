"""The schedule space: the :class:`Schedule` value, the option table, the constraint evaluator and
:class:`SearchSpace` (domains and constraints from ``search_spaces/stitch.json``).

One job per module: ``schedule`` (the value), ``options`` (every option declared once), ``option_values`` (the enums of the options that are names),
``schemes`` (every stitching scheme declared once), ``constraints`` (the safe expression evaluator), ``space_file`` (finding and reading the data),
``search_space`` (suggest, sample, variants, grid), ``legality`` (validate: the rules a point must pass).
Import the public names from here.
"""

from stitchtune.space.constraints import names_used, safe_eval
from stitchtune.space.option_values import Combine, CrossCombine, Order
from stitchtune.space.options import (COMBINE, CORE_FIELDS, CROSS_COMBINE, EXACT_MATH, OPTIONS, ORDER, PREFETCH, RESERVED,
                                      ROW_VECTORS, SINGLE_PASS, Option, OptionTable, Point, exact_math, prefetchable, rereads)
from stitchtune.space.levels import ReuseLevel, uncached_level
from stitchtune.space.schedule import PERSISTENT, Schedule, row_chunk
from stitchtune.space.schemes import SCHEMES, Scheme, SchemeName, SchemeTable
from stitchtune.space.search_space import SearchSpace
from stitchtune.space.space_file import SPACE_FILE, default_space_file, load_space_file

__all__ = [
    "COMBINE", "CORE_FIELDS", "CROSS_COMBINE", "Combine", "CrossCombine", "Order", "EXACT_MATH", "OPTIONS", "ORDER", "PERSISTENT", "PREFETCH", "RESERVED", "ROW_VECTORS", "SINGLE_PASS", "Option",
    "OptionTable", "Point",
    "SCHEMES", "SPACE_FILE", "Schedule", "Scheme", "SchemeName", "SchemeTable", "SearchSpace", "default_space_file", "exact_math", "load_space_file", "names_used", "prefetchable",
    "rereads", "ReuseLevel", "row_chunk", "safe_eval", "uncached_level",
]
