"""Training the models of a Table 1 run, stack by stack, with every finished model on disk at once.

Each (depth, variant) is one stack of :func:`~icl_course.sweep.train_sweep`, trained from its plan
(:func:`~icl_course.table1.budget.plan_stack`).  A depth with ``unclipped_steps`` trains in two phases: the
clipped phase writes ``models/NAME.clipped.pt`` and the unclipped phase continues from it into
``models/NAME.pt`` (a model widened from its smaller variant trains only the second).  Either phase
resumes from its own sweep checkpoint under ``sweeps/``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from ..checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from ..models import NESTED, LinearTransformer, deepen, widen
from ..sweep import ModelSpec, SweepResult, train_sweep
from .budget import (
    BUDGETS,
    Budget,
    PlannedModel,
    StackPlan,
    Table1Error,
    clipped_steps,
    column_noise,
    naming_seed,
    plan_stack,
)
from .candidate import Candidate
from .noiseless import CheckTasks, FitTasks, deeper_starts, gdpp_model, gdpp_weights, light_tailed_fit
from .paper import VARIANTS, D, N, model_name
from .select import WIDENED, cell_choice, newer_than

#: a model whose clipped phase breaks the spike rule ``patience`` steps in a row goes back to its last healthy
#: logging window at half its rate, up to this many times, before it counts as diverged
#: (:func:`~icl_course.sweep.train_sweep`): deepened noiseless models drift, now and then, to weights where
#: every batch breaks the rule, and a stopped candidate is a lost one (research/README.md)
SPIKE_RESTARTS = 3


def append_layer(model: LinearTransformer, seed: int, init_scale: float = 0.02) -> LinearTransformer:
    """``model`` (float64, CPU) with one more layer, freshly initialised with ``seed``, appended at the end."""
    config = model.config
    deeper = LinearTransformer(config["d"], config["num_layers"] + 1, config["num_heads"], config["parameterization"],
                               init_scale, seed=seed, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        for source, target in zip(model.layers, deeper.layers):
            for name, value in source.named_parameters():
                getattr(target, name).copy_(value.double())
    return deeper


def load_trained(path: Path, variant: str, depth: int, key: dict) -> tuple[LinearTransformer, dict]:
    """A trained model and its metadata; refused when it was trained with another :meth:`ModelSpec.key`."""
    checkpoint = load_checkpoint(path, device="cpu", num_layers=depth, parameterization=variant)
    saved = checkpoint.metadata.get("spec")
    if saved is not None and saved != key:
        raise CheckpointError(f"{path} was trained with another configuration ({saved} instead of {key}); "
                              "delete it, or pass a new --out")
    return checkpoint.model, checkpoint.metadata


def model_spec(planned: PlannedModel, variant: str, done: dict[str, Candidate]) -> ModelSpec:
    """The sweep's spec of a planned model, with the weights it starts from."""
    init = None
    if planned.start == "grown":
        init = append_layer(done[planned.source].model, planned.seed)
    elif planned.start == "deepened":
        init = deepen(done[planned.source].model, planned.position)
    elif planned.start == "widened":
        init = widen(done[planned.source].model, variant)
    return ModelSpec(planned.name, column_noise(planned.column), seed=planned.seed, num_steps=planned.num_steps,
                     learning_rate=planned.learning_rate, warmup_steps=planned.warmup_steps,
                     schedule=planned.schedule, init=init)


def stale_suffix(count: int) -> str:
    """The file ending of a model set aside because its start changed: ``.stale.pt``, then ``.stale-2.pt``, ..."""
    return ".stale.pt" if count == 1 else f".stale-{count}.pt"


