"""Moved to :mod:`icl_course.grading.exercises`; ``python -m icl_course.exercises`` still works."""

import sys

from .grading.exercises import (  # noqa: F401
    UNFINISHED,
    GenerationError,
    generate,
    main,
    mark_cells,
    run_nbgrader,
    source_copy,
    task_points,
)

if __name__ == "__main__":
    sys.exit(main())
