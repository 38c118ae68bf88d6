"""What the exercise notebooks import: ``from icl_course import checks``.

A stable, thin front for :mod:`icl_course.grading`: the notebooks call ``checks.self_check(name, f)``,
``checks.record(name, f)`` (hidden tests), ``checks.hint(name)`` and ``checks.progress(chapter)``.
How a check runs is in :mod:`icl_course.grading.protocol`; what each check verifies is in its
chapter's catalogue, :mod:`icl_course.grading.chapter1` and so on; ``CHECKS``, every check by name,
comes from :mod:`icl_course.grading.registry` (loaded when first used).
"""

from .grading.protocol import (
    ANSWERS_VARIABLE,
    CASES_FOLDER,
    FLOAT64,
    Case,
    Check,
    CheckFailed,
    Progress,
    SelfCheckFailed,
    close,
    describe,
    expect_number,
    expect_pair,
    expect_tensor,
    fail,
    find,
    generator_from,
    giveaways_used,
    hint,
    mismatch,
    normal,
    plural,
    portable,
    progress,
    record,
    recorded_names,
    self_check,
    verify_recorded,
    write_cases,
)

__all__ = ["CHECKS",  # noqa: F822 (given by __getattr__ below)
           "Case", "Check", "CheckFailed", "SelfCheckFailed", "self_check", "record", "verify_recorded",
           "recorded_names", "giveaways_used", "hint", "progress", "Progress", "find", "portable",
           "write_cases", "ANSWERS_VARIABLE", "CASES_FOLDER", "FLOAT64", "fail", "expect_tensor", "expect_number",
           "expect_pair",
           "describe", "close", "mismatch", "plural", "generator_from", "normal"]


def __getattr__(name: str):
    # CHECKS is looked up when first asked for, not at import: a chapter's catalogue may then import
    # its helpers from here while the registry is loading it, whichever of the two is imported first.
    if name == "CHECKS":
        from .grading.registry import CHECKS
        return CHECKS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
