"""hydra/sweeper=optuna: a search per framework, each trial's objective what its job returns,
checked before it starts, resumable, and reported best against best."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest

from conftest import FAST, refusal, run_unitrain

optuna = pytest.importorskip("optuna")

SEARCH = ["-m", "hydra/sweeper=optuna", *FAST, "data=learnable", "data.val_samples=32", "trainer.batch_size=8"]
SEARCH += ["trainer.steps=3"]
LR = "optim.lr=tag(log,interval(0.001,0.5))"


def _study(sweep_dir):
    return optuna.load_study(study_name="unitrain", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def _trials(sweep_dir):
    return [(t.number, t.state.name, t.params, t.value) for t in _study(sweep_dir).get_trials()]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One search of three trials on each framework, shared by the tests below."""
    found = {}
    for backend in ("torch", "paddle"):
        root = tmp_path_factory.mktemp(f"search-{backend}")
        done = run_unitrain([*SEARCH, f"backend={backend}", LR, "hydra.sweeper.n_trials=3"], root, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        found[backend] = root / "multirun"
    return found


@pytest.mark.slow
def test_each_trials_value_is_what_its_job_returned_its_held_out_top1(searched):
    sweep = searched["torch"]
    trials = _trials(sweep)
    assert [(n, state) for n, state, _, _ in trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    for number, _, params, value in trials:
        (job,) = sweep.glob(f"{number}_*")
        summary = json.loads((job / "summary.json").read_text())
        assert value == summary["eval"]["val_top1"] and summary["lr"] == pytest.approx(params["optim.lr"])


@pytest.mark.slow
def test_both_frameworks_get_the_same_proposals_from_the_same_seed(searched):
    """The sampler is seeded from trainer.seed: the same search proposes the same trials, so both
    frameworks are tried at the same settings first."""
    lrs = {b: [p["optim.lr"] for _, _, p, _ in _trials(sweep)] for b, sweep in searched.items()}
    assert lrs["torch"] == lrs["paddle"]


@pytest.mark.slow
def test_best_against_best_reports_each_frameworks_best_trial(searched, tmp_path):
    from unitrain.report.hyperparameter_search import rows, searches

    out = tmp_path / "both"
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", str(searched["paddle"]), str(searched["torch"]), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = {row["framework"]: row for row in rows(searches([searched["paddle"], searched["torch"]]))}
    for backend, sweep in searched.items():
        best = max(value for _, _, _, value in _trials(sweep))
        assert table[backend]["best heldout"] == f"{best:.4f}" and table[backend]["trials (finished / all)"] == "3 / 3"
    text = (out / "comparison.md").read_text()
    assert text.startswith("## Best against best") and "WARNING: the searches" not in text
    assert (out / "search.png").exists() and "Best against best" in (out / "report.html").read_text()


@pytest.mark.slow
def test_a_killed_search_resumes_with_its_finished_trials_kept(tmp_path):
    """Stopped during its second trial, the same command goes on: the first trial is kept, the
    interrupted one is marked failed, the new trials' folders come after the old ones', and the
    sampler does not propose the first trial's settings again."""
    args = [*SEARCH, "backend=torch", LR, "hydra.sweeper.n_trials=3", "trainer.steps=40"]
    sweep = tmp_path / "multirun"
    command = [sys.executable, "-m", "unitrain", *args, f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not list(sweep.glob("1_*/metrics.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    first = _trials(sweep)
    assert [state for _, state, _, _ in first] == ["COMPLETE", "RUNNING"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = _trials(sweep)
    assert [state for _, state, _, _ in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert trials[0][2:] == first[0][2:]  # kept as it was
    assert trials[2][2] != trials[0][2]  # not proposed again
    assert sorted(p.name.split("_")[0] for p in sweep.glob("*_torch_*")) == ["0", "1", "2", "3"]


@pytest.mark.slow
def test_a_diverged_trial_is_the_worst_value_and_the_search_goes_on(tmp_path):
    args = [*SEARCH, "backend=torch", "hydra/sweeper/sampler=grid", "optim.lr=choice(0.01,1000000.0)"]
    done = run_unitrain([*args, "hydra.sweeper.n_trials=2"], tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    values = {p["optim.lr"]: v for _, state, p, v in _trials(tmp_path / "multirun") if state == "COMPLETE"}
    assert values[1000000.0] == -math.inf and 0 <= values[0.01] <= 1
    assert "the loss is nan" in done.stderr or "is not finite" in done.stderr


BAD = [
    (
        ["optim.lrr=interval(0.01,0.1)"],
        "hydra.sweeper.params.optim.lrr=interval(0.01,0.1): optim.lrr is not a config key",
    ),
    (["trainer.steps=interval(0.5,4.5)"], "could not be converted to Integer"),
    (["optim.lr=interval(-1,0.1)"], "optim.lr=-1.0 is not allowed: a finite number > 0"),
    ([LR, "hydra.sweeper.direction=minimize"], "hydra.sweeper.direction='minimize' is not allowed with objective"),
    ([], "hydra/sweeper=optuna has nothing to search"),
    ([LR, "data.val_samples=0"], "without a held-out set is not allowed in a search"),
    ([LR, "trainer.repeats=2"], "trainer.repeats=2 is not allowed in a search"),
    ([LR, "objective.metric=time_to_target"], "objective.target=None is not allowed: the held-out top-1 to reach"),
    (["hydra.sweeper.params.optim.lr='interval(0.01,0.1)'"], "is not allowed on the command line"),
    ([LR, "hydra/sweeper=optunaa"], "hydra/sweeper='optunaa' is not allowed: one of basic, optuna"),
    (["optim.lr=interval(0.1,0.001)"], "optim.lr=interval(0.1,0.001) is not allowed: its ends are reversed"),
    ([LR, "hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 is not allowed: a whole number >= 1"),
    ([LR, "hydra.sweeper.n_trials=-1"], "hydra.sweeper.n_trials=-1 is not allowed: a whole number >= 1"),
    ([LR, "hydra.sweeper.n_jobs=0"], "hydra.sweeper.n_jobs=0 is not allowed: a whole number >= 1"),
    (["hydra/sweeper/sampler=grid", LR], "GridSampler is not allowed over optim.lr (FloatDistribution("),
    (
        ["hydra.sweeper.sampler._target_=optuna.samplers.GridSampler", "optim.lr=interval(0.01,0.1)"],
        "allowed: choice(...) or range(...) dimensions",
    ),
    (["optim.lr=tag(logx,interval(0.01,0.1))"], "tag 'logx' means nothing to the search; allowed: tag(log, interval"),
    (["optim.lr=tag(log,choice(0.01,0.1))"], "tag 'log' means nothing to the search"),
    (["trainer.steps=range(5,1)"], "trainer.steps=range(5,1) is not allowed: it has no values"),
    ([LR, "hydra.sweeper.storage=bogus://x"], "hydra.sweeper.storage='bogus://x' is not allowed: Can't load plugin"),
    (
        [LR, "hydra.sweeper.sampler._target_=optuna.samplers.Nope"],
        "'optuna.samplers.Nope' is not allowed: Error locating",
    ),
]


@pytest.mark.parametrize("args, expected", BAD, ids=[e[:40] for _, e in BAD])
def test_a_search_that_cannot_start_is_one_line_before_anything_runs(tmp_path, args, expected):
    said = refusal([*SEARCH, "backend=torch", *args], tmp_path)
    assert said is not None and expected in said and "\n" not in said, said
    assert not (tmp_path / "multirun").exists()


def test_a_refused_search_exits_2_in_one_line_and_leaves_no_folder_lock_or_study(tmp_path):
    """As a user runs it: Optuna's storage refused (it used to be refused after the sweep's folder
    and its lock were made, and left them)."""
    done = run_unitrain([*SEARCH, "backend=torch", LR, "hydra.sweeper.storage=bogus://x"], tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr.startswith("unitrain: error: hydra.sweeper.storage='bogus://x' is not allowed")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_search_space_is_hydras_syntax_as_optuna_distributions():
    """An interval is continuous (Hydra's grammar reads its ends as floats; an int search is a
    range), on a log scale where tagged; a range steps over exactly Hydra's values (its stop out);
    a grid is every value of a choice or a range."""
    from unitrain.launch.hyperparameter_search import distribution, grid

    d = optuna.distributions
    assert distribution("a", "interval(1,8)") == d.FloatDistribution(1.0, 8.0)
    assert distribution("a", "tag(log, interval(1e-4,0.1))") == d.FloatDistribution(1e-4, 0.1, log=True)
    assert distribution("a", "range(2,10,3)") == d.IntDistribution(2, 8, step=3)
    assert distribution("a", "range(0.25,1.0,0.25)") == d.FloatDistribution(0.25, 0.75, step=0.25)
    assert distribution("a", "choice(sgd,adamw)") == d.CategoricalDistribution(["sgd", "adamw"])
    assert distribution("a", "0.5") is None
    steps = distribution("b", "range(0.1,0.35,0.1)")
    assert grid({"a": distribution("a", "range(2,10,3)"), "b": steps}) == {"a": [2, 5, 8], "b": [0.1, 0.2, 0.3]}


def test_the_command_lines_last_word_on_a_key_says_whether_it_is_searched():
    """As for any override: a plain value after a dimension (or over an experiment's) fixes the
    key, a dimension after a value searches it (the job ran the plain value while its trial
    recorded the searched one)."""
    from omegaconf import OmegaConf

    from unitrain.launch.hyperparameter_search import dimensions, plain

    params = {"optim.lr": "interval(0.01,0.1)", "trainer.steps": "range(1,4)"}
    cfg = OmegaConf.create({"hydra": {"sweeper": {"params": params}}})
    overrides = ["trainer.steps=2", "trainer.batch_size=range(4,12,4)", "trainer.batch_size=8"]
    overrides += ["trainer.epochs=1", "trainer.epochs=range(1,3)"]
    assert [d.key for d in dimensions(cfg, overrides)] == ["optim.lr", "trainer.epochs"]
    assert plain(overrides) == ["trainer.steps=2", "trainer.batch_size=8"]


def _study_with(sweep_dir, distribution, complete: int) -> None:
    sweep_dir.mkdir(parents=True)
    study = optuna.create_study(study_name="unitrain", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    for i in range(complete):
        trial = optuna.trial.create_trial(params={"optim.lr": 0.01}, distributions={"optim.lr": distribution}, value=i)
        study.add_trial(trial)


def test_a_study_over_another_search_space_is_refused(tmp_path):
    _study_with(tmp_path / "multirun", optuna.distributions.FloatDistribution(0.001, 0.2), complete=1)
    said = refusal([*SEARCH, "backend=torch", LR, "hydra.sweeper.n_trials=3"], tmp_path)
    assert "its study searched {optim.lr: FloatDistribution(high=0.2, log=False" in said
    assert "this search {optim.lr: FloatDistribution(high=0.5, log=True" in said


def test_a_finished_study_is_refused_rather_than_run_again(tmp_path):
    _study_with(tmp_path / "multirun", optuna.distributions.FloatDistribution(0.001, 0.5, log=True), complete=2)
    said = refusal([*SEARCH, "backend=torch", LR, "hydra.sweeper.n_trials=2"], tmp_path)
    assert "hydra.sweeper.n_trials=2 is not allowed: the study in" in said and "has 2 finished trials" in said
    assert refusal([*SEARCH, "backend=torch", LR, "hydra.sweeper.n_trials=3"], tmp_path) is None


def test_the_objective_is_the_held_out_result_or_the_time_to_the_target_else_the_worst(tmp_path):
    from omegaconf import OmegaConf

    from unitrain.train.objective import value

    heldout = OmegaConf.create({"metric": "heldout", "target": None})
    to_target = OmegaConf.create({"metric": "time_to_target", "target": 0.5})
    assert value(heldout, {"eval": {"val_top1": 0.75}}, tmp_path) == 0.75
    assert value(heldout, {"eval": {"val_auc": 0.81}}, tmp_path) == 0.81  # wide&deep
    assert value(heldout, {"eval": None}, tmp_path) == value(heldout, None, tmp_path) == -math.inf
    evals = [{"step": 2, "val_top1": 0.4, "elapsed_s": 3.0}, {"step": 4, "val_top1": 0.6, "elapsed_s": 7.5}]
    steps = [{"step": s, "loss": 1.0, "elapsed_s": s} for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps + evals))
    assert value(to_target, {"eval": evals[-1]}, tmp_path) == 7.5
    assert value(OmegaConf.create({"metric": "time_to_target", "target": 0.9}), {"eval": {}}, tmp_path) == math.inf


def test_a_second_search_into_a_running_searchs_directory_is_refused(tmp_path):
    """A search holds its directory while it runs: a second one there would resume its study
    and take its running trial for a killed one."""
    import fcntl

    sweep = tmp_path / "multirun"
    sweep.mkdir()
    with open(sweep / ".search.lock", "a+") as running:  # as the first search's process holds it
        fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
        said = refusal([*SEARCH, "backend=torch", LR], tmp_path)
    assert said is not None and "is not allowed: another search is running in it" in said
    assert refusal([*SEARCH, "backend=torch", LR], tmp_path) is None
