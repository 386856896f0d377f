"""Helpers of the runner tests: small digits configs written to a temporary directory."""

from __future__ import annotations

from pathlib import Path

TASKS = "[[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]"

METHOD_SECTIONS = {
    "cosine": 'name = "cosine"\n',
    "peft_ensemble": 'name = "peft_ensemble"\nepochs = 1\nbatch_size = 64\nmax_grad_norm = 1.0\n'
    "adapter_dim = 8\nlearning_rate = 0.05\n",
    "naive": 'name = "naive"\nepochs = 1\nbatch_size = 64\nmax_grad_norm = 1.0\nadapter_dim = 8\nlearning_rate = 0.05\n',
    "non_cl": 'name = "non_cl"\nepochs = 1\nbatch_size = 64\nmax_grad_norm = 1.0\nadapter_dim = 8\n'
    "learning_rate = 0.05\n",
}


def write_config(
    directory: Path,
    method: str = "cosine",
    *,
    epsilon: float = 2.0,
    label_space: str = "prior_const",
    tasks: str = TASKS,
    prior_labels: str | None = None,
    disjoint_units: bool = True,
    across_tasks: str = "auto",
    extra: str = "",
    method_extra: str = "",
    name: str = "config.toml",
    accountant: str | None = None,
) -> Path:
    """A digits config (5 class-incremental tasks by default) for ``method``.

    DP-SGD methods default to the RDP accountant: a sound upper bound that is much
    cheaper to compute than PLD/PRV for subsampled Gaussians, which keeps the tests short.
    """
    if accountant is None:
        accountant = "auto" if method == "cosine" else "rdp"
    text = (
        "[privacy]\n"
        f"epsilon = {epsilon}\n"
        "delta = 1e-5\n"
        f'across_tasks = "{across_tasks}"\n'
        f'accountant = "{accountant}"\n'
        "\n[stream]\n"
        'dataset = "digits"\n'
        f"tasks = {tasks}\n"
        f'label_space = "{label_space}"\n'
        f"prior_labels = {prior_labels or tasks}\n"
        f"disjoint_units = {'true' if disjoint_units else 'false'}\n"
        "\n[method]\n" + METHOD_SECTIONS[method] + method_extra + extra
    )
    path = Path(directory) / name
    path.write_text(text, encoding="utf-8")
    return path


def write_l2dpml_config(directory: Path, *, name: str = "l2dpml.toml") -> Path:
    """A two-task permuted-digits L2DP-ML config (one memory batch per task)."""
    path = Path(directory) / name
    path.write_text(
        '[privacy]\nepsilon = 4.0\ndelta = 1e-5\nadjacency = "replace_one"\naccountant = "auto"\n'
        '[stream]\ndataset = "digits"\nkind = "permuted"\nn_tasks = 3\nlabel_space = "prior_const"\n'
        "prior_labels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\ndisjoint_units = true\n"
        '[method]\nname = "l2dpml"\nhidden_sizes = [8, 4]\nbatch_size = 200\nepochs = 3\n',
        encoding="utf-8",
    )
    return path


def write_pecl_config(directory: Path, *, name: str = "pecl.toml", private: bool = False) -> Path:
    """A tiny two-task config of PeCL as in the paper on fortune texts (one epoch, a one-layer model).

    Its checkpoint is not covered by any charged release, so a private run of it is refused: by default it is
    a ``[run] private = false`` research run (the paper's noise, the per-token statement scoped to the input
    embeddings, certificates with ``private: false``)."""
    path = Path(directory) / name
    path.write_text(
        "[privacy]\nepsilon = 10.0\ndelta = 1e-6\nadjacency = \"replace_one\"\naccountant = \"auto\"\n"
        "across_tasks = \"auto\"\n\n[stream]\ndataset = \"fortunes_texts\"\n"
        "dataset_options = { categories = [\"food\", \"law\", \"science\", \"work\"], max_per_class = 6 }\n"
        "tasks = [[0, 1], [2, 3]]\nlabel_space = \"prior\"\nprior_labels = [[0, 1], [2, 3]]\n"
        "disjoint_units = true\n\n[method]\nname = \"pecl\"\ntraining = \"paper\"\nepsilon_lower = 1.0\n"
        "epsilon_upper = 10.0\n"
        "epochs = 1\nbatch_size = 8\nmax_seq_len = 32\nlora_rank = 2\nn_layer = 1\nn_embd = 16\nn_head = 2\n"
        "pretrain_steps = 2\n" + ("" if private else "\n[run]\nprivate = false\n"),
        encoding="utf-8",
    )
    return path