class Progress:
    """The run's one progress bar over every stack's steps (or none)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc="Table 1", dynamic_ncols=True, unit="step")
        self.shown = 0

    def stack(self, label: str) -> Callable:
        """A ``progress(step, losses)`` callback for one sweep; counts its steps from 0."""
        self.shown = 0

        def report(step, losses):
            if self.bar is not None:
                self.bar.update(step - self.shown)
                shown = " ".join(f"{value:.3g}" for value in list(losses.values())[:5])
                self.bar.set_postfix_str(f"{label}, {len(losses)} in flight, loss {shown}")
            self.shown = step
        return report

    def skip(self, steps: int) -> None:
        """Count steps no sweep reported (a stack finished before, or fewer steps than planned)."""
        if self.bar is not None:
            self.bar.update(max(0, steps))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class StackTrainer:
    """Trains the stacks of one run into ``out``; :meth:`train_all` returns every candidate."""

    def __init__(self, out: Path, budget: Budget, variants, columns, device, progress: bool, log: Callable):
        self.out, self.budget, self.variants, self.columns = out, budget, variants, columns
        self.device, self.log = device, log
        self.candidates: dict[str, Candidate] = {}
        self.noiseless_tasks = None   # the fit's and the check's tasks of the noiseless column, drawn once
        stacks = [(depth, variant) for depth in budget.depths for variant in variants]
        self.progress = Progress(sum(clipped_steps(budget, depth, variant, variants)
                                     + budget.settings(depth)["unclipped_steps"] for depth, variant in stacks),
                                 progress)
        # a budget changed from a named one (or made by hand) cannot be rerun by its name alone
        self.command = f"icl-course table1 --budget {budget.name}" if BUDGETS.get(budget.name) == budget \
            else f"run_table1 with the budget {budget.name!r} recorded in config.json"

    def train_all(self) -> dict[str, Candidate]:
        """Train every model not yet on disk, depth by depth; returns ``{name: Candidate}``."""
        try:
            for depth in self.budget.depths:
                # a variant that nests from the model its smaller cell keeps trains after that choice is final:
                # after the fit and the widened candidates the smaller cell is offered
                late = [variant for variant in self.variants if self.nests_from_kept(depth, variant)]
                for variant in self.variants:
                    if variant not in late:
                        self.train_stack(depth, variant)
                self.fit_noiseless(depth)
                for variant in self.variants:
                    if variant not in late:
                        self.offer_widened(depth, variant)
                for variant in late:
                    self.train_stack(depth, variant)
                    self.offer_widened(depth, variant)
        finally:
            self.progress.close()
        return self.candidates

    def shallower_choice(self, depth: int, variant: str) -> Optional[dict]:
        """``{column: name}`` of the candidate each shallower cell keeps, when the depth deepens from it."""
        deepening = self.budget.settings(depth)["deepen"]
        if deepening is None or deepening.start != "selected" or variant not in deepening.variants \
                or depth - 1 not in self.budget.depths:
            return None
        choice = {}
        for column in self.columns:
            cell = [candidate for candidate in self.candidates.values()
                    if (candidate.variant, candidate.depth, candidate.column) == (variant, depth - 1, column)]
            choice[column] = cell_choice(self.out, self.budget, column, f"{variant}-L{depth - 1}", cell,
                                         self.device)[0].name
        return choice

    def nests_from_kept(self, depth: int, variant: str) -> bool:
        """Whether ``variant`` starts, at ``depth``, from the model its smaller variant's cell keeps."""
        settings, position = self.budget.settings(depth), NESTED.index(variant)
        return bool(position) and settings["nest_from"] == "selected" and variant in settings["nested_init"] \
            and NESTED[position - 1] in self.variants

    def smaller_choice(self, depth: int, variant: str) -> Optional[dict]:
        """``{column: name}`` of the candidate each cell of the smaller variant keeps, when ``variant`` nests
        from it at ``depth`` (picked as the evaluation picks it, widened and fitted candidates included)."""
        if not self.nests_from_kept(depth, variant):
            return None
        smaller, choice = NESTED[NESTED.index(variant) - 1], {}
        for column in self.columns:
            cell = [candidate for candidate in self.candidates.values()
                    if (candidate.variant, candidate.depth, candidate.column) == (smaller, depth, column)]
            if cell:
                choice[column] = cell_choice(self.out, self.budget, column, f"{smaller}-L{depth}", cell,
                                             self.device)[0].name
        return choice

    def unfinished_smaller(self, depth: int, variant: str) -> dict:
        """``{column: name}``: where a nested variant's smaller variant has candidates but none finished, the
        one its cell keeps (picked as the evaluation picks it), for the nested variant to start from."""
        position = NESTED.index(variant)
        if not position or variant not in self.budget.settings(depth)["nested_init"] \
                or NESTED[position - 1] not in self.variants:
            return {}
        smaller, choice = NESTED[position - 1], {}
        for column in self.columns:
            cell = [candidate for candidate in self.candidates.values()
                    if (candidate.variant, candidate.depth, candidate.column) == (smaller, depth, column)]
            if cell and not any(candidate.finished for candidate in cell):
                choice[column] = cell_choice(self.out, self.budget, column, f"{smaller}-L{depth}", cell,
                                             self.device)[0].name
        return choice

    def train_stack(self, depth: int, variant: str) -> None:
        """Plan, train (both phases) and load one stack's models."""
        done = {name for name, candidate in self.candidates.items() if candidate.finished}
        plan = plan_stack(self.budget, depth, variant, self.variants, self.columns, done,
                          self.shallower_choice(depth, variant), self.unfinished_smaller(depth, variant),
                          self.smaller_choice(depth, variant))
        for name, start in plan.unstarted.items():
            self.log(f"{name} is not trained: its start, {start}, did not finish")
        self.set_aside_stale(plan)
        specs = [model_spec(planned, variant, self.candidates) for planned in plan.models]
        final = {spec.name: self.out / "models" / f"{spec.name}.pt" for spec in specs}
        first = {name: path.with_name(f"{name}.clipped.pt") for name, path in final.items()} if plan.two_phases \
            else final
        widened = {planned.name: planned.source for planned in plan.models if planned.start == "widened"}
        self.train_clipped(plan, specs, first, final, widened)
        if plan.two_phases:
            self.train_unclipped(plan, specs, first, final, widened)
        for planned, spec in zip(plan.models, specs):
            model, metadata = load_trained(final[spec.name], variant, depth, spec.key())
            self.candidates[spec.name] = Candidate(spec.name, variant, depth, planned.column, spec.seed,
                                                   final[spec.name], model, metadata)

    def fit_noiseless(self, depth: int) -> None:
        """The light-tailed GD++ of the noiseless column at ``depth`` (:mod:`~icl_course.table1.noiseless`),
        fitted from the cell's trained GD++ candidates and from the GD++ its cell keeps one layer shallower and
        the fit there (one layer deeper), and offered, as the same function, to the GD++, Diag and Full cells of
        that depth (``{variant}-L{depth}-u0-s{seed}-fit``).
        A saved fit is read back while its starts are the same models and none was trained again since."""
        setting = self.budget.noiseless_fit
        if setting is None or depth not in setting.depths or "0" not in self.columns or "gdpp" not in self.variants:
            return
        seed = naming_seed(self.budget, depth - 1)
        names = {variant: f"{model_name(variant, depth, '0', seed)}-fit" for variant in self.variants}
        paths = {variant: self.out / "models" / f"{name}.pt" for variant, name in names.items()}

        def cell(at):
            return [candidate for candidate in self.candidates.values()
                    if (candidate.variant, candidate.depth, candidate.column) == ("gdpp", at, "0")]
        shallower = []   # none where the run does not train the depth above (``--depths 4``)
        if cell(depth - 1):
            kept = cell_choice(self.out, self.budget, "0", f"gdpp-L{depth - 1}", cell(depth - 1), self.device)[0]
            shallower = [kept] + [candidate for candidate in cell(depth - 1)
                                  if candidate.name.endswith("-fit") and candidate.name != kept.name]
        trained = [candidate for candidate in cell(depth) if candidate.finished and candidate.name != names["gdpp"]]
        sources = sorted(candidate.name for candidate in [*shallower, *trained])
        if not all(path.exists() for path in paths.values()) \
                or load_checkpoint(paths["gdpp"], device="cpu").metadata.get("fitted_from") != sources \
                or not newer_than(paths["gdpp"], [*shallower, *trained]):
            self.log(f"fitting the light-tailed noiseless GD++ of {depth} layers from {', '.join(sources)}")
            started = time.perf_counter()
            if self.noiseless_tasks is None:
                self.noiseless_tasks = (FitTasks(setting, seed=1200),
                                        CheckTasks(setting.check_tasks, seed=1300, samples=setting.check_samples))
            candidates = {candidate.name: gdpp_weights(candidate.model) for candidate in trained}
            candidates.update({f"{candidate.name}, {position}": weights for candidate in shallower
                               for position, weights in deeper_starts(gdpp_weights(candidate.model)).items()})
            best = light_tailed_fit(candidates, setting, *self.noiseless_tasks)
            if best is None:
                self.log(f"no light-tailed noiseless GD++ of {depth} layers was found; the cells keep their "
                         "trained candidates")
                return
            model = gdpp_model(best["weights"])
            metadata = {"status": "finished", "steps": setting.adam_steps + setting.rounds * setting.iterations,
                        "final_loss": best["mean"],
                        "wall_time": time.perf_counter() - started, "budget": self.budget.name, "device": "cpu",
                        "dtype": "float64", "command": self.command, "fitted_from": sources,
                        "fit": {key: value for key, value in best.items() if key != "weights"}}
            for variant in self.variants:
                save_checkpoint(paths[variant], model if variant == "gdpp" else widen(model, variant),
                                metadata=dict(metadata, widened_from=None if variant == "gdpp" else names["gdpp"]))
        for variant in self.variants:
            checkpoint = load_checkpoint(paths[variant], device="cpu", num_layers=depth, parameterization=variant)
            self.candidates[names[variant]] = Candidate(names[variant], variant, depth, "0", seed, paths[variant],
                                                        checkpoint.model, checkpoint.metadata)

    def offer_widened(self, depth: int, variant: str) -> None:
        """Give every Diag (Full) cell of ``depth`` the model its GD++ (Diag) cell keeps, widened to the same
        function, as one more candidate, ``{name of that model with this variant}-widened``
        (:func:`~icl_course.table1.select.keeps_widened` says when the cell keeps it).  A saved one is written
        again only when the smaller cell now keeps another model, or its model was trained again since."""
        position = NESTED.index(variant)
        if not self.budget.widened_candidates or not position or NESTED[position - 1] not in self.variants:
            return
        smaller = NESTED[position - 1]
        for column in self.columns:
            cell = [candidate for candidate in self.candidates.values()
                    if (candidate.variant, candidate.depth, candidate.column) == (smaller, depth, column)]
            if not cell:
                continue
            kept = cell_choice(self.out, self.budget, column, f"{smaller}-L{depth}", cell, self.device)[0]
            name = model_name(variant, depth, column, kept.seed) + WIDENED
            path = self.out / "models" / f"{name}.pt"
            if not path.exists() or load_checkpoint(path, device="cpu").metadata.get("widened_from") != kept.name \
                    or not newer_than(path, [kept]):
                metadata = {key: value for key, value in kept.metadata.items() if key != "spec"}
                save_checkpoint(path, widen(kept.model, variant), metadata=dict(metadata, widened_from=kept.name))
            checkpoint = load_checkpoint(path, device="cpu", num_layers=depth, parameterization=variant)
            self.candidates[name] = Candidate(name, variant, depth, column, kept.seed, path, checkpoint.model,
                                              checkpoint.metadata)

    def set_aside_stale(self, plan: StackPlan) -> None:
        """Rename the saved models of ``plan`` that no longer start where the plan says (``NAME.stale.pt``), so
        that they train again: a deepened model whose shallower cell now keeps another candidate, a nested one
        whose smaller cell does (``Budget.nest_from``), any model
        whose start was trained again after it, and a model the spike rule stopped before stopped models
        restarted (``SPIKE_RESTARTS``); nothing is deleted."""
        for planned in plan.models:
            final = self.out / "models" / f"{planned.name}.pt"
            saved = [path for path in (final, final.with_name(f"{planned.name}.clipped.pt")) if path.exists()]
            if not saved:
                continue
            metadata = load_checkpoint(saved[0], device="cpu").metadata
            why = None
            if metadata.get("status") == "diverged" and "restarts" not in metadata:
                why = "the spike rule stopped it, and stopped models now restart from their last good state"
            elif planned.source is None:
                continue
            elif (source := self.candidates[planned.source].path).exists() \
                    and source.stat().st_mtime > min(path.stat().st_mtime for path in saved):
                why = f"its start, {planned.source}, was trained again after it"
            elif planned.start == "deepened":
                recorded = metadata.get("deepened_from", "")
                if recorded and not recorded.startswith(f"{planned.source},"):
                    why = f"it was deepened from {recorded.split(',')[0]}, but the table now keeps {planned.source}"
            elif planned.start == "widened":
                recorded = metadata.get("widened_from")
                if recorded and recorded != planned.source:
                    why = f"it was nested from {recorded}, but the smaller cell now keeps {planned.source}"
            if why is None:
                continue
            count = 1   # an earlier stale copy is kept too: the new one gets the next free number
            while any(path.with_name(path.name[:-len(".pt")] + stale_suffix(count)).exists() for path in saved):
                count += 1
            for path in saved:
                path.replace(path.with_name(path.name[:-len(".pt")] + stale_suffix(count)))
            self.log(f"{planned.name} trains again: {why} (the old model is kept as "
                     f"{final.stem}{stale_suffix(count)})")

    def metadata(self, result: SweepResult, spec: ModelSpec, depth: int) -> dict:
        """What a model's checkpoint records about its training."""
        return {"spec": spec.key(), "status": result.status, "steps": result.steps,
                "final_loss": result.final_loss, "wall_time": result.wall_time,
                "skipped_steps": result.skipped_steps, "message": result.message,
                "restarts": [list(entry) for entry in result.restarts],
                "budget": self.budget.name, "device": str(self.device),
                "dtype": self.budget.settings(depth)["dtype"], "command": self.command, "history": result.history}

    def train_clipped(self, plan: StackPlan, specs, first: dict, final: dict, widened: dict) -> None:
        """The first phase (clipped, with the spike rule) of every model that has not passed it."""
        deepened = {planned.name: f"{planned.source}, a new layer before layer {planned.position}"
                    for planned in plan.models if planned.start == "deepened"}

        def finish(result, spec):
            metadata = self.metadata(result, spec, plan.depth)
            if result.name in deepened:
                metadata["deepened_from"] = deepened[result.name]
            save_checkpoint(first[result.name], result.model, metadata=metadata)

        missing = [spec for spec in specs if spec.name not in widened and not final[spec.name].exists()
                   and not first[spec.name].exists()]
        done = self.sweep(missing, first, plan, "clipped", finish) if missing else 0
        self.progress.skip(clipped_steps(self.budget, plan.depth, plan.variant, self.variants) - done)

    def train_unclipped(self, plan: StackPlan, specs, first: dict, final: dict, widened: dict) -> None:
        """The second phase: no clipping or spike rule, a constant low rate; a widened model's only phase."""
        rate = self.budget.unclipped_learning_rate
        clipped = {spec.name: load_trained(first[spec.name], plan.variant, plan.depth, spec.key())
                   for spec in specs if spec.name not in widened and not final[spec.name].exists()}
        second = [spec for spec in specs if spec.name in widened and not final[spec.name].exists()]
        for spec in specs:
            if spec.name not in clipped:
                continue
            model, metadata = clipped[spec.name]
            if metadata["status"] != "finished":   # nothing to polish: it goes on as it is
                save_checkpoint(final[spec.name], model, metadata=metadata)
                continue
            second.append(ModelSpec(spec.name, spec.noise, seed=spec.seed,
                                    num_steps=self.budget.settings(plan.depth)["unclipped_steps"],
                                    learning_rate=rate, schedule="constant", init=model))

        def finish(result, spec):
            if result.name in widened:
                metadata = dict(self.metadata(result, spec, plan.depth), widened_from=widened[result.name])
                save_checkpoint(final[result.name], result.model, metadata=metadata)
                return
            metadata = dict(clipped[result.name][1])
            offset = metadata["steps"]
            metadata.update(
                status=result.status, steps=offset + result.steps, final_loss=result.final_loss,
                wall_time=metadata["wall_time"] + result.wall_time, message=result.message,
                unclipped={"steps": result.steps, "learning_rate": rate, "clipped_final_loss": metadata["final_loss"]},
                history=metadata["history"] + [[offset + step, value] for step, value in result.history])
            save_checkpoint(final[result.name], result.model, metadata=metadata)

        done = self.sweep(second, final, plan, "unclipped", finish) if second else 0
        self.progress.skip(self.budget.settings(plan.depth)["unclipped_steps"] - done)

    def sweep(self, specs, paths: dict, plan: StackPlan, phase: str, finish: Callable) -> int:
        """One sweep: ``specs`` trained as one stack, ``finish(result, spec)`` writing each model that leaves;
        returns the steps it reported."""
        unclipped = phase == "unclipped"
        depth, variant = plan.depth, plan.variant
        label = f"{VARIANTS[variant]} L={depth}{', unclipped' if unclipped else ''}"
        started = time.perf_counter()
        sweep_file = self.out / "sweeps" / f"{variant}-L{depth}{'-unclipped' if unclipped else ''}.pt"
        by_name = {spec.name: spec for spec in specs}

        def saved(result):
            try:
                finish(result, by_name[result.name])
            except OSError as error:
                raise Table1Error(f"could not write {paths[result.name]} ({error.strerror or error}); "
                                  "finished models are kept. Free some disk space and rerun to resume.") from None

        report = self.progress.stack(label)
        # a sweep checkpoint written for another selection of models is stale: start that stack over
        try:
            train_sweep(specs, d=D, n=N, num_layers=depth, parameterization=variant,
                        batch_size=self.budget.batch_size, clip_norm=None if unclipped else self.budget.clip_norm,
                        spike_factor=math.inf if unclipped else 100.0, restarts=0 if unclipped else SPIKE_RESTARTS,
                        final_fraction=self.budget.final_fraction, dtype=self.budget.settings(depth)["dtype"],
                        device=self.device,
                        seed=1000 * depth + sorted(VARIANTS).index(variant) + (500 if unclipped else 0),
                        checkpoint=sweep_file, checkpoint_every=self.budget.checkpoint_every,
                        log_every=50, progress=report, on_leave=saved)
        except OSError as error:
            raise Table1Error(f"could not write the sweep checkpoint {sweep_file} "
                              f"({error.strerror or error}); finished models are kept. Free some disk "
                              "space and rerun to resume.") from None
        if sweep_file.exists():
            sweep_file.unlink()
        self.log(f"trained {label}: {len(specs)} models in {time.perf_counter() - started:.0f} s")
        return self.progress.shown

