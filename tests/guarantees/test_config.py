"""Config loading: schema, defaults, unknown keys refused by name, wrong types and ranges."""

from __future__ import annotations

import copy

import pytest

from dpcl.errors import ConfigError
from dpcl.guarantees.config import load_config, parse_config

BASE = {
    "privacy": {"epsilon": 1.0, "delta": 1e-5},
    "stream": {
        "dataset": "digits",
        "tasks": [[0, 1], [2, 3]],
        "label_space": "prior",
        "prior_labels": [[0, 1], [2, 3]],
        "disjoint_units": True,
    },
    "method": {"name": "peft_ensemble", "epochs": 1, "batch_size": 8, "max_grad_norm": 1.0},
}


def _with(path: tuple[str, ...], value):
    raw = copy.deepcopy(BASE)
    target = raw
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()


def test_defaults_filled():
    cfg = parse_config(BASE)
    assert cfg.settings.adjacency == "add_remove"
    assert cfg.settings.accountant == "auto" and cfg.settings.across_tasks == "auto"
    assert cfg.settings.total_epsilon is None
    assert cfg.method["adapter_dim"] == 64 and cfg.method["aggregation"] == "argmax"
    assert cfg.method["max_grad_norm"] == 1.0 and isinstance(cfg.method["max_grad_norm"], float)
    assert cfg.n_tasks == 2 and cfg.spec.name == "peft_ensemble"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("privacy", "epsilon"), 0.0, r"\[privacy\] epsilon must be > 0"),
        (("privacy", "epsilon"), "1", r"\[privacy\] epsilon must be a finite number"),
        (("privacy", "epsilon"), float("inf"), r"\[privacy\] epsilon must be a finite number"),
        (("privacy", "delta"), 1.0, r"\[privacy\] delta must lie in \(0, 1\)"),
        (("privacy", "delta"), _DELETE, r"\[privacy\] delta is required"),
        (("privacy", "accountant"), "moments", r"\[privacy\] accountant must be one of 'prv', 'pld', 'rdp', 'auto'"),
        (("privacy", "across_tasks"), "both", r"\[privacy\] across_tasks must be one of"),
        (("privacy", "adjacency"), "swap", r"\[privacy\] adjacency must be one of"),
        (("privacy", "total_epsilon"), -1, r"\[privacy\] total_epsilon must be > 0"),
        (("privacy", "total_delta"), 1e-6, r"total_delta is only allowed together with total_epsilon"),
        (("privacy", "epsilom"), 1.0, r"unknown \[privacy\] key\(s\) epsilom; allowed: epsilon"),
        (("stream", "label_space"), "public", r"\[stream\] label_space must be one of 'data', 'prior', 'prior_const'"),
        (("stream", "disjoint_units"), "yes", r"\[stream\] disjoint_units must be true or false"),
        (("stream", "disjoint_units"), _DELETE, r"\[stream\] disjoint_units is required"),
        (("stream", "prior_labels"), _DELETE, r"\[stream\] prior_labels is required when label_space = 'prior'"),
        (("stream", "tasks"), [[0, "a"]], r"\[stream\] tasks\[0\] must contain integers"),
        (("stream", "task_sizes"), [10], r"task_sizes gives 1 sizes for 2 tasks"),
        (("stream", "task_sizes"), [10, -1], r"task_sizes must contain integers >= 0"),
        (("stream", "colour"), "red", r"unknown \[stream\] key\(s\) colour"),
        (("method", "name"), "sgd", r"\[method\] name must be one of agem, cosine, l2dpml, naive, non_cl, pecl, peft_ensemble; got .sgd."),
        (("method", "name"), _DELETE, r"\[method\] name is required"),
        (("method", "epochs"), _DELETE, r"\[method\] epochs is required for method 'peft_ensemble'"),
        (("method", "epochs"), 0, r"\[method\] epochs must be an integer >= 1"),
        (("method", "epochs"), 1.5, r"\[method\] epochs must be int"),
        (("method", "batch_size"), True, r"\[method\] batch_size must be int"),
        (("method", "aggregation"), "vote", r"\[method\] aggregation must be one of 'argmax'"),
        (("method", "lr"), 0.1, r"unknown \[method\] key\(s\) lr; allowed: epochs"),
        (("extra",), {}, r"unknown top-level section\(s\) or key\(s\) extra; a config has the sections \[privacy\], \[stream\], \[method\]"),
        (("stream", "prior_labels"), [[0, 1]], r"\[stream\] prior_labels must give one label list per task \(2 tasks\)"),
        (("stream", "prior_labels"), [0, 1], r"\[stream\] prior_labels must be a list of per-task label lists"),
        (("stream", "prior_labels"), [[0, "a"], [2]], r"\[stream\] prior_labels\[0\] must contain integer labels"),
        (("stream", "prior_labels"), [[True], [2]], r"\[stream\] prior_labels\[0\] must contain integer labels"),
        (("stream", "prior_labels"), [], r"\[stream\] prior_labels must be a non-empty list"),
    ],
)
def test_invalid_configs_name_the_key(path, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(_with(path, value))


def test_cosine_keys():
    raw = _with(("method",), {"name": "cosine", "learning_rate": 0.1})
    with pytest.raises(ConfigError, match=r"unknown \[method\] key\(s\) learning_rate; allowed: device, epochs"):
        parse_config(raw)
    # the example: DP-SGD keys on a cosine config are accepted (and noted as unused by the audit)
    cfg = parse_config(_with(("method",), {"name": "cosine", "epochs": 2, "batch_size": 64, "max_grad_norm": 1.0}))
    assert cfg.method["epochs"] == 2 and cfg.method["device"] == "cpu"
    with pytest.raises(ConfigError, match=r"\[method\] epochs must be an integer >= 1"):
        parse_config(_with(("method",), {"name": "cosine", "epochs": 0}))


def test_data_stream_keys_accepted_only_when_declared():
    raw = _with(("stream", "kind"), "blurry")
    with pytest.raises(ConfigError, match="unknown \\[stream\\] key\\(s\\) kind"):
        parse_config(raw)
    cfg = parse_config(raw, data_stream_keys=["dataset", "kind", "seed"])
    assert cfg.stream["kind"] == "blurry"


def test_missing_sections():
    for section in ("privacy", "stream", "method"):
        raw = copy.deepcopy(BASE)
        del raw[section]
        with pytest.raises(ConfigError, match=rf"needs a \[{section}\] section"):
            parse_config(raw)


def test_load_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[privacy\nepsilon = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    good = tmp_path / "good.toml"
    good.write_text(
        "[privacy]\nepsilon = 1\ndelta = 1e-5\n[stream]\ndataset = 'x'\ntask_sizes = [5, 6]\n"
        "label_space = 'prior_const'\nprior_labels = [0, 1]\ndisjoint_units = false\n[method]\nname = 'cosine'\n"
    )
    cfg = load_config(good)
    assert cfg.n_tasks == 2 and cfg.stream["task_sizes"] == [5, 6]
    assert cfg.to_dict()["stream"]["task_sizes"] == [5, 6]


def test_task_sizes_must_cover_every_task_of_an_n_tasks_stream():
    # a permuted stream of 6 tasks audited from 4 sizes would leave 2 tasks' releases out of a sequential epsilon
    raw = copy.deepcopy(BASE)
    raw["stream"].pop("tasks", None)
    raw["stream"].update(task_sizes=[500, 500, 500, 500], n_tasks=6, kind="permuted", label_space="prior_const",
                         prior_labels=[0, 1, 2, 3])
    with pytest.raises(ConfigError, match=r"task_sizes gives 4 sizes but n_tasks = 6"):
        parse_config(raw, data_stream_keys=("n_tasks", "kind"))
    raw["stream"]["n_tasks"] = 4
    assert parse_config(raw, data_stream_keys=("n_tasks", "kind")).n_tasks == 4


def test_run_section_defaults_and_keys():
    cfg = parse_config(BASE)
    assert dict(cfg.run) == {"private": True, "reproducible_noise": False} and cfg.private is True
    cfg = parse_config({**copy.deepcopy(BASE), "run": {"private": False, "reproducible_noise": True}})
    assert cfg.private is False and cfg.run["reproducible_noise"] is True
    assert cfg.to_dict()["run"] == {"private": False, "reproducible_noise": True}


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"privat": True}, r"unknown \[run\] key\(s\) privat; allowed: private, reproducible_noise"),
        ({"private": "no"}, r"\[run\] private must be bool"),
        ({"private": 0}, r"\[run\] private must be bool"),
        ({"reproducible_noise": 1}, r"\[run\] reproducible_noise must be bool"),
    ],
)
def test_run_section_refuses_unknown_keys_and_wrong_types(run, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**copy.deepcopy(BASE), "run": run})
    with pytest.raises(ConfigError, match=r"\[run\] must be a table"):
        parse_config({**copy.deepcopy(BASE), "run": True})


def test_prior_const_labels_checked_at_load():
    raw = _with(("stream", "label_space"), "prior_const")
    raw["stream"]["prior_labels"] = [0, [1]]
    with pytest.raises(ConfigError, match=r"\[stream\] prior_labels must contain integer labels only, got \[1\]"):
        parse_config(raw)
    raw["stream"]["prior_labels"] = [[], []]
    with pytest.raises(ConfigError, match=r"\[stream\] prior_labels gives no label at all"):
        parse_config(raw)
    raw["stream"]["prior_labels"] = [[0, 1], [2, 3], [7]]  # prior_const: any number of lists, their union
    assert parse_config(raw).stream["prior_labels"] == [[0, 1], [2, 3], [7]]
