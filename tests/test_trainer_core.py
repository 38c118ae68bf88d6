import math

import pytest
import torch

from icl_course import RegressionTasks, UniformNoise
from icl_course.models import LinearTransformer
from icl_course.sweep import ModelStack
from icl_course.train import learning_rate_factor
from icl_course.trainer_core import AdamState, adam_step, schedule_factor, spiked


def stack_and_loss(seed=0):
    """A stack of two float64 diag models and its loss on one fixed batch per model."""
    models = [LinearTransformer(4, 2, 1, "diag", init_scale=0.3, seed=seed + k, dtype=torch.float64, device="cpu")
              for k in range(2)]
    stack = ModelStack(models, dtype=torch.float64, device="cpu")
    batch = RegressionTasks(4, 8, UniformNoise(1), dtype=torch.float64).sample(16, seed=3)
    tokens = torch.cat([batch.X, batch.y.unsqueeze(-1)], dim=-1)
    gram = (tokens.transpose(-1, -2) @ tokens).expand(2, -1, -1, -1)

    def loss():
        return 0.5 * ((stack.final_weights(gram) - batch.w) ** 2).sum(-1).mean(-1)    # (2,)
    return stack, loss


@pytest.mark.parametrize("steps", [1, 5])
def test_the_stack_adam_step_is_torch_adam_for_every_model(steps):
    stack, loss = stack_and_loss()
    reference = {name: value.detach().clone().requires_grad_(True) for name, value in stack.params.items()}
    rates = torch.tensor([1e-2, 3e-3], dtype=torch.float64)
    optimizers = [torch.optim.Adam([reference[name] for name in reference], lr=float(rate)) for rate in rates]
    state = AdamState.zeros(stack.params)
    for _ in range(steps):
        for value in stack.params.values():
            value.grad = None
        loss().sum().backward()
        grads = {name: value.grad.clone() for name, value in stack.params.items()}
        updates, state = adam_step(grads, state, rates, torch.tensor([True, True]))
        with torch.no_grad():
            for name, value in stack.params.items():
                value.sub_(updates[name])
        for index, optimizer in enumerate(optimizers):
            optimizer.zero_grad()
            for name, value in reference.items():        # each model's own gradient, as torch's Adam sees it
                value.grad = torch.zeros_like(value)
                value.grad[index] = grads[name][index]
            mine = {name: value.detach()[1 - index].clone() for name, value in reference.items()}
            optimizer.step()
            with torch.no_grad():                        # the other model is not this optimiser's to move
                for name, value in reference.items():
                    value[1 - index] = mine[name]
    for name, value in stack.params.items():
        torch.testing.assert_close(value.detach(), reference[name].detach(), rtol=1e-12, atol=1e-15)
    assert torch.equal(state.steps, torch.full((2,), float(steps), dtype=torch.float64))


def test_a_masked_model_keeps_its_weights_and_its_state():
    stack, loss = stack_and_loss()
    loss().sum().backward()
    grads = {name: value.grad.clone() for name, value in stack.params.items()}
    state = AdamState.zeros(stack.params)
    updates, after = adam_step(grads, state, torch.tensor([1e-2, 1e-2], dtype=torch.float64),
                               torch.tensor([True, False]))
    for name in grads:
        assert torch.all(updates[name][1] == 0) and updates[name][0].abs().sum() > 0
        assert torch.all(after.moments[name][1] == 0) and torch.all(after.squares[name][1] == 0)
    assert after.steps.tolist() == [1.0, 0.0] and state.steps.tolist() == [0.0, 0.0]   # pure: the input is kept


def test_one_schedule_for_both_trainers():
    steps = torch.arange(100, dtype=torch.float64)
    total, warmup = torch.full_like(steps, 100), torch.full_like(steps, 10)
    cosine = schedule_factor(steps, total, warmup, torch.ones(100, dtype=torch.bool))
    assert cosine[:10].tolist() == [(k + 1) / 10 for k in range(10)] and cosine[10] == 1.0
    assert cosine[55] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert [learning_rate_factor(k, 100, "cosine", 10) for k in range(100)] == cosine.tolist()
    ending = schedule_factor(steps, total, warmup, torch.ones(100, dtype=torch.bool), final_fraction=0.1)
    assert ending[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 89 / 90)))
    constant = schedule_factor(steps, total, warmup, torch.zeros(100, dtype=torch.bool))
    assert torch.equal(constant[10:], torch.ones(90, dtype=torch.float64))


def test_the_spike_rule_flags_non_finite_and_large_losses_only():
    losses = torch.tensor([1.0, 150.0, math.nan, math.inf, 5.0], dtype=torch.float64)
    reference = torch.tensor([1.0, 1.0, 1.0, 1.0, math.nan], dtype=torch.float64)
    assert spiked(losses, reference, 100.0).tolist() == [False, True, True, True, False]
    assert spiked(losses, reference, math.inf).tolist() == [False, False, True, True, False]
