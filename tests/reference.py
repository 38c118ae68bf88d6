"""Slow, literal implementations of the course's formulas, used only to check the package."""

import torch


def attention_layer_by_the_formula(tokens, P, Q):
    """One layer, token by token and head by head (Vladymyrov et al. 2024, eq. 3):
    e_i <- e_i + sum_k sum_{j <= n} (e_j^T Q_k e_i) P_k e_j, the query (last token) never read.

    tokens (B, n+1, D); P, Q (H, D, D).
    """
    B, T, _ = tokens.shape
    n = T - 1
    out = tokens.clone()
    for b in range(B):
        for i in range(T):
            delta = torch.zeros_like(tokens[b, i])
            for k in range(P.shape[0]):
                for j in range(n):
                    e_i, e_j = tokens[b, i], tokens[b, j]
                    delta = delta + (e_j @ Q[k] @ e_i) * (P[k] @ e_j)
            out[b, i] = tokens[b, i] + delta
    return out
