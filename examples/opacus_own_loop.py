"""Certify your own opacus training loop with dpcl: split digits, 5 tasks, one certificate per task.

The model, data loaders and training loop are plain PyTorch + opacus. The dpcl lines (marked
``# dpcl``) open a Certifier, make opacus use the dpcl accountant, charge each task's DP-SGD
schedule before training on it, and release every checkpoint with its certificate. Each task is
trained with ``make_private_with_epsilon`` at epsilon = 1 (calibrated by dpcl); tasks hold
disjoint images, so the stream costs its worst task (Tobaben et al., Thm 4.4). The model is simply
fine-tuned task after task, so it forgets earlier tasks: the example shows certification, not a
continual-learning method. An ``--out`` that holds a run is refused unless ``--resume`` continues it
after its last certified task.

    python examples/opacus_own_loop.py --out runs/opacus_own_loop
    dpcl verify runs/opacus_own_loop
"""

from __future__ import annotations

import argparse
import io
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpcl.integrations.opacus  # dpcl: registers PrivacyEngine(accountant="dpcl")
from dpcl import Certifier, ReleaseCoverage  # dpcl
from dpcl.data.digits import load_digits
from dpcl.data.streams import class_incremental_stream

TASKS = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
EPSILON, DELTA, EPOCHS, BATCH = 1.0, 1e-5, 5, 32


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/opacus_own_loop", help="run directory (default: runs/opacus_own_loop)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out after its last certified task")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initialisation and split (never of the noise)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")  # dpcl seeds the noise from OS entropy
    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # opacus' hooks on the first layer

    stream = class_incremental_stream(load_digits(), TASKS, seed=args.seed)
    torch.manual_seed(args.seed)  # the initialisation only: attach gives opacus dpcl's noise generators
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    certifier = Certifier(args.out, delta=DELTA, label_space="prior_const", prior_labels=list(range(10)),  # dpcl
                          disjoint_units=True, method="opacus DP-SGD, 2-layer MLP", resume=args.resume)
    done = certifier.ledger.released_tasks()
    if done:  # resume: continue from the last released checkpoint
        model.load_state_dict(torch.load(certifier.checkpoints_dir / f"task{done[-1] + 1:03d}.pt"))

    for task in stream:
        t = task.index
        if t in done:
            continue
        keep = certifier.filter_labels(t, task.train.labels)
        data = TensorDataset(torch.from_numpy(task.train.features[keep]), torch.from_numpy(task.train.labels[keep]))
        engine = PrivacyEngine(accountant="dpcl")
        private, optimizer, loader = engine.make_private_with_epsilon(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), data_loader=DataLoader(data, BATCH),
            target_epsilon=EPSILON, target_delta=DELTA, epochs=EPOCHS, max_grad_norm=1.0,
        )
        # dpcl: charge the schedule; DP noise and Poisson sampling from generators seeded from OS entropy
        dpcl.integrations.opacus.attach(engine, certifier.task(t), optimizer=optimizer, data_loader=loader,  # dpcl
                                        epochs=EPOCHS, unit_ids=task.train.unit_ids[keep])
        for _ in range(EPOCHS):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(private(x), y).backward()
                optimizer.step()
        model = private.to_standard_module()

        checkpoint = io.BytesIO()
        torch.save(model.state_dict(), checkpoint)
        release = certifier.release(t, checkpoint.getvalue(), filename=f"task{t + 1:03d}.pt",  # dpcl
                                    coverage=ReleaseCoverage.post_processing(
                                        "the weights are updated only by the charged DP-SGD steps"),
                                    assumptions=["Each digit image is one privacy unit; the initialisation and "
                                                 "the label sets are public."])
        seen = stream.seen_test(t)
        with torch.no_grad():
            predicted = model(torch.tensor(seen.features)).argmax(dim=1).numpy()
        print(f"task {t + 1}: noise multiplier {optimizer.noise_multiplier:.3f}, {len(engine.accountant)} steps, "
              f"epsilon {release.epsilon:.3f} (delta {release.delta:g}), accuracy on seen tasks "
              f"{(predicted == seen.labels).mean():.3f}, certificate {release.certificate}")


if __name__ == "__main__":
    main()
