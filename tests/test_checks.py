"""The trusted checks: the answer keys pass them, typical mistakes fail them, and what the grader
loads from a learner's kernel can only be plain data."""

import math
import os
import re
from dataclasses import replace

import nbformat
import pytest
import torch
from conftest import ROOT, answer_key_functions, verify_on_grading_inputs

from icl_course import checks, theory
from icl_course.grading import checking, protocol, registry


@pytest.fixture(scope="module")
def answers():
    """The functions of every answer key."""
    return answer_key_functions(sorted((ROOT / "solutions").glob("*.ipynb")))


run = verify_on_grading_inputs


def test_every_exercise_function_has_a_check(answers):
    assert set(registry.CHECKS) <= set(answers)
    tasks = set()
    for path in (ROOT / "solutions").glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.metadata["nbgrader"].get("grade"):
                tasks.add((int(path.name.split("_")[0]), int(cell.metadata["nbgrader"]["grade_id"][4:].split("_")[0])))
    assert {(check.chapter, check.task) for check in registry.CHECKS.values()} == tasks


@pytest.mark.parametrize("seed", [1, 7, 2024])
def test_the_answer_keys_pass_on_fresh_grading_inputs(answers, seed):
    for name in registry.CHECKS:
        run(name, answers[name], seed)


def test_grading_inputs_are_fresh_per_seed_and_reproducible():
    check = registry.CHECKS["merged_form"]
    first, again, other = check.grading_cases(5), check.grading_cases(5), check.grading_cases(6)
    assert all(torch.equal(a.arguments["W_K"], b.arguments["W_K"]) for a, b in zip(first, again))
    assert first[1].arguments["W_K"].shape != other[1].arguments["W_K"].shape or \
        not torch.equal(first[1].arguments["W_K"], other[1].arguments["W_K"])
    assert torch.equal(first[0].arguments["W_K"], other[0].arguments["W_K"])  # the visible example comes first


MISTAKES = {
    "merged_form": (lambda W_K, W_Q, W_V, W_P: (W_K.T @ W_Q, W_P @ W_V), "moves tokens differently"),
    "linear_attention": (
        lambda tokens, P, Q: tokens + tokens @ (P @ tokens.transpose(1, 2) @ tokens @ Q).transpose(1, 2),
        "not the query"),
    "transformer_prediction": (lambda tokens, P, Q, num_layers: tokens[:, -1, -1], "the prediction of 1 GD step "),
    "best_step_size": (lambda d, n, num_tasks=20_000, seed=0: n / (n + d + 1), "smallest mean loss"),
    "fourth_moment": (lambda d: d * d, "E||x||^4"),
    "optimal_coefficient": (lambda d, n, second_moment=0.0: 1 / (n + d + 2 + second_moment), "minimiser"),
    "one_step_loss": (lambda d, n, second_moment, c: 0.5 * d * (1 - c * n + c**2 * n * (n + d + 1 + second_moment)),
                      "closed form"),
    "bilinear_B": (lambda P, Q: -P[-1, -1] * Q[:-1, :-1].T, "B is wrong"),
    "optimal_preconditioner": (
        lambda S, n, second_moment=0.0: torch.linalg.inv(S) / (n + S.shape[0] + 1 + second_moment),
        "the best B when w ~ N\\(0, S\\^-1\\)"),
    "gdpp_layers": (lambda kappa, eps: theory.gdpp_layers_needed(kappa, eps) - 1, "are needed"),
    "best_cosine": (
        lambda X, target: (X[..., 0] * target).sum(-1).abs() / (X[..., 0].norm(dim=-1) * target.norm(dim=-1)),
        r"columns' span with the target; the furthest task at \[\d+\]: expected [-\d.e]+, got [-\d.e]+"),
    "newton_iterates": (
        lambda S, num_steps: torch.stack([torch.eye(S.shape[0], dtype=S.dtype) / torch.trace(S)] * (num_steps + 1)),
        "the first iterate is not M_0"),
}


def test_the_misprinted_sign_is_named(answers):
    def misprinted(M, u, a, w, mixing):
        new_M, new_u, new_a, new_w = answers["implicit_step"](M, u, a, w, mixing)
        return new_M + 2 * mixing[:, :-1, -1].unsqueeze(-1) * w.unsqueeze(-2), new_u, new_a, new_w
    with pytest.raises(checking.CheckFailed, match="misprinted"):
        run("implicit_step", misprinted, seed=0)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_typical_mistake_fails_with_a_message(name):
    function, message = MISTAKES[name]
    with pytest.raises(checking.CheckFailed, match=message):
        run(name, function, seed=3)


