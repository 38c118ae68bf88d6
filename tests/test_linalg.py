"""Singular systems are detected by the package, the same way on every CPU and BLAS."""

import pytest
import torch

from icl_course import RegressionTasks, least_squares, ridge
from icl_course.linalg import condition_estimate, singular_mask, solve_positive_definite, symmetric_eigh


def _with_spectrum(eigenvalues, seed=0):
    """A symmetric matrix ``V diag(eigenvalues) V^T`` with a random orthogonal ``V`` (float64)."""
    generator = torch.Generator().manual_seed(seed)
    d = len(eigenvalues)
    V, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return V @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ V.T


def test_the_estimate_is_within_a_factor_d_of_the_condition_number():
    generator = torch.Generator().manual_seed(1)
    for d in (2, 5, 10):
        X = torch.randn(200, d + 3, d, generator=generator, dtype=torch.float64)
        matrices = X.transpose(1, 2) @ X
        exact = torch.linalg.cond(matrices)
        estimate, factor = condition_estimate(matrices)
        assert (estimate >= exact / d * (1 - 1e-9)).all() and (estimate <= exact * d * (1 + 1e-9)).all()
        torch.testing.assert_close(factor @ factor.transpose(1, 2), matrices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rank_deficient_matrices_are_singular_in_either_dtype(dtype):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, 1, 4, generator=generator, dtype=dtype)
    duplicated = x.expand(3, 5, 4)                               # five copies of one example: rank 1
    assert singular_mask(duplicated.transpose(1, 2) @ duplicated).all()
    collinear = torch.cat([x, 2 * x, torch.randn(3, 3, 4, generator=generator, dtype=dtype)], dim=1)
    collinear[..., -1] = collinear[..., 0] - collinear[..., 1]  # one input is a combination of two others
    assert singular_mask(collinear.transpose(1, 2) @ collinear).all()


def test_the_threshold_separates_singular_from_ill_conditioned_but_solvable():
    well_posed = _with_spectrum([1.0, 0.3, 1e-8])               # kappa = 1e8: float64 solves it
    nearly_singular = _with_spectrum([1.0, 0.3, 1e-17])         # below float64's resolution
    assert not singular_mask(well_posed) and singular_mask(nearly_singular)
    right = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    solution = solve_positive_definite(well_posed, right, "test")
    assert torch.linalg.norm(well_posed @ solution - right) < 1e-6 * torch.linalg.norm(right)
    assert singular_mask(well_posed.float())                    # the same matrix is singular in float32
    with pytest.raises(ValueError, match="singular in torch.float32 for 1 of 1 tasks.*try float64"):
        solve_positive_definite(well_posed.float(), right.float(), "test")


def test_indefinite_and_zero_matrices_are_refused():
    assert singular_mask(torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64))
    assert singular_mask(torch.zeros(2, 2, dtype=torch.float64))


def test_solutions_match_a_direct_solve_on_random_tasks():
    batch = RegressionTasks(6, 15, 0.5, dtype=torch.float64, device="cpu").sample(64, seed=3)
    direct = torch.linalg.solve(batch.Sigma + 0.7 * torch.eye(6, dtype=torch.float64), batch.alpha.unsqueeze(-1))
    torch.testing.assert_close(ridge(batch.X, batch.y, 0.7), direct.squeeze(-1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(least_squares(batch.X, batch.y),
                               torch.linalg.lstsq(batch.X, batch.y.unsqueeze(-1)).solution.squeeze(-1),
                               rtol=1e-9, atol=1e-11)


def test_one_singular_task_in_a_large_batch_is_named():
    batch = RegressionTasks(4, 8, 0.0, dtype=torch.float64, device="cpu").sample(100, seed=4)
    X, y = batch.X.clone(), batch.y.clone()
    X[17] = X[17, :1].expand(8, 4)
    with pytest.raises(ValueError, match="least squares: .*singular in torch.float64 for 1 of 100 tasks"):
        least_squares(X, y)


def test_symmetric_eigh_in_chunks_equals_one_call_with_any_batch_shape():
    generator = torch.Generator().manual_seed(0)
    A = torch.randn(2, 1500, 12, 5, generator=generator, dtype=torch.float64)
    S = A.transpose(-1, -2) @ A                                                   # (2, 1500, 5, 5)
    values, vectors = symmetric_eigh(S, chunk_size=700)                            # 5 chunks, the last one short
    assert values.shape == (2, 1500, 5) and vectors.shape == (2, 1500, 5, 5)
    reference_values, reference_vectors = torch.linalg.eigh(S)
    assert torch.allclose(values, reference_values, rtol=1e-12, atol=1e-12)
    # eigenvectors are defined up to sign: compare the decomposition they give back
    rebuilt = vectors @ torch.diag_embed(values) @ vectors.transpose(-1, -2)
    assert torch.allclose(rebuilt, S, rtol=1e-10, atol=1e-10)
    assert torch.allclose(symmetric_eigh(S, eigenvectors=False, chunk_size=700), reference_values,
                          rtol=1e-12, atol=1e-12)
    assert torch.all(values[..., 1:] >= values[..., :-1])                          # ascending, as torch's


def test_symmetric_eigh_takes_a_batch_a_gpu_solver_refuses_in_one_call():
    """cuSOLVER's batched solver (torch 2.11, CUDA 13, H100) fails from about 65 000 matrices per call."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the batch cuSOLVER refuses in one call is not met on a CPU")
    generator = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(100_000, 20, 10, generator=generator, device="cuda", dtype=torch.float64)
    S = A.transpose(-1, -2) @ A
    values = symmetric_eigh(S, eigenvectors=False)
    assert values.device.type == "cuda"
    assert torch.allclose(values.cpu(), torch.linalg.eigvalsh(S.cpu()), rtol=1e-9, atol=1e-9)
