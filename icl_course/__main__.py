"""The ``icl-course`` command: ``icl-course grade SUBMISSIONS_DIR --out DIR`` (see :mod:`icl_course.grading.grade`)
and ``icl-course table1 --budget quick --out DIR`` (see :mod:`icl_course.table1`)."""

import sys


def main(argv=None) -> int:
    """Dispatch ``icl-course <command> ...``: ``grade`` or ``table1``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: icl-course grade SUBMISSIONS_DIR --out DIR [options]\n"
              "       icl-course table1 --budget {quick,cpu,gpu,paper} --device auto --out DIR\n\n"
              "  grade    grade a class's exercise notebooks (icl-course grade --help)\n"
              "  table1   reproduce Table 1 of Vladymyrov et al. 2024 (icl-course table1 --help)")
        return 0 if argv else 2
    if argv[0] == "table1":
        from .table1.cli import main as table1_main
        return table1_main(argv[1:])
    if argv[0] != "grade":
        print(f"icl-course: unknown command {argv[0]!r}; the commands are 'grade' and 'table1'", file=sys.stderr)
        return 2
    from .grading.grade import main as grade_main
    return grade_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