def test_gd_matrices_with_the_wrong_sign_and_a_fake_monte_carlo_fail():
    def ascent(d, n, eta):
        P = torch.zeros(d + 1, d + 1, dtype=torch.float64)
        P[d, d] = eta / n
        return P, torch.eye(d + 1, dtype=torch.float64)
    with pytest.raises(checking.CheckFailed, match="the sign is flipped"):
        run("gd_matrices", ascent, seed=0)
    with pytest.raises(checking.CheckFailed, match="standard error"):
        run("fourth_moment_monte_carlo", lambda d, num_samples=200_000, seed=0: (float(d * (d + 2)), 0.01), seed=0)


def test_outputs_of_the_wrong_kind_are_named():
    with pytest.raises(checking.CheckFailed, match="Python float.*use .item"):
        run("best_step_size", lambda d, n, num_tasks=20_000, seed=0: torch.tensor(0.5), seed=0)
    with pytest.raises(checking.CheckFailed, match="must have shape"):
        run("linear_attention", lambda tokens, P, Q: tokens[0], seed=0)
    with pytest.raises(checking.CheckFailed, match="pair"):
        run("merged_form", lambda W_K, W_Q, W_V, W_P: W_K, seed=0)
    with pytest.raises(checking.CheckFailed, match="an object of type object"):
        run("bilinear_B", lambda P, Q: object(), seed=0)


def test_self_check_reports_the_function_and_the_reason(capsys):
    with pytest.raises(AssertionError, match="^optimal_coefficient: for d=10, n=20"):
        checks.self_check("optimal_coefficient", lambda d, n, second_moment=0.0: 0.1)
    checks.self_check("optimal_coefficient", lambda d, n, second_moment=0.0: 1 / (n + d + 1 + second_moment))
    assert re.fullmatch(r"optimal_coefficient: passed \(\d+ cases\)\n", capsys.readouterr().out)
    with pytest.raises(KeyError, match="no check named 'merged'"):
        checks.self_check("merged", print)


def test_a_failed_self_check_shows_its_message_without_a_traceback():
    with pytest.raises(checks.SelfCheckFailed) as failure:
        checks.self_check("merged_form", lambda W_K, W_Q, W_V, W_P: (W_P, W_K))
    shown = "\n".join(failure.value._render_traceback_())   # what IPython prints instead of the frames
    assert "merged_form: " in shown and "Traceback" not in shown and "File " not in shown


def test_a_failure_box_wraps_its_message_between_words():
    """JupyterLab breaks a long output line anywhere, mid-word; the self-check's lines are short enough
    not to be broken, and wrapped at spaces, so every word of the message stays whole."""
    message = "noise_estimate: " + " ".join(["the estimate divides the residuals by something else"] * 6)
    lines = checks.SelfCheckFailed(message)._render_traceback_()
    plain = [re.sub(r"\x1b\[[\d;]*m", "", line) for line in lines]
    assert len(plain) > 1 and all(len(line) <= protocol._WRAP for line in plain)
    assert " ".join(plain) == f"Self-check failed: {message}"   # joined at the breaks, not a word split


def test_mismatch_names_the_furthest_entry_with_expected_and_got():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = expected.clone()
    got[1, 0] = 3.5
    assert checking.mismatch(got, expected) == " at [1, 0]: expected 3, got 3.5"
    got[0, 1] = float("nan")   # a NaN is the furthest of all
    assert checking.mismatch(got, expected) == " at [0, 1]: expected 2, got nan"
    assert checking.mismatch(torch.tensor(1.5), torch.tensor(1.0)) == ": expected 1, got 1.5"


