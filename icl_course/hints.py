"""Hints for the graded exercises, opened one at a time with ``checks.hint("name")``.

Each task has a few hints, in order: the first points the way, the middle ones narrow it down, the
last one nearly gives the answer.  They live here, beside the checks, rather than in the notebooks,
so that a learner sees only as much as they ask for.
"""

from __future__ import annotations

HINTS: dict[str, tuple[str, ...]] = {
    # chapter 1
    "merged_form": (
        "Write the score <W_Q e_i, W_K e_j> as one bilinear form e_j^T (something) e_i.",
        "<W_Q e_i, W_K e_j> = e_j^T W_K^T W_Q e_i, and the value path W_P W_V e_j is one matrix too.",
        "P = W_P W_V and Q = W_K^T W_Q.",
    ),
    "linear_attention": (
        "Pull everything that does not depend on i out of the sum over j.",
        "sum_j (e_j^T Q e_i) P e_j = P (sum_j e_j e_j^T) Q e_i: one Gram matrix G = C^T C of the context tokens C.",
        "With tokens as rows (B, n+1, D): tokens + tokens @ (P @ G @ Q).transpose(1, 2), G from tokens[:, :-1].",
    ),
    "gd_matrices": (
        "One GD step from w_0 = 0 is w_1 = (eta / n) sum_i y_i x_i: the layer must put -<w_1, x> into the label slot.",
        "The label slot of token i receives p_y * (sum_j y_j x_j^T) Q_xx x_i when only P's last entry and Q's "
        "top-left block are non-zero.",
        "P[d, d] = -eta / n and Q[:d, :d] = identity; everything else zero (float64).",
    ),
    "transformer_prediction": (
        "Reuse your linear_attention: the same layer, applied num_layers times.",
        "Loop over layers (not over tasks), feeding each layer's output to the next.",
        "After the loop return minus the last coordinate of the query token: -tokens[:, -1, -1].",
    ),
    "best_step_size": (
        "w_1 = eta * (alpha / n) with alpha = X^T y: the loss (1/2) mean ||eta s - w||^2 is a quadratic in eta.",
        "Set its derivative in eta to zero, summing over the sampled tasks.",
        "eta = sum <s, w> / sum ||s||^2 with s = batch.alpha / n, over the tasks of the sample.",
    ),
    # chapter 2
    "fourth_moment": (
        "||x||^2 = z_1^2 + ... + z_d^2: square it and take expectations term by term.",
        "The d diagonal terms give E[z^4] = 3 each; the d(d - 1) cross terms give E[z_i^2] E[z_j^2] = 1.",
        "3d + d(d - 1) = d(d + 2).",
    ),
    "fourth_moment_monte_carlo": (
        "Draw num_samples vectors x with torch.randn(..., generator=torch.Generator().manual_seed(seed)).",
        "The values are ||x||^4 per draw; their mean estimates E||x||^4.",
        "Return (values.mean(), values.std() / sqrt(num_samples)) as floats.",
    ),
    "optimal_coefficient": (
        "(1/2) E||c alpha - w||^2 = (1/2)(c^2 E||alpha||^2 - 2c E<alpha, w> + E||w||^2): minimise in c.",
        "E<alpha, w> = nd, and E||alpha||^2 = nd(n + d + 1) + nd E[sigma^2] (a fourth moment of x appears).",
        "c* = E<alpha, w> / E||alpha||^2 = 1 / (n + d + 1 + second_moment).",
    ),
    "one_step_loss": (
        "The query's label is y_t = <w, x_t> and x_t ~ N(0, I) is independent of the context: average over x_t first.",
        "E_x_t[(c <alpha, x_t> - <w, x_t>)^2] = ||c alpha - w||^2, so the loss is (1/2) E||c alpha - w||^2: "
        "expand it with the moments of task 2, for any c.",
        "(d/2) (1 - 2cn + c^2 n (n + d + 1 + second_moment)).",
    ),
    "bilinear_B": (
        "Write the query's new label slot for one head and keep only the terms that contain alpha = sum_i y_i x_i.",
        "Two terms: p_y alpha^T Q_xx x_t and (p_x^T alpha)(q_yx^T x_t); the prediction is minus the slot.",
        "B = -(p_y Q_xx^T + outer(q_yx, p_x)) with p_x = P[d, :d], p_y = P[d, d], Q_xx = Q[:d, :d], q_yx = Q[d, :d].",
    ),
    "optimal_preconditioner": (
        "The loss is a quadratic in B: expand (1/2) E[(<B alpha, x_t> - y_t)^2] and take the gradient in B.",
        "With W = X^T X: E[alpha alpha^T] = E[W W] + n E[sigma^2] S, and E[WW] follows from the hint with M = I.",
        "Setting the gradient to zero gives B = ((n + 1) S + (tr S + E[sigma^2]) I)^{-1}.",
    ),
    # chapter 3
    "implicit_step": (
        "Substitute x_i^l = M x_i + y_i u and y_i^l = a y_i - <w, x_i> into x' and y', then collect the "
        "coefficients of x_i and of y_i.",
        "x' = (I + T_xx)(M x + y u) + t_xy (a y - <w, x>): the x-part gives M, the y-part gives u.",
        "M' = M + T_xx M - t_xy w^T, u' = u + T_xx u + a t_xy, a' = (1 + t_yy) a + <t_yx, u>, "
        "w' = (1 + t_yy) w - M^T t_yx.",
    ),
    "gdpp_layers": (
        "Keep only the two extreme eigenvalues: the map is increasing, so they stay the extremes.",
        "Loop: gamma = 1 / (3 * largest), map both, count a layer, until largest / smallest - 1 <= eps.",
        "Return the number of GD++ layers + 1 (the final GD step); use float64.",
    ),
    "best_cosine": (
        "The best vector of the span is the orthogonal projection of the target onto the columns of X.",
        "Least squares gives the projection: X times the solution of min ||X c - target||.",
        "torch.linalg.lstsq(X, target.unsqueeze(-1)).solution gives c; return ||X c|| / ||target|| per task.",
    ),
    "newton_iterates": (
        "Start from M_0 = I / lambda_max(S) (torch.linalg.eigvalsh gives the eigenvalues in ascending order).",
        "Apply M <- M (2I - S M) num_steps times, keeping every iterate.",
        "torch.stack([M_0, M_1, ..., M_num_steps]) in S's dtype.",
    ),
    # chapter 4
    "noise_estimate": (
        "The noise is what no linear function of x explains: fit a linear model to each task's context and look "
        "at what the fit leaves over.",
        "The residuals y - X w_ols of the least-squares fit are noise that the fit has partly absorbed: d of their "
        "n degrees of freedom went into w_ols, so their squares sum to about (n - d) sigma^2.",
        "w_ols = torch.linalg.lstsq(X, y.unsqueeze(-1)).solution, (B, d, 1) for all tasks; the estimate is the sum "
        "of the squared residuals over the context divided by n - d, a variance (no square root).",
    ),
    "adjusted_loss_per_task": (
        "Two half squared errors per task: the learner's, 1/2 ||w_hat - w||^2, and the oracle ridge's.",
        "The oracle is ridge regression that knows each task's noise: it solves (Sigma + sigma^2 I) w = alpha with "
        "Sigma = X^T X and alpha = X^T y, every task with its own sigma.",
        "One batched torch.linalg.solve with sigma**2 reshaped to (B, 1, 1) gives w_oracle; return "
        "0.5 * ((w_hat - w)**2).sum(-1) - 0.5 * ((w_oracle - w)**2).sum(-1): the learner minus the oracle.",
    ),
    "diag_layer": (
        "Split the tokens into inputs x = tokens[..., :-1] and labels y = tokens[..., -1]; the sums read only the "
        "first n rows (the context), the update moves all n + 1.",
        "Sigma = X^T X, alpha = sum_i y_i x_i and lambda = sum_i y_i^2 over the context rows; as rows, Sigma x is "
        "x @ Sigma (Sigma is symmetric).",
        "new_x = x + w_xx * x @ Sigma + w_xy * y[..., None] * alpha[:, None]; new_y = y + w_yx * (x @ alpha) + "
        "w_yy * lambda[:, None] * y, both from the old x and y; then torch.cat them back.",
    ),
    "two_noise_weights": (
        "Expand -(1 + n sigma^2 w_yy) w_yx and substitute m = w_yy w_yx: two equations, linear in (w_yx, m).",
        "The rows of the system are (1, n sigma_k^2) and the right-hand sides -1 / (1 + sigma_k^2), for k = 1, 2: "
        "solve the 2 x 2 system (by hand or with torch.linalg.solve).",
        "w_yx = -(1 + s_1 + s_2) / ((1 + s_1)(1 + s_2)) and w_yy = -1 / (n (1 + s_1 + s_2)) with s_k = sigma_k^2: "
        "both negative, as floats.",
    ),
    "noise_posterior": (
        "Compute a log-likelihood per task and level, (B, K), and turn it into probabilities with a softmax over K.",
        "C_k = X X^T + sigma_k^2 I_n, shape (B, K, n, n) by broadcasting; log N(y; 0, C_k) = -1/2 (y^T C_k^-1 y + "
        "log det C_k) + a constant that is the same for every level.",
        "L = torch.linalg.cholesky(C); z = L^-1 y (torch.linalg.solve_triangular); log det C = 2 sum log diag L; "
        "torch.softmax(-0.5 * ((z**2).sum(-1) + log_det), dim=-1).",
    ),
    # chapter 5
    "cg_iterates": (
        "Batch everything over tasks: Sigma (B, d, d), gradients and directions (B, d), step sizes (B,).",
        "g_0 = -alpha, p_0 = -g_0; each step: a = ||g||^2 / p^T Sigma p, w += a p, g += a Sigma p, "
        "beta = ||g_new||^2 / ||g||^2, p = -g_new + beta p.",
        "A task that has converged has ||g|| = 0 and a 0/0 step: torch.nan_to_num turns it into 0.",
    ),
    "memformer_layer": (
        "Only the label row of Attn(Z) is non-zero: P keeps the last row, Q keeps the x-rows (through A).",
        "Z M Z^T drops the query; its label-times-input block is sum_i y_i x_i^T (shape (B, 1, d)).",
        "Label row of Attn = -(sum_i y_i x_i^T) A^T Z_x / n; then R = Attn + gamma R and Z = Z + alpha R.",
    ),
    "momentum_alpha_gamma": (
        "Write the Memformer's update w_{l+1} - w_l = alpha_l r_l with r_l = -grad + gamma_l r_{l-1}.",
        "Use alpha_{l-1} r_{l-1} = w_l - w_{l-1} and match the coefficients of -grad and of (w_l - w_{l-1}).",
        "alpha_l = eta_l and gamma_l = mu_l alpha_{l-1} / alpha_l (gamma_1 is never used: set it to 0).",
    ),
}
