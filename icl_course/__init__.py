"""icl_course: the package behind the course "In-context learning as optimisation".

One module per concept, each importable on its own:

* :mod:`icl_course.data`: the regression task, noise laws, samplers;
* :mod:`icl_course.models`: linear self-attention (``full``, ``diag``, ``gdpp``, ``gd``) and the GD construction;
* :mod:`icl_course.baselines`: learners of a TaskBatch: least squares, ridge, ConstRR/AdaRR/TunedRR, BayesOptimal;
* :mod:`icl_course.optimizers`: iterative methods on tensors, with their paths: GD, CG, momentum, Newton;
* :mod:`icl_course.theory`: closed forms;
* :mod:`icl_course.spectra`: the eigenvalue law of ``X^T X``, exactly, and the expected losses it decides (chapter 5);
* :mod:`icl_course.evaluate`: losses with standard errors;
* :mod:`icl_course.train`: training with checkpoints and resumption;
* :mod:`icl_course.sweep`, :mod:`icl_course.table1`: many models trained as one, and Table 1 of Vladymyrov et al.
  (2024) by one command; :mod:`icl_course.trainer_core`: the schedule, spike rule and Adam step they share;
* :mod:`icl_course.checkpoints`: saving and loading models;
* :mod:`icl_course.plots`, :mod:`icl_course.widgets`: figures and sliders for the notebooks;
* :mod:`icl_course.checks` and :mod:`icl_course.grading`: exercises and their grading.
"""

from .baselines import (
                        AdaRR,
                        BayesOptimal,
                        ConstRR,
                        TunedRR,
                        least_squares,
                        noise_variance_estimate,
                        oracle_ridge,
                        ridge,
)
from .checkpoints import CheckpointError, load_checkpoint, load_model, save_checkpoint
from .data import CategoricalNoise, FixedNoise, RegressionTasks, TaskBatch, UniformNoise, context_gram
from .evaluate import (
                        Estimate,
                        adjusted_loss,
                        adjusted_losses,
                        expected_loss,
                        loss_difference,
                        noise_profile,
                        per_layer_loss,
                        query_averaged_loss,
                        sampled_query_loss,
)
from .models import LinearSelfAttention, LinearTransformer, ModelOutput, deepen, gd_construction, widen
from .optimizers import conjugate_gradient, gradient_descent, newton_inverse, tune_step_sizes
from .runtime import make_generator, resolve_device, resolve_dtype
from .train import TrainingDiverged, TrainingHistory, train

__version__ = "0.1.0"
