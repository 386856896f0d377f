"""Scores and predictions of the PeCL learner: sensitivity scores (eq. 1-3) and inference on clean inputs."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from dpcl.errors import InvalidParameterError
from dpcl.methods.pecl.model import per_token_lm_loss
from dpcl.methods.pecl.sensitivity import TaskTokenStatistics, fuse_scores, sensitivity_scores

__all__ = ["Scoring"]


class Scoring:
    """Token scores and predictions of :class:`~dpcl.methods.pecl.learner.ContinualLM` (a mixin: it uses the
    learner's model, tokenizer and released label set)."""

    # ------------------------------------------------------------------ scores
    @torch.no_grad()
    def token_scores(self, ids: torch.Tensor, mask: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
        """Fused sensitivity scores (eq. 1) for every token, using the current model (clean inputs)."""
        table = torch.as_tensor(self.token_stats.score2_table(), dtype=torch.float32, device=self.device)
        self.model.eval()
        out = []
        for start in range(0, ids.shape[0], batch_size):
            b_ids, b_mask = ids[start : start + batch_size], mask[start : start + batch_size]
            _, lm_logits = self.model(self.embedding(b_ids), b_mask)
            nll = per_token_lm_loss(lm_logits, b_ids, b_mask)
            out.append(sensitivity_scores(nll, b_ids, b_mask, table, self.config.alpha))
        return torch.cat(out) if out else torch.zeros_like(ids, dtype=torch.float32)

    @torch.no_grad()
    def public_scores(self) -> dict[str, Any]:
        """Sensitivity scores of ``training = "dp_sgd"``, from the public corpus only (computed once, cached).

        * Score_2 (eq. 3) from the token counts of the public corpus, each public
          category one "task" of eq. 3 (one group when no public labels are given:
          Score_2 is then 0);
        * Score_1 (eq. 2) of a vocabulary entry: its mean surprise over its
          occurrences in the public corpus under the public pre-trained model
          (entries absent from the corpus: the corpus mean);
        * ``table[v]``: the fused Score (eq. 1) of entry ``v``;
        * ``mean_score``: the mean fused score of the public corpus' tokens (eq. 1
          in context) -- it sets lambda_dyn (eq. 11) and the one TDP sigma.

        Called before any private task is trained (in the constructor), so
        neither the private text nor a private release enters it.
        """
        if self._public_scores is not None:
            return self._public_scores
        cfg = self.config
        if not self.public_texts:
            raise InvalidParameterError("training='dp_sgd' needs a public corpus for its scores; public_texts is empty.")
        ids, mask = self._encode(self.public_texts)
        stats = TaskTokenStatistics(self.token_stats.vocab_size, self.tokenizer.special_ids, cfg.tau)
        groups = np.zeros(len(self.public_texts), dtype=np.int64) if self.public_labels is None else self.public_labels
        ids_np, mask_np = ids.cpu().numpy(), mask.cpu().numpy()
        for group in np.unique(groups):  # one "task" of eq. 3 per public category (a handful, not per token)
            stats.add_task(ids_np[groups == group], mask_np[groups == group])
        score2 = torch.as_tensor(stats.score2_table(), dtype=torch.float32, device=self.device)
        self.model.eval()
        if self.model.generative:
            nll = torch.cat([
                per_token_lm_loss(self.model(self.embedding(ids[s : s + 64]), mask[s : s + 64])[1], ids[s : s + 64],
                                  mask[s : s + 64])
                for s in range(0, ids.shape[0], 64)
            ])
        else:  # an encoder has no surprise (Score_1): alpha = 0 is required, the score is Score_2 alone
            nll = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)
        valid = mask.bool().clone()
        valid[:, 0] = False
        vocab = self.token_stats.vocab_size
        flat_ids, flat_nll = ids[valid], nll[valid].double()
        sums = torch.zeros(vocab, dtype=torch.float64, device=self.device).index_add_(0, flat_ids, flat_nll)
        counts = torch.bincount(flat_ids, minlength=vocab)[:vocab].double()
        corpus_mean = float(flat_nll.mean()) if flat_nll.numel() else 0.0
        score1 = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, corpus_mean))
        table = fuse_scores(score1.float().clamp_min(0.0), score2, cfg.alpha)
        table[list(self.tokenizer.special_ids)] = 0.0
        in_context = sensitivity_scores(nll, ids, mask, score2, cfg.alpha)
        mean_score = float(in_context[valid].mean()) if bool(valid.any()) else 0.0
        self._public_scores = {
            "table": table,
            "mean_score": mean_score,
            "public_ids": ids[: min(64, ids.shape[0])],
            "public_mask": mask[: min(64, ids.shape[0])],
            "n_public_texts": len(self.public_texts),
            "n_public_groups": int(stats.n_tasks),
        }
        return self._public_scores

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def class_scores(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Class logits ``[n, n_labels]`` on clean inputs (test data is not trained on), in the order of ``texts``.

        Batches hold sequences of similar length, cut after their longest one (:meth:`_length_batches`)."""
        self.model.eval()
        ids, mask = self._encode(texts)
        out = torch.zeros((ids.shape[0], self.n_labels), dtype=torch.float32)
        for idx, length in self._length_batches(mask, batch_size):
            b_ids, b_mask = ids[idx, :length], mask[idx, :length]
            out[idx.cpu()] = self.model(self.embedding(b_ids), b_mask)[0].float().cpu()
        return out.numpy()

    def accuracies(self, texts: Sequence[str], labels: Sequence[int], label_set: Sequence[int] | None
                   ) -> tuple[float, float]:
        """(class-incremental, task-incremental) accuracy from one pass of :meth:`class_scores`: argmax over the
        labels released so far, and over ``label_set`` (every released label when None)."""
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size == 0:
            return float("nan"), float("nan")
        scores = self.class_scores(texts)
        return (float(np.mean(self._argmax(scores, None) == labels)),
                float(np.mean(self._argmax(scores, label_set) == labels)))

    def _argmax(self, scores: np.ndarray, label_set: Sequence[int] | None) -> np.ndarray:
        if label_set is None:
            allowed = self.seen
        else:
            allowed = np.zeros(self.n_labels, dtype=bool)
            allowed[np.asarray(label_set, dtype=np.int64)] = True
        return np.argmax(np.where(allowed[None, :], scores, -np.inf), axis=1)

    def label_nll(self, texts: Sequence[str], label: int) -> np.ndarray:
        """``-log p(label | text)`` (nats) of each text: the classifier's softmax over the labels released so far.

        An encoder's canary score (:func:`dpcl.methods.pecl.canary.canary_exposures`): with no likelihood of a
        text, a secret memorised from a (canary, label) training pair shows as a lower loss of the true canary
        under its label than of the same prefix with another secret."""
        label = int(label)
        if not 0 <= label < self.n_labels or not self.seen[label]:
            raise InvalidParameterError(
                f"label {label} is not one of the released labels {np.flatnonzero(self.seen).tolist()}; give the "
                "canary's training label."
            )
        scores = torch.as_tensor(self.class_scores(texts), dtype=torch.float64)
        scores[:, torch.as_tensor(~self.seen)] = -torch.inf
        return (-torch.log_softmax(scores, dim=1)[:, label]).numpy()

    def predict(self, texts: Sequence[str], label_set: Sequence[int] | None = None) -> np.ndarray:
        """argmax over the labels released so far (class-incremental prediction), or over ``label_set``
        (task-incremental prediction: the evaluated task's own public label set)."""
        if not self.seen.any():
            raise InvalidParameterError("predict called before any task was fitted.")
        return self._argmax(self.class_scores(texts), label_set)

    def accuracy(self, texts: Sequence[str], labels: Sequence[int], label_set: Sequence[int] | None = None) -> float:
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size == 0:
            return float("nan")
        return float(np.mean(self.predict(texts, label_set) == labels))

    @torch.no_grad()
    def sequence_nll(self, texts: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """Total negative log-likelihood (nats) of each text under the LM (log-perplexity x length)."""
        if not self.model.generative:
            raise InvalidParameterError(
                "sequence_nll needs a causal LM's next-token likelihood; the model is an encoder (no likelihood of "
                "a text): canary exposure by perplexity does not apply to it."
            )
        self.model.eval()
        ids, mask = self._encode(texts)
        out = []
        for s in range(0, ids.shape[0], batch_size):
            b_ids, b_mask = ids[s : s + batch_size], mask[s : s + batch_size]
            _, lm_logits = self.model(self.embedding(b_ids), b_mask)
            out.append(per_token_lm_loss(lm_logits, b_ids, b_mask).sum(1).double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)
