"""The report's scripts share one global scope: no two may declare the same function.

The page pastes ``page.JOB_SCRIPTS`` into one ``<script>``, so a second
``function f`` silently replaces the first for every caller (core.js's axis
ticks and its timeline ticks once shared a name, and the Overview's chart threw).
"""

from __future__ import annotations

import collections
import re

from opscope.report.page import JOB_SCRIPTS, SCRIPTS, asset


def test_no_function_is_declared_twice_across_the_page_scripts():
    declared = collections.defaultdict(list)
    for name in dict.fromkeys(SCRIPTS + JOB_SCRIPTS):
        for fn in re.findall(r"^(?:async\s+)?function\s+(\w+)\s*\(", asset(name), flags=re.M):
            declared[fn].append(name)
    assert {fn: where for fn, where in declared.items() if len(where) > 1} == {}
