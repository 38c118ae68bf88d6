"""Moved to :mod:`icl_course.grading.grade`; ``python -m icl_course.grade`` still works."""

import sys

from .grading.grade import AnswerKey, Submission, find_submissions, grade, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
