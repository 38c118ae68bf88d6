"""Exercises and their grading.

* :mod:`icl_course.grading.checking`: what a check is (``Check``, ``Case``, ``CheckFailed``) and the
  helpers a catalogue builds its checks from; it imports nothing else of this package;
* :mod:`icl_course.grading.protocol`: how a check runs (``self_check``, ``record``, ``hint``,
  ``progress``, ``verify_recorded``), over the registry;
* :mod:`icl_course.grading.chapter1`, ``chapter2``, ``chapter3``, ``chapter5``: each chapter's
  catalogue of checks, ``chapter_N_checks()``, verified against the package's reference functions;
* :mod:`icl_course.grading.registry`: ``CHECKS``, every check by name, built from the chapters in
  ``registry.CHAPTERS`` (registering a chapter is one number there);
* :mod:`icl_course.grading.exercises`: the learners' notebooks generated from the answer keys by
  nbgrader (``make exercises``);
* :mod:`icl_course.grading.grade`: ``icl-course grade``, which runs a class's notebooks under
  nbgrader and decides the points outside the learners' kernels.

The notebooks themselves import :mod:`icl_course.checks`, a thin and stable front for the learner's functions.
"""
