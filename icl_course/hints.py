"""Hints for the graded exercises, opened one at a time with ``checks.hint("name")``.

Each task has a few hints, in order: the first points the way, the middle ones narrow it down, the
last one nearly gives the answer.  They live here, beside the checks, rather than in the notebooks,
so that a learner sees only as much as they ask for.
"""

from __future__ import annotations

HINTS: dict[str, tuple[str, ...]] = {
    # chapter 1
    "merged_form": (
        "Chapter 1's merged form: the score <W_Q e_i, W_K e_j> is a bilinear form in e_j and e_i, and the value "
        "path W_P W_V e_j is a linear map of e_j; find the one matrix behind each.",
        "An inner product <a, b> is a^T b, and (W_K e_j)^T = e_j^T W_K^T: write the score as e_j^T (one matrix) e_i.",
        "Q is the matrix between e_j^T and e_i in e_j^T W_K^T W_Q e_i, and P is the matrix that W_P (W_V e_j) "
        "applies to e_j: each is a product of two of the given matrices, in that order.",
    ),
    "linear_attention": (
        "Pull everything that does not depend on j out of the sum over j: e_j^T Q e_i is a number, so it can move "
        "past P e_j.",
        "(e_j^T Q e_i) P e_j = P e_j e_j^T Q e_i, so the sum is P G Q e_i with G = sum_{j <= n} e_j e_j^T, the "
        "Gram matrix of the n context tokens (the query left out).",
        "With the tokens as the rows of a (B, n+1, D) tensor, G = C^T C for the first n rows C, and each row e_i^T "
        "becomes e_i^T + e_i^T (P G Q)^T: one batched product moves every token, then add the residual.",
    ),
    "gd_matrices": (
        "Chapter 1's construction: one GD step from w_0 = 0 is w_1 = (eta / n) sum_i y_i x_i, and the layer must "
        "write -<w_1, x_t> into the query's label slot.",
        "The label slot of token i receives p_y (sum_j y_j x_j^T) Q_xx x_i when only P's last entry p_y and Q's "
        "top-left d x d block Q_xx are non-zero.",
        "Match p_y (sum_j y_j x_j)^T Q_xx x_t with -(eta / n) (sum_j y_j x_j)^T x_t for every x_t: that fixes Q_xx "
        "and p_y; every other entry of P and Q stays zero, all in float64.",
    ),
    "transformer_prediction": (
        "Chapter 1's result: L layers of the GD construction run L steps of GD, and your linear_attention is one "
        "such layer.",
        "Apply it num_layers times, feeding each layer's output to the next (a loop over layers, never over tasks "
        "or tokens).",
        "After the last layer, read the query token (the last token) in its label slot (the last coordinate); "
        "the construction stores minus the prediction there, one number per task.",
    ),
    "best_step_size": (
        "One GD step from w_0 = 0 is w_1 = eta alpha / n, so the mean loss (1/2) mean ||w_1 - w||^2 is a parabola "
        "in eta: its minimum has a closed form, no line search needed.",
        "With s = alpha / n for each task, the mean loss is (1/2) mean(eta^2 ||s||^2 - 2 eta <s, w> + ||w||^2): "
        "set its derivative in eta to zero.",
        "The best eta is the sum over the sampled tasks of <s, w> divided by the sum of ||s||^2, from the batch's "
        "alpha and w; return it as a Python float.",
    ),
    # chapter 2
    "fourth_moment": (
        "||x||^2 = z_1^2 + ... + z_d^2 is a sum of d independent chi^2_1 variables: square the sum and take "
        "expectations term by term.",
        "The square has d diagonal terms z_i^4 and d(d - 1) cross terms z_i^2 z_j^2 (i != j); independence "
        "factors each cross term.",
        "E[z^4] = 3 and E[z_i^2] E[z_j^2] = 1: add 3 for each of the d diagonal terms and 1 for each of the "
        "d(d - 1) cross terms, and factor the sum.",
    ),
    "fourth_moment_monte_carlo": (
        "Monte Carlo: the mean of many independent draws of ||x||^4 estimates E||x||^4, and the standard error "
        "of a mean of N draws is the draws' standard deviation over sqrt(N).",
        "Draw all num_samples vectors at once, one (num_samples, d) tensor from a torch.Generator seeded with "
        "seed, and compute ||x||^4 for every row.",
        "The estimate is the mean of the per-draw values, the standard error their standard deviation divided by "
        "sqrt(num_samples); return both as Python floats (.item()).",
    ),
    "optimal_coefficient": (
        "(1/2) E||c alpha - w||^2 = (1/2)(c^2 E||alpha||^2 - 2c E<alpha, w> + E||w||^2) is a quadratic in c: "
        "minimise it.",
        "Its minimiser is c* = E<alpha, w> / E||alpha||^2; E||alpha||^2 needs a fourth moment of x (task 1) and "
        "brings in the noise.",
        "E<alpha, w> = nd and E||alpha||^2 = nd(n + d + 1) + nd E[sigma^2]: divide, and the factor nd cancels.",
    ),
    "one_step_loss": (
        "The query's label is y_t = <w, x_t> and x_t ~ N(0, I) is independent of the context: average over x_t first.",
        "E_x_t[(c <alpha, x_t> - <w, x_t>)^2] = ||c alpha - w||^2, so the loss is (1/2) E||c alpha - w||^2: "
        "expand it with the moments of task 2, for any c.",
        "(1/2)(c^2 E||alpha||^2 - 2c E<alpha, w> + E||w||^2) with E||w||^2 = d, E<alpha, w> = nd and task 2's "
        "E||alpha||^2; then factor out d / 2.",
    ),
    "bilinear_B": (
        "Write the query's new label slot for one head (chapter 2, section 1) and keep only the terms that "
        "contain alpha = sum_i y_i x_i; y_hat is minus the slot.",
        "Two terms: p_y alpha^T Q_xx x_t and (p_x^T alpha)(q_yx^T x_t), with p_x = P[d, :d], p_y = P[d, d], "
        "Q_xx = Q[:d, :d] and q_yx = Q[d, :d].",
        "Write each term as x_t^T (matrix) alpha: alpha^T Q_xx x_t = x_t^T Q_xx^T alpha and (p_x^T alpha)(q_yx^T "
        "x_t) = x_t^T (q_yx p_x^T) alpha; B is minus the sum of the two matrices.",
    ),
    "optimal_preconditioner": (
        "The loss is a quadratic in B: expand (1/2) E[(<B alpha, x_t> - y_t)^2], averaging over x_t first, and set "
        "the gradient in B to zero.",
        "Averaging over x_t ~ N(0, S) gives (1/2) E[(B alpha - w)^T S (B alpha - w)], whose gradient vanishes at "
        "B = E[w alpha^T] E[alpha alpha^T]^-1; with W = X^T X, alpha = W w + X^T noise.",
        "E[w alpha^T] = E[W] = nS and E[alpha alpha^T] = E[W W] + n E[sigma^2] S = nS ((n + 1) S + (tr S + "
        "E[sigma^2]) I) (the task's hint with M = I): the factor nS cancels.",
    ),
    # chapter 3
    "implicit_step": (
        "Substitute x_i^l = M x_i + y_i u and y_i^l = a y_i - <w, x_i> into x' = (I + T_xx) x + t_xy y and "
        "y' = t_yx^T x + (1 + t_yy) y, then collect the coefficients of x_i and of y_i.",
        "x' = (I + T_xx)(M x + y u) + t_xy (a y - <w, x>): its x-part is the new M and its y-part the new u; in "
        "y' the y-part is the new a and the x-part is minus the new w.",
        "M' = (I + T_xx) M - t_xy w^T and u' = (I + T_xx) u + a t_xy; a' and w' come the same way from y' (t_yx^T "
        "M x enters -<w', x>); build all four from the old values, batched over tasks.",
    ),
    "gdpp_layers": (
        "Chapter 3: a GD++ layer maps each eigenvalue lambda to lambda (1 - gamma lambda)^2, and the map is "
        "increasing on [0, lambda_max], so only the two extreme eigenvalues matter.",
        "Track the smallest and the largest eigenvalue, from 1 and kappa; at every layer take gamma = "
        "1 / (3 lambda_max) of the current largest and map both with that gamma.",
        "Repeat while largest / smallest - 1 > eps, counting the layers (in float64); the answer is the count "
        "plus one for the final GD step, as a Python int.",
    ),
    "best_cosine": (
        "Chapter 3, section 3: the vector of the span of X's columns closest in angle to the target is the "
        "orthogonal projection of the target onto that span.",
        "The projection is X c with c the least-squares solution of min_c ||X c - target||, for every task at "
        "once (a batched solver).",
        "For the projection Pi t of t, <Pi t, t> = ||Pi t||^2, so the cosine <Pi t, t> / (||Pi t|| ||t||) is "
        "||Pi t|| / ||t||: one number per task.",
    ),
    "newton_iterates": (
        "Chapter 3's Newton iteration for S^-1: M <- M (2I - S M) squares the error I - S M at every step, once "
        "it starts with ||I - S M_0||_2 < 1.",
        "M_0 = I / lambda_max(S) is such a start (the eigenvalues of S M_0 lie in (0, 1]); for a symmetric S, "
        "torch.linalg.eigvalsh gives the eigenvalues in ascending order.",
        "Keep M_0 and each of the num_steps iterates, and stack them into a (num_steps + 1, d, d) tensor, M_0 "
        "first, in S's dtype.",
    ),
    # chapter 4
    "noise_estimate": (
        "The noise is what no linear function of x explains: fit a linear model to each task's context and look "
        "at what the fit leaves over.",
        "The residuals y - X w_ols of the least-squares fit are noise that the fit has partly absorbed: d of their "
        "n degrees of freedom went into w_ols, so their squares sum to about (n - d) sigma^2.",
        "w_ols is the least-squares solution of X w = y, (B, d, 1) for all tasks at once with one batched "
        "torch.linalg.lstsq; the estimate is the sum of the squared residuals over the context divided by n - d, a "
        "variance (no square root).",
    ),
    "adjusted_loss_per_task": (
        "Two half squared errors per task: the learner's, 1/2 ||w_hat - w||^2, and the oracle ridge's.",
        "The oracle is ridge regression that knows each task's noise: it solves (Sigma + sigma^2 I) w = alpha with "
        "Sigma = X^T X and alpha = X^T y, every task with its own sigma.",
        "One batched torch.linalg.solve with sigma**2 reshaped to (B, 1, 1) gives w_oracle; return the learner's "
        "half squared error minus the oracle's, each summed over the d coordinates: one number per task.",
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
        "Chapter 5's conjugate gradient on each task's normal equations Sigma w = alpha: keep a gradient g_k, a "
        "direction p_k and a step a_k per task, and loop over the steps only.",
        "g_0 = Sigma w_0 - alpha = -alpha and p_0 = -g_0; each step: a = ||g||^2 / p^T Sigma p, w += a p, g += a "
        "Sigma p (no need to recompute the gradient), beta = ||g_new||^2 / ||g||^2, p = -g_new + beta p.",
        "Shapes: Sigma (B, d, d), g and p (B, d), a and beta (B,), unsqueezed to scale (B, d) vectors; a task that "
        "has converged has ||g|| = 0 and 0/0 in a and beta, which must count as 0 (torch.nan_to_num); stack the "
        "iterates along dim 1, w_0 first.",
    ),
    "memformer_layer": (
        "Multiply out Attn(Z) = P Z M Z^T Q Z / n: P keeps only the label row, M drops the query column, and Q "
        "keeps only the input rows (through A).",
        "Z M Z^T sums over the n context columns; its label row times Q is -(sum_i y_i x_i^T) A^T, of shape "
        "(B, 1, d), and that times Z / n is the label row of Attn(Z).",
        "Attn(Z) is zero but for its last row, -(sum_i y_i x_i^T) A^T Z_x / n with Z_x the input rows of Z (every "
        "column, the query's too); update the register first (Attn + gamma R), then Z with the new register.",
    ),
    "momentum_alpha_gamma": (
        "Write the Memformer's step w_{l+1} - w_l = alpha_l r_l with r_l = -grad R(w_l) + gamma_l r_{l-1}, and "
        "compare it with heavy ball's step.",
        "The previous step is alpha_{l-1} r_{l-1} = w_l - w_{l-1}: substitute it and match the coefficients of "
        "-grad R(w_l) and of (w_l - w_{l-1}).",
        "Matching -grad R(w_l) gives alpha_l = eta_l; matching (w_l - w_{l-1}) gives gamma_l alpha_l / alpha_{l-1} "
        "= mu_l, to solve for gamma_l when l >= 2 (gamma_1 multiplies r_0 = 0: any value works).",
    ),
}
