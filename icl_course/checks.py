"""What the exercise notebooks import: ``from icl_course import checks``.

The learner's functions: ``checks.self_check(name, f)``, ``checks.record(name, f)`` (hidden tests),
``checks.hint(name)`` and ``checks.progress(chapter)`` (:mod:`icl_course.grading.protocol`, the runtime).
What a check is and the helpers a catalogue builds it from are in :mod:`icl_course.grading.checking`;
``CHECKS``, every check by name, in :mod:`icl_course.grading.registry`: the grader's names, which this
module does not give.
"""

from .grading.protocol import Progress, SelfCheckFailed, hint, progress, record, self_check

# the learner's functions (what ``from icl_course.checks import *`` gives)
__all__ = ["self_check", "record", "hint", "progress", "SelfCheckFailed", "Progress"]
