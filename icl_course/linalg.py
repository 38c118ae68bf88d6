"""Symmetric positive-definite solves whose failures are detected here, not by LAPACK.

Whether ``torch.linalg.solve`` raises on a numerically singular matrix depends on the CPU's
kernels: one BLAS meets an exact zero pivot and raises, another divides by a pivot of
``1e-17`` and returns garbage.  The course's systems (``Sigma + ridge_lambda I``, a covariance)
are symmetric positive semi-definite, so the package decides singularity itself from a
condition-number estimate in the working dtype, and the answer is the same on every machine.

The estimate comes from the Cholesky factor ``A = L L^T``: with ``D = max_i A_ii``,

    D <= ||A||_2 <= d D   and   ||A^-1||_2 <= ||L^-1||_F^2 <= d ||A^-1||_2,

so ``D ||L^-1||_F^2`` lies within a factor ``d`` of the condition number ``kappa(A)``.

The batched symmetric eigensolvers go through :func:`symmetric_eigh`: on a GPU, cuSOLVER's batched
routine (torch 2.11, CUDA 13, H100) fails with an internal error from about 65 000 matrices in one call
and takes about half a megabyte of workspace per 10 x 10 matrix, so large batches are cut into chunks.
"""

from __future__ import annotations

import torch

__all__ = ["condition_estimate", "singular_mask", "solve_positive_definite", "symmetric_eigh"]

#: matrices per eigensolver call; 8192 needs about 5 GiB of cuSOLVER workspace at d = 10 in float64
EIGH_CHUNK = 8192


def condition_estimate(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An estimate of ``kappa(A)`` within a factor ``d``, and the Cholesky factor ``L``.

    Shapes: ``matrix`` (..., d, d) symmetric -> ((...), (..., d, d)).  A matrix whose
    factorisation breaks down (not positive definite in the working precision) gets ``inf``.
    """
    factor, info = torch.linalg.cholesky_ex(matrix)
    identity = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    inverse_factor = torch.linalg.solve_triangular(factor, identity.expand_as(factor), upper=False)
    largest_diagonal = matrix.diagonal(dim1=-2, dim2=-1).amax(-1)
    estimate = (inverse_factor**2).sum((-2, -1)) * largest_diagonal
    broken = (info != 0) | ~torch.isfinite(estimate) | (largest_diagonal <= 0)
    return torch.where(broken, torch.full_like(estimate, float("inf")), estimate), factor


def singular_mask(matrix: torch.Tensor) -> torch.Tensor:
    """True where a symmetric positive semi-definite matrix is singular in its working precision.

    The threshold is ``kappa_estimate >= 1 / (d eps)``, ``eps`` the dtype's machine epsilon: an
    exactly rank-deficient matrix lands far above it on any BLAS, while a well-posed one
    (``kappa`` up to about ``1 / (d^2 eps)``, i.e. 4e13 in float64 and 8e4 in float32 at d = 10)
    stays below.  Shapes: (..., d, d) -> (...).
    """
    return _beyond_precision(condition_estimate(matrix)[0], matrix)


def _beyond_precision(estimate: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    return estimate * (matrix.shape[-1] * torch.finfo(matrix.dtype).eps) >= 1


def solve_positive_definite(matrix: torch.Tensor, right: torch.Tensor, method: str) -> torch.Tensor:
    """``A^-1 b`` for a batch of symmetric positive-definite ``A``, or a clear ``ValueError``.

    Shapes: ``matrix`` (..., d, d), ``right`` (..., d, k) -> (..., d, k).  ``method`` names the
    caller in the message.
    """
    estimate, factor = condition_estimate(matrix)
    singular = _beyond_precision(estimate, matrix)
    if bool(singular.any()):
        count, total = int(singular.sum()), singular.numel()
        hint = (" In float32 a system this ill-conditioned loses every digit: try float64."
                if matrix.dtype in (torch.float32, torch.float16, torch.bfloat16) else "")
        raise ValueError(
            f"{method}: Sigma (+ ridge_lambda I) is singular in {matrix.dtype} for {count} of {total} tasks "
            "(its condition number is beyond 1 / (d * machine epsilon)), e.g. when the inputs are linearly "
            f"dependent or n < d with ridge_lambda = 0; use a positive ridge_lambda.{hint}"
        )
    return torch.cholesky_solve(right, factor)


def symmetric_eigh(matrix: torch.Tensor, eigenvectors: bool = True, chunk_size: int = EIGH_CHUNK):
    """``torch.linalg.eigh`` (or ``eigvalsh`` when ``eigenvectors`` is False) of a batch of symmetric matrices,
    ``chunk_size`` matrices per call, so that a GPU's batched solver is never handed more than it can take.

    Shapes: ``matrix`` (..., d, d) -> eigenvalues (..., d) in ascending order, and with ``eigenvectors`` the
    eigenvectors (..., d, d) as columns.  Each matrix is decomposed on its own, so the chunks change nothing.
    """
    solve = torch.linalg.eigh if eigenvectors else torch.linalg.eigvalsh
    batch_shape, d = matrix.shape[:-2], matrix.shape[-1]
    flat = matrix.reshape(-1, d, d)
    if flat.shape[0] <= chunk_size:
        return solve(matrix)
    parts = [solve(part) for part in flat.split(chunk_size)]
    if not eigenvectors:
        return torch.cat(parts).reshape(*batch_shape, d)
    return (torch.cat([part[0] for part in parts]).reshape(*batch_shape, d),
            torch.cat([part[1] for part in parts]).reshape(*batch_shape, d, d))