def test_every_task_has_hints_that_open_one_at_a_time(capsys):
    from icl_course.hints import HINTS
    assert set(HINTS) == set(registry.CHECKS), "every graded task needs hints, and every hint a task"
    for name, hints in HINTS.items():
        assert len(hints) >= 3 and len(set(hints)) == len(hints), name
    protocol._HINTS_SHOWN.clear()
    checks.hint("gdpp_layers")
    first = capsys.readouterr().out
    assert "hint 1 of 3" in first and "hint 2" not in first and "again for the next" in first
    checks.hint("gdpp_layers")
    checks.hint("gdpp_layers")
    third = capsys.readouterr().out.split("hint 1 of 3")[-1]
    assert "hint 3 of 3" in third and "that was the last hint" in third and "no more hints" not in third
    for _ in range(3):   # past the last one, all are shown again with a plain "no more", never an error
        checks.hint("gdpp_layers")
    last = capsys.readouterr().out.split("hint 1 of 3")[-1]
    assert "hint 3 of 3" in last and "again for the next" not in last and "no more hints" in last
    with pytest.raises(KeyError, match="no check named"):
        checks.hint("gdpp")


def test_progress_shows_what_the_self_checks_of_this_kernel_found():
    protocol._OUTCOMES.clear()
    protocol._HINTS_SHOWN.clear()
    table = checks.progress(2)
    assert [row[1] for row in table.rows][:2] == ["fourth_moment", "fourth_moment_monte_carlo"]
    assert table.passed == 0 and all(row[2] == "not run yet" for row in table.rows)
    checks.self_check("fourth_moment", lambda d: d * (d + 2))
    with pytest.raises(checks.SelfCheckFailed, match=r"stuck\? checks.hint\('optimal_coefficient'\)"):
        checks.self_check("optimal_coefficient", lambda d, n, second_moment=0.0: 0.1)
    with pytest.raises(ZeroDivisionError):   # a function that crashes counts as failed, not as passed
        checks.self_check("one_step_loss", lambda d, n, second_moment, c: 1 / 0)
    checks.hint("optimal_coefficient")
    status = {name: (outcome, hints) for _, name, outcome, hints in checks.progress(2).rows}
    assert status["fourth_moment"] == ("passed", 0)
    assert status["optimal_coefficient"][0].startswith("failed: for d=10") and status["optimal_coefficient"][1] == 1
    assert status["one_step_loss"][0].startswith("failed") and status["bilinear_B"][0] == "not run yet"
    shown = str(checks.progress(2))
    assert shown.startswith("chapter 2: 1 of 6 tasks passed") and "<td>" in checks.progress(2)._repr_html_()
    with pytest.raises(ValueError, match="chapters with tasks are"):
        checks.progress(9)


def test_self_checks_try_drawn_cases_beyond_the_fixed_examples():
    seen = []

    def spy(d, n, second_moment=0.0):
        seen.append((d, n, second_moment))
        return 1 / (n + d + 1 + second_moment)
    checks.self_check("optimal_coefficient", spy)
    examples = registry.CHECKS["optimal_coefficient"].examples()
    assert len(seen) > len(examples) and len(set(seen)) > len(examples)


@pytest.fixture
def grading(tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.ANSWERS_VARIABLE, str(tmp_path))
    protocol.write_cases(list(registry.CHECKS), tmp_path, 11)
    return tmp_path


def test_record_then_verify_in_another_place(grading, answers):
    checks.record("one_step_loss", answers["one_step_loss"])
    checks.record("optimal_coefficient", lambda d, n, second_moment=0.0: 0.5)
    checks.record("bilinear_B", lambda P, Q: 1 / 0)
    verdicts = protocol.verify_recorded(["one_step_loss", "optimal_coefficient", "bilinear_B", "gd_matrices"],
                                      grading, 11)
    assert verdicts["one_step_loss"] == ""
    assert "c = 0.5" in verdicts["optimal_coefficient"]
    assert "raised ZeroDivisionError" in verdicts["bilinear_B"]
    assert "no outputs were recorded" in verdicts["gd_matrices"]
    # the same outputs checked against another seed's inputs fail: the seed must be the grader's
    other_seed = protocol.verify_recorded(["optimal_coefficient"], grading, 12)
    assert "optimal_coefficient" in other_seed["optimal_coefficient"]


