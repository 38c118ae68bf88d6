"""What the exercise notebooks import: ``from icl_course import checks``.

The learner's functions: ``checks.self_check(name, f)``, ``checks.record(name, f)`` (hidden tests),
``checks.hint(name)`` and ``checks.progress(chapter)`` (:mod:`icl_course.grading.protocol`, the runtime).
What a check is and the helpers a catalogue builds it from are in :mod:`icl_course.grading.checking`;
``CHECKS``, every check by name, in :mod:`icl_course.grading.registry`.  The names after the first four
below are the grader's and the tests', kept here so that code written against this module goes on
working; new code imports them from those modules.
"""

from .grading.checking import (  # noqa: F401 (the grader's and the tests' names)
    FLOAT64,
    Case,
    Check,
    CheckFailed,
    close,
    describe,
    expect_number,
    expect_pair,
    expect_tensor,
    fail,
    generator_from,
    normal,
    plural,
)
from .grading.protocol import (  # noqa: F401
    ANSWERS_VARIABLE,
    CASES_FOLDER,
    Progress,
    SelfCheckFailed,
    find,
    giveaways_used,
    hint,
    portable,
    progress,
    record,
    recorded_names,
    self_check,
    verify_recorded,
    write_cases,
)
from .grading.registry import CHECKS  # noqa: F401

# the learner's functions (what ``from icl_course.checks import *`` gives)
__all__ = ["self_check", "record", "hint", "progress", "SelfCheckFailed", "Progress"]
