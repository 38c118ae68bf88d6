"""The ``icl-course`` command: ``icl-course grade SUBMISSIONS_DIR --out DIR`` (see :mod:`icl_course.grading.grade`)."""

import sys


def main(argv=None) -> int:
    """Dispatch ``icl-course <command> ...``; the one command today is ``grade``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: icl-course grade SUBMISSIONS_DIR --out DIR [options]\n\n"
              "  grade    grade a class's exercise notebooks (icl-course grade --help)")
        return 0 if argv else 2
    if argv[0] != "grade":
        print(f"icl-course: unknown command {argv[0]!r}; the command is 'grade'", file=sys.stderr)
        return 2
    from .grading.grade import main as grade_main
    return grade_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
