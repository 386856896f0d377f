"""Certify a hand-written Gaussian release with dpcl.Certifier (numpy only, no training framework).

A nearest-class-mean classifier on split digits (scikit-learn's digits, 5 tasks of 2 classes).
For each task it releases the noisy per-class sums of L2-normalised features: one Gaussian
mechanism whose add/remove l2 sensitivity is 1 (one example moves one class sum by a unit
vector), calibrated to epsilon = 1 per task. Predictions use cosine similarity to the noisy sums,
so the classifier is a post-processing of the releases. Tasks hold disjoint images, so the stream
costs its worst task (Tobaben et al., Thm 4.4): epsilon = 1 after every task.

    python examples/plain_loop.py --out runs/plain_loop
    dpcl verify runs/plain_loop
"""

from __future__ import annotations

import argparse
import io

import numpy as np

from dpcl import Certifier, ReleaseCoverage
from dpcl.accounting.events import GaussianEvent
from dpcl.accounting.gaussian import gaussian_sigma
from dpcl.data.digits import load_digits
from dpcl.data.streams import class_incremental_stream

TASKS = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
EPSILON, DELTA = 1.0, 1e-5


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/plain_loop", help="run directory (default: runs/plain_loop)")
    args = parser.parse_args(argv)

    stream = class_incremental_stream(load_digits(), TASKS, seed=0)
    certifier = Certifier(args.out, delta=DELTA, label_space="prior", prior_labels=TASKS,
                          disjoint_units=True, method="noisy class sums (numpy)")  # refuses an --out holding a run
    sigma = float(gaussian_sigma(EPSILON, DELTA, sensitivity=1.0))  # analytic calibration (Balle & Wang 2018)
    sums = np.zeros((10, stream[0].train.features.shape[1]))

    for task in stream:
        t = task.index
        keep = certifier.filter_labels(t, task.train.labels)  # public label set of the task (Eq. 6)
        noise = certifier.numpy_noise_generator(t)  # seeded from OS entropy by dpcl, stated in the certificate
        x, y = task.train.features[keep], task.train.labels[keep]
        certifier.charge(t, GaussianEvent(sigma=sigma, sensitivity=1.0), unit_ids=task.train.unit_ids[keep])
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # every example: norm 1
        labels = list(certifier.labels(t))
        class_sums = np.stack([x[y == label].sum(axis=0) for label in labels])
        sums[labels] = class_sums + noise.normal(0.0, sigma, size=class_sums.shape)

        buffer = io.BytesIO()
        np.savez(buffer, class_sums=sums, seen_labels=np.arange(2 * (t + 1)))
        release = certifier.release(
            t, buffer.getvalue(), filename=f"task{t + 1:03d}.npz",
            coverage=ReleaseCoverage.post_processing(
                "the checkpoint holds the noisy class sums released by the charged Gaussian mechanisms and "
                "nothing else computed from the private data"),
            assumptions=["Floating-point effects of sampling the Gaussian noise are not modelled."],
        )
        seen = stream.seen_test(t)
        unit = seen.features / np.maximum(np.linalg.norm(seen.features, axis=1, keepdims=True), 1e-12)
        scores = unit @ (sums[: 2 * (t + 1)] / np.linalg.norm(sums[: 2 * (t + 1)], axis=1, keepdims=True)).T
        accuracy = float(np.mean(scores.argmax(axis=1) == seen.labels))
        print(f"task {t + 1}: epsilon {release.epsilon:.3f} (delta {release.delta:g}), accuracy on seen tasks "
              f"{accuracy:.3f}, certificate {release.certificate}")


if __name__ == "__main__":
    main()
