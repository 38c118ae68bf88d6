"""Table 1 of Vladymyrov et al. (2024) by one command: ``icl-course table1 --budget quick --out DIR``.

The table compares linear transformers of depth 1 to 7 (GD++, Diag and Full, one head) with three
noise-adaptive ridge baselines on ten mixed-noise problems (``d = 10``, ``n = 20``): uniform
``sigma ~ U(0, sigma_max)`` for ``sigma_max = 0..7`` and categorical ``sigma`` in ``{1, 3}`` or
``{1, 3, 5}``.  Every number is an *adjusted* loss, the loss minus that of the ridge regression told
each task's ``sigma``.

What :func:`run_table1` does, and what it writes under ``out``:

1. trains every (variant, depth, column, seed) model of the budget with :func:`~icl_course.sweep.train_sweep`
   (one stack per variant and depth; a deeper model may start from the trained shallower one with a
   fresh last layer); each model is saved under ``models/`` the moment it finishes.  A depth with
   ``unclipped_steps`` then goes on without gradient clipping or the spike rule at a low constant rate,
   the phase that removes the heavy tails of deep models (clipping mutes the rare ill-conditioned tasks
   whose gradient would tame them); with ``nested_init``, Diag instead starts from the trained GD++
   model of its cell and Full from Diag (:func:`~icl_course.models.widen`), and trains only that phase,
   at ``nested_learning_rate`` where the budget gives one for the variant (``nested_init=("full",)``
   nests Full alone: Diag then trains both phases from random weights);
   a depth with ``deepen`` (a :class:`Deepening`) adds candidates that start from the trained model one
   layer shallower (its first seed's, or the one that shallower cell keeps) with a pass-through layer
   inserted (:func:`~icl_course.models.deepen`), and the variants nested above them follow; a depth
   without seeds trains only those; with ``noiseless_fit`` (a :class:`NoiselessFit`), the noiseless
   column's cells at its depths also get a light-tailed GD++ fitted on its exact loss
   (:mod:`~icl_course.table1.noiseless`), as a GD++, Diag and Full candidate; with ``widened_candidates``
   (every named budget), each Diag (Full) cell also gets the model its GD++ (Diag) cell keeps, widened to
   the same function (``...-widened``);
2. tunes ConstRR and TunedRR on one sample per column, keeps the best candidate (seed or start) of each
   cell on that sample (for a cell of 3 layers or more: on ``eval_tasks_deep`` tasks of it, and among the
   candidates whose standard error there is at most 2% of their mean, if any: the others have heavy
   tails; in the noiseless column on stretched tasks, and first among the candidates that pass the table's
   heavy-tail test on a plain million), then keeps the widened model instead unless that best trained
   candidate is lower by more than one standard error of their paired difference
   (:func:`keeps_widened`), and scores models and baselines on a fresh sample, paired with the
   oracle on the very same tasks (``evaluation/``), in chunks;
3. writes ``results.json``, ``results.csv``, ``table.md`` (each of our numbers beside the paper's),
   ``models.pt`` (every selected model in one file) and, from the command, ``figure.png`` (adjusted loss
   against depth, :func:`icl_course.plots.plot_table1`);
   ``results.json`` also records the configuration and ``seconds``, the wall time of every call on
   ``out`` that got this far.

Killed at any moment and run again with the same ``out``, it redoes no finished model or column and
loses at most ``checkpoint_every`` steps of a stack in training.  ``out`` remembers its configuration
(``config.json``) and refuses a run with another.
With ``--jobs N`` (:func:`run_in_jobs`) the command trains in ``N`` processes side by side (faster on a GPU,
where one stack of tiny models leaves it mostly idle) and scores the merged folder (:func:`merge_runs`).

The package's modules, from the bottom up: :mod:`~icl_course.table1.paper` (the paper's numbers),
:mod:`~icl_course.table1.budget` (budgets and the plan of a stack), :mod:`~icl_course.table1.files`,
:mod:`~icl_course.table1.training`, :mod:`~icl_course.table1.select`, :mod:`~icl_course.table1.report`,
:mod:`~icl_course.table1.run` and the command, :mod:`~icl_course.table1.cli` (which alone draws).
"""

from .budget import BUDGETS, Budget, Deepening, StackPlan, Table1Error, check_run, column_noise, plan_stack
from .candidate import Candidate
from .noiseless import NoiselessFit
from .paper import (
    BASELINES,
    COLUMN_IDS,
    COLUMNS,
    PAPER,
    PAPER_BASELINES,
    VARIANTS,
    D,
    N,
    cell_name,
    model_name,
    paper_rounding,
)
from .report import SHIPPED, load_results, load_table1_model, markdown_table
from .run import job_groups, merge_runs, run_in_jobs, run_table1
from .select import keeps_widened, pick_candidate
from .training import append_layer

__all__ = ["PAPER", "PAPER_BASELINES", "COLUMNS", "COLUMN_IDS", "VARIANTS", "BASELINES", "BUDGETS", "SHIPPED", "D",
           "N", "Budget", "Deepening", "NoiselessFit", "StackPlan", "Candidate", "Table1Error", "column_noise",
           "model_name", "cell_name", "paper_rounding", "check_run", "plan_stack", "pick_candidate", "keeps_widened",
           "append_layer", "run_table1",
           "run_in_jobs", "job_groups", "merge_runs", "load_results", "load_table1_model", "markdown_table"]