def test_under_grading_record_runs_on_the_graders_inputs_and_self_check_runs_nothing(grading, capsys):
    # inputs no seed gives: the kernel must use what the grader wrote, not draw its own
    torch.save([dict(d=2, n=3, second_moment=0.25), dict(d=4, n=5, second_moment=0.0)],
               grading / protocol.CASES_FOLDER / "optimal_coefficient.pt")
    seen = []

    def spy(d, n, second_moment):
        seen.append((d, n, second_moment))
        return 0.5
    checks.record("optimal_coefficient", spy)
    assert seen == [(2, 3, 0.25), (4, 5, 0.0)]
    assert torch.load(grading / "optimal_coefficient.pt", weights_only=True) == [("output", 0.5)] * 2
    checks.self_check("optimal_coefficient", spy)   # its references may be withheld in a graded kernel
    assert len(seen) == 2 and "self-check not run while your work is graded" in capsys.readouterr().out
    (grading / protocol.CASES_FOLDER / "one_step_loss.pt").unlink()
    with pytest.raises(checks.SelfCheckFailed):       # a check the grader does not record runs as usual
        checks.self_check("one_step_loss", lambda **arguments: 0.5)


def test_the_grader_writes_only_plain_arguments_and_no_seed(tmp_path, monkeypatch):
    protocol.write_cases(["gd_matrices", "transformer_prediction"], tmp_path, 5)
    written = torch.load(tmp_path / protocol.CASES_FOLDER / "transformer_prediction.pt", weights_only=True)
    drawn = registry.CHECKS["transformer_prediction"].grading_cases(5)
    assert len(written) == len(drawn) and all(torch.equal(case.arguments["tokens"], arguments["tokens"])
                                              for case, arguments in zip(drawn, written))
    assert [set(arguments) for arguments in written] == [set(case.arguments) for case in drawn]   # no context
    monkeypatch.setenv(protocol.ANSWERS_VARIABLE, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no grading inputs for 'best_step_size'"):
        checks.record("best_step_size", lambda **arguments: 0.5)


class Payload:
    """Pickles as a call to os.system: what a forged answers file could try."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_forged_answers_file_is_refused_and_never_executed(grading, tmp_path):
    marker = tmp_path / "executed"
    torch.save([("output", Payload(marker))], grading / "merged_form.pt")
    torch.save("not a list of entries", grading / "gd_matrices.pt")
    torch.save([("output", 1.0)] * 2, grading / "best_step_size.pt")
    (grading / "bilinear_B.pt").write_bytes(b"\x00" * (protocol.MAX_RECORD_BYTES + 1))
    verdicts = protocol.verify_recorded(["merged_form", "gd_matrices", "best_step_size", "bilinear_B"], grading, 11)
    assert "could not be read safely" in verdicts["merged_form"] and not marker.exists()
    assert "not in the format" in verdicts["gd_matrices"]
    assert "2 outputs were recorded for 4 grading inputs" in verdicts["best_step_size"]
    assert "MiB" in verdicts["bilinear_B"]


def test_portable_outputs_are_plain():
    parameter = torch.nn.Parameter(torch.ones(2))
    assert type(protocol.portable(parameter)) is torch.Tensor
    assert protocol.portable((1, 2.5, True)) == (1, 2.5, True)
    assert protocol.portable(math) == "<an object of type module>"


def test_giveaways_are_found_in_code_not_in_the_answers_own_names():
    source = ("from icl_course.models import LinearSelfAttention as L\n"
              "def linear_attention(tokens, P, Q):\n    return L.from_matrices(P, Q)(tokens)\n")
    names = ("LinearSelfAttention", "from_matrices")
    assert protocol.giveaways_used(source, names) == ["LinearSelfAttention", "from_matrices"]
    assert protocol.giveaways_used("def one_step_loss(n, d):\n    return theory.one_step_loss(d, n)\n",
                                 ("theory", "one_step_loss")) == ["theory"]
    assert protocol.giveaways_used("def f(x):\n    return 2 * x\n", ("theory",)) == []
    assert protocol.giveaways_used("def f(:\n  theory", ("theory",)) == ["theory"]  # not Python: by word
    assert protocol.recorded_names('checks.record("a", a)\nchecks.record( \'b\', b)') == ["a", "b"]


def test_the_likely_mistakes_are_named(answers):
    def flipped_matrices(d, n, eta):
        P, Q = answers["gd_matrices"](d, n, eta)
        return -P, Q
    with pytest.raises(checking.CheckFailed, match="the sign is flipped"):
        run("gd_matrices", flipped_matrices, seed=0)

    def flipped_prediction(tokens, P, Q, num_layers):
        return -answers["transformer_prediction"](tokens, P, Q, num_layers)
    with pytest.raises(checking.CheckFailed, match="the sign is flipped"):
        run("transformer_prediction", flipped_prediction, seed=0)

    def other_prior(S, n, second_moment):
        return torch.linalg.inv(S) / (n + S.shape[0] + 1 + second_moment)
    with pytest.raises(checking.CheckFailed, match="best B when w ~ N\\(0, S\\^-1\\)"):
        run("optimal_preconditioner", other_prior, seed=0)
    with pytest.raises(checking.CheckFailed, match="best B when w ~ N\\(0, S\\^-1\\)"):  # any multiple of S^-1
        run("optimal_preconditioner", lambda S, n, second_moment: torch.linalg.inv(S) / (n + 1), seed=0)


@pytest.mark.parametrize("name, mistake, message", [
    ("best_step_size", lambda d, n, num_tasks=20_000, seed=0: n / (n + d + 1), "limit for infinitely many tasks"),
    ("optimal_coefficient", lambda d, n, second_moment=0.0: 1 / (n + d + 1), "the noise is missing"),
    ("optimal_coefficient", lambda d, n, second_moment=0.0: n / (n + d + 1 + second_moment), "the step eta"),
    ("optimal_coefficient", lambda d, n, second_moment=0.0: 1 / n, "1/n is the step"),
    ("one_step_loss", lambda d, n, second_moment, c: d * (1 - 2 * c * n + c**2 * n * (n + d + 1 + second_moment)),
     "twice the loss"),
    ("one_step_loss", lambda d, n, second_moment, c: 0.5 * d * (1 - 2 * c * n + c**2 * n * (n + d + 1)),
     "the noise is missing"),
])
def test_likely_mistakes_in_the_step_size_tasks_are_named(answers, name, mistake, message):
    with pytest.raises(checking.CheckFailed, match=message):
        run(name, mistake, seed=3)


def test_a_line_search_over_c_instead_of_eta_is_named(answers):
    def coefficient(d, n, num_tasks=20_000, seed=0):
        return answers["best_step_size"](d, n, num_tasks, seed) / n
    with pytest.raises(checking.CheckFailed, match="the coefficient c = eta / n"):
        run("best_step_size", coefficient, seed=3)


def test_a_flipped_or_transposed_B_is_named(answers):
    with pytest.raises(checking.CheckFailed, match="the sign is flipped"):
        run("bilinear_B", lambda P, Q: -answers["bilinear_B"](P, Q), seed=0)
    with pytest.raises(checking.CheckFailed, match="B is transposed"):
        run("bilinear_B", lambda P, Q: answers["bilinear_B"](P, Q).T, seed=0)


def test_messages_count_layers_in_good_english():
    case = registry.CHECKS["transformer_prediction"].examples()[0]
    assert case.arguments["num_layers"] == 1
    with pytest.raises(checking.CheckFailed) as failure:
        registry.CHECKS["transformer_prediction"].verify(case, torch.zeros(case.arguments["tokens"].shape[0],
                                                                         dtype=torch.float64))
    assert "1 layer should give the prediction of 1 GD step " in str(failure.value)


def test_the_registry_collects_every_chapters_catalogue_under_unique_names():
    from icl_course.grading import registry
    assert sorted({check.chapter for check in registry.CHECKS.values()}) == list(registry.CHAPTERS)
    for chapter in registry.CHAPTERS:
        names = [check.name for check in registry.catalogue(chapter)]
        assert names and all(registry.CHECKS[name].chapter == chapter for name in names)
    assert registry.build_registry((1, 2)).keys() == {name for name, check in registry.CHECKS.items()
                                                      if check.chapter in (1, 2)}


def test_the_registry_refuses_a_name_used_twice_or_a_check_filed_under_another_chapter(monkeypatch):
    from icl_course.grading import chapter2, registry
    duplicate = registry.catalogue(1)[0]
    monkeypatch.setattr(chapter2, "chapter_2_checks", lambda: [replace(duplicate, chapter=2)])
    with pytest.raises(ValueError, match="two checks are named 'merged_form' \\(chapters 1 and 2\\)"):
        registry.build_registry((1, 2))
    with pytest.raises(ValueError, match="'merged_form' of icl_course.grading.chapter2 says it belongs to chapter 1"):
        monkeypatch.setattr(chapter2, "chapter_2_checks", lambda: [duplicate])
        registry.build_registry((2,))
    with pytest.raises(ModuleNotFoundError, match="icl_course.grading.chapter9"):
        registry.build_registry((9,))


def test_no_module_of_the_package_imports_another_ones_private_names():
    import ast
    offenders = []
    for path in sorted((ROOT / "icl_course").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            ours = isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("icl_course"))
            if ours:
                offenders += [f"{path.relative_to(ROOT)}: {alias.name}" for alias in node.names
                              if alias.name.startswith("_")]
    assert offenders == []


def test_the_grading_modules_import_one_another_in_one_direction():
    """checking (what a check is) imports nothing else of grading; the catalogues import checking; the registry
    the catalogues; the runtime (protocol) the registry: no cycle, no import inside a function, no lazy name."""
    import ast
    folder = ROOT / "icl_course" / "grading"
    imports, inside_functions = {}, []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names.add(node.module or "")
                names.update(alias.name for alias in node.names if not node.module)
        imports[path.stem] = names - {"", path.stem}
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside_functions += [f"{path.stem}.{function.name}: {node.module}" for node in ast.walk(function)
                                     if isinstance(node, ast.ImportFrom) and node.level == 1
                                     and node.module in ("protocol", "registry", "checking")]
    assert imports["checking"] == set()
    for chapter in (name for name in imports if name.startswith("chapter")):
        assert imports[chapter] == {"checking"}, chapter
    assert "protocol" not in imports["registry"] and "registry" in imports["protocol"]

    def reaches(start, goal, seen=()):
        return any(name == goal or (name not in seen and reaches(name, goal, (*seen, name)))
                   for name in imports.get(start, ()))
    assert [name for name in imports if reaches(name, name)] == []   # no cycle among grading's modules
    assert inside_functions == []
    checks_source = (ROOT / "icl_course" / "checks.py").read_text()
    assert "__getattr__" not in checks_source
    assert set(checks.__all__) == {"self_check", "record", "hint", "progress", "SelfCheckFailed", "Progress"}
    assert registry.CHECKS is __import__("icl_course.grading.registry", fromlist=["CHECKS"]).CHECKS


@pytest.fixture(scope="module")
def specifications():
    """The executable specifications that the exercise notebooks print beside their stubs."""
    namespace = {"torch": torch}
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.source.startswith("# specification, task"):
                exec(cell.source, namespace)
    return {name: value for name, value in namespace.items() if name.endswith("_spec")}


@pytest.mark.parametrize("name", ["linear_attention", "diag_layer", "cg_iterates", "memformer_layer"])
def test_specifications_beside_the_stubs_pass_the_trusted_checks(name, specifications):
    run(name, specifications[name + "_spec"], seed=5)


def test_four_matrix_head_specification_moves_tokens_as_the_merged_form(answers, specifications):
    generator = torch.Generator().manual_seed(3)
    D, k, v = 4, 3, 2
    W_K, W_Q, W_V, W_P = (torch.randn(*shape, generator=generator, dtype=torch.float64)
                          for shape in ((k, D), (k, D), (v, D), (D, v)))
    tokens = torch.randn(2, 6, D, generator=generator, dtype=torch.float64)
    merged = specifications["linear_attention_spec"](tokens, *answers["merged_form"](W_K, W_Q, W_V, W_P)) - tokens
    moves = specifications["four_matrix_head_spec"](tokens, W_K, W_Q, W_V, W_P)
    assert moves.abs().max() > 0.1 and torch.allclose(moves, merged, atol=1e-12)
    assert len(specifications) == 5


def _poisoned(value, bad: float):
    """``value`` with its first floating-point entry (or number) replaced by ``bad``."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        value = value.clone().contiguous()
        value.view(-1)[0] = bad
        return value
    if isinstance(value, (tuple, list)):
        items = list(value)
        for index, item in enumerate(items):
            poisoned = _poisoned(item, bad)
            if poisoned is not item:
                items[index] = poisoned
                return type(value)(items)
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return bad
    return value


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_outputs_fail_every_check(answers, bad):
    """Each check, given the answer key's output with one entry made NaN or infinite, fails it (scores 0)."""
    for name, check in registry.CHECKS.items():
        case = check.grading_cases(5)[-1]
        output = protocol.portable(answers[name](**case.arguments))
        poisoned = _poisoned(output, bad)
        assert poisoned is not output, name
        with pytest.raises(checking.CheckFailed):
            check.verify(case, poisoned)


def test_an_answer_so_large_that_the_loss_overflows_is_not_the_best_preconditioner():
    """1e300 u u^T makes the preconditioned loss NaN, and "loss > best + tol" is False for NaN."""
    def overflowing(S, n, second_moment=0.0):
        u = torch.ones(S.shape[0], 1, dtype=S.dtype)
        return 1e300 * u @ u.T
    for seed in (0, 1, 2):
        with pytest.raises(checking.CheckFailed, match="your B has loss nan"):
            run("optimal_preconditioner", overflowing, seed=seed)
    assert not checking.close(torch.tensor([math.nan]), torch.tensor([0.0]))
    assert not checking.close(torch.tensor([0.0]), torch.tensor([math.inf]))


def test_the_monte_carlo_task_needs_evidence_of_sampling():
    def closed_form(d, num_samples=200_000, seed=0):
        exact = d * (d + 2)
        return float(exact), math.sqrt((d * (d + 2) * (d + 4) * (d + 6) - exact**2) / num_samples)
    with pytest.raises(checking.CheckFailed, match="closed forms"):
        run("fourth_moment_monte_carlo", closed_form, seed=0)
    with pytest.raises(checking.CheckFailed, match="closed forms"):   # the exact mean beside a sampled error
        run("fourth_moment_monte_carlo", lambda d, num_samples=200_000, seed=0:
            (float(d * (d + 2)), 1.01 * closed_form(d, num_samples)[1]), seed=0)


def test_each_tasks_reference_functions_are_withheld_by_name():
    """A function of the package that has the task's own name answers it: it must be withheld by name
    (the module "theory" in the giveaways withholds nothing)."""
    from icl_course.grading.sandbox import package_folder
    from icl_course.grading.stripped import defined_names, withheld_names
    package = package_folder()
    defined = defined_names(package) - defined_names(package / "grading")
    for check in registry.CHECKS.values():
        if check.name in defined:
            assert check.name in withheld_names([check], package), check.name
    assert {"one_step_loss", "optimal_preconditioner"} <= withheld_names(list(registry.CHECKS.values()), package)


def test_a_memformer_layer_that_ignores_the_mask_fails(answers):
    """Without the mask M the query token joins the sum Z M Z^T; the graded cases give it a non-zero label,
    so that this wrong answer fails (with a zero label it would pass)."""
    from icl_course.grading.chapter5 import reference_memformer_layer

    def unmasked(Z, register, A, alpha, gamma):
        d, n = Z.shape[-2] - 1, Z.shape[-1] - 1
        P = torch.zeros(d + 1, d + 1, dtype=Z.dtype)
        P[d, d] = 1.0
        Q = torch.zeros(d + 1, d + 1, dtype=Z.dtype)
        Q[:d, :d] = -A.T
        new_register = P @ Z @ Z.transpose(-1, -2) @ Q @ Z / n + gamma * register
        return Z + alpha * new_register, new_register
    for seed in (0, 1, 2):
        with pytest.raises(checking.CheckFailed, match="the mask keeps the query column out"):
            run("memformer_layer", unmasked, seed=seed)
        run("memformer_layer", answers["memformer_layer"], seed=seed)
    check = registry.CHECKS["memformer_layer"]
    for case in check.grading_cases(0)[len(check.examples()):]:
        assert (case.arguments["Z"][:, -1, -1] != 0).all()       # every drawn case has a query label
        assert not checking.close(unmasked(**case.arguments)[1], reference_memformer_layer(**case.arguments)[1])


def test_no_hint_hands_out_a_line_of_the_answer_key():
    """The last hint nearly gives the answer but is not its code: no statement of an answer key's solution
    (between BEGIN and END SOLUTION, comments dropped, spaces ignored) appears in a hint of its task."""
    from icl_course.hints import HINTS

    def squeeze(text):
        return "".join(text.split())
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if "### BEGIN SOLUTION" not in cell.source:
                continue
            name = cell.source.split("def ", 1)[1].split("(", 1)[0]
            solution = cell.source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
            statements = [squeeze(line.split("#", 1)[0]).removeprefix("return") for line in solution.splitlines()]
            hints = [squeeze(hint) for hint in HINTS[name]]
            for statement in statements:
                if len(statement) >= 12:     # shorter ones ("d=M.shape[-1]") give nothing away
                    assert not any(statement in hint for hint in hints), (name, statement)
