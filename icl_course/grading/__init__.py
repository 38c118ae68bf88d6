"""Exercises and their grading, in three rooms.

* :mod:`icl_course.checks` (outside this package, because every exercise notebook imports it):
  the protocol a learner's notebook calls, ``self_check`` and ``record``, and the trusted checks;
* :mod:`icl_course.grading.exercises`: the learners' notebooks generated from the answer keys by
  nbgrader (``make exercises``);
* :mod:`icl_course.grading.grade`: ``icl-course grade``, which runs a class's notebooks under
  nbgrader and decides the points outside the learners' kernels.
"""
