"""Training and evaluation of the WNUT-17 linear-chain CRF (:class:`motifs.crf.LinearChainCRF`).

* :func:`build_feature_list`: the feature strings of a training set;
* :func:`train_crf`: minibatch AdaGrad on the mean sentence NLL;
* :func:`evaluate`: Viterbi decoding scored by token accuracy, token F1 over non-``O`` tags
  and entity F1 over BIO spans (:func:`entity_spans`, :func:`precision_recall_f1`).

Used by ``python -m experiments.train_crf`` (which trains the shipped CRF) and
``python -m experiments.ner_study``.

Example:
    >>> from motifs.crf import load_crf
    >>> evaluate(load_crf(), [(["I", "love", "Paris"], ["O", "O", "B-location"])])["entity"]["f1"]
    1.0
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from motifs.crf import LinearChainCRF, Sentence, token_features

__all__ = ["build_feature_list", "entity_spans", "evaluate", "precision_recall_f1", "train_crf"]


# ---------------------------------------------------------------------------- features
def build_feature_list(sentences: Sequence[Sequence[str]], min_count: int = 2) -> list[str]:
    """Feature strings seen on at least ``min_count`` tokens of ``sentences``, sorted.

    Example:
        >>> build_feature_list([["a", "b"], ["a"]], min_count=2)[:3]
        ['b', 'first', 'last']
    """
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts: Counter[str] = Counter()
    for tokens in sentences:
        for feats in token_features(tokens):
            counts.update(set(feats))
    return sorted(f for f, c in counts.items() if c >= min_count)


# ---------------------------------------------------------------------------- training
class _Corpus:
    """Featurized sentences packed once: token features ``[N+1, M]`` and token index ``[S, T]``."""

    def __init__(self, crf: LinearChainCRF, sentences: Sequence[Sentence]) -> None:
        feats, mask = crf.featurize([s for s, _ in sentences])
        self.feats, self.mask = feats, mask
        tags = torch.zeros(mask.shape, dtype=torch.long)
        for b, (_, labels) in enumerate(sentences):
            tags[b, : len(labels)] = crf.tag_ids(labels)
        self.tags = tags
        self.lengths = mask.long().sum(-1)

    def batch(self, index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        t_len = int(self.lengths[index].max())
        return self.feats[index, :t_len], self.mask[index, :t_len], self.tags[index, :t_len]


def train_crf(
    train: Sequence[Sentence],
    *,
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 0.2,
    l2: float = 1e-5,
    min_count: int = 2,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> tuple[LinearChainCRF, list[float]]:
    """Train a CRF by minibatch AdaGrad on the mean sentence NLL.

    The feature list comes from ``train`` (features on at least ``min_count`` tokens).
    Each epoch is one sweep over a fresh random permutation of the sentences;
    ``l2`` is AdaGrad's weight decay on all parameters (per step).

    Args:
        train: ``(tokens, tags)`` pairs.
        epochs: number of sweeps.
        batch_size: sentences per AdaGrad step.
        lr: AdaGrad learning rate.
        l2: L2 weight decay.
        min_count: feature count threshold.
        seed: seeds the permutation RNG (training is otherwise deterministic).
        log: optional callback for one line per epoch.

    Returns:
        ``(crf, epoch_losses)``: the trained CRF (``metadata["training"]`` filled) and the
        mean training NLL per sentence of each epoch.

    Example:
        >>> from motifs.crf import read_conll
        >>> from neuralblock.io import data_path
        >>> data = read_conll(data_path("ner_wnut17", "wnut17train.conll"))[:20]
        >>> crf, losses = train_crf(data, epochs=2, batch_size=10, seed=0)
        >>> losses[1] < losses[0]
        True
    """
    if epochs < 1 or batch_size < 1 or not lr > 0 or l2 < 0:
        raise ValueError(f"bad training settings epochs={epochs} batch_size={batch_size} lr={lr} l2={l2}")
    if not train:
        raise ValueError("no training sentences")
    t0 = time.perf_counter()
    crf = LinearChainCRF(build_feature_list([s for s, _ in train], min_count))
    corpus = _Corpus(crf, train)
    opt = torch.optim.Adagrad(crf.parameters(), lr=lr, weight_decay=l2)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    n = len(train)
    crf.train()
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator)
        total = 0.0
        for i in range(0, n, batch_size):
            feats, mask, tags = corpus.batch(perm[i : i + batch_size])
            loss = crf.nll(feats, mask, tags)
            opt.zero_grad(set_to_none=True)
            loss.mean().backward()
            opt.step()
            total += float(loss.detach().sum())
        losses.append(total / n)
        if log is not None:
            log(f"epoch {epoch + 1}/{epochs}: mean NLL {losses[-1]:.4f} ({time.perf_counter() - t0:.1f}s)")
    crf.eval()
    crf.metadata["training"] = {
        "optimizer": "Adagrad",
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "l2_weight_decay": l2,
        "min_count": min_count,
        "seed": seed,
        "num_sentences": n,
        "num_tokens": int(corpus.lengths.sum()),
        "epoch_mean_nll": losses,
        "seconds": time.perf_counter() - t0,
    }
    return crf, losses


# ---------------------------------------------------------------------------- evaluation
def entity_spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """BIO entity spans ``(start, end_exclusive, type)`` (conlleval rules: ``I-X`` after
    ``O`` or another type starts a new entity).

    Example:
        >>> sorted(entity_spans(["B-person", "I-person", "O", "I-location"]))
        [(0, 2, 'person'), (3, 4, 'location')]
    """
    spans: set[tuple[int, int, str]] = set()
    start, kind = -1, ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, typ = tag.partition("-")
        continues = prefix == "I" and typ == kind and start >= 0
        if start >= 0 and not continues:
            spans.add((start, i, kind))
            start, kind = -1, ""
        if prefix in ("B", "I") and not continues:
            start, kind = i, typ
    return spans


def precision_recall_f1(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    """Precision, recall and F1 from counts (0.0 where a ratio has no denominator).

    Example:
        >>> precision_recall_f1(tp=2, n_pred=4, n_gold=2)
        {'precision': 0.5, 'recall': 1.0, 'f1': 0.6666666666666666}
    """
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def evaluate(crf: LinearChainCRF, sentences: Sequence[Sentence]) -> dict[str, Any]:
    """Viterbi-decode ``sentences`` and score against their gold tags.

    Returns:
        ``token_accuracy``; ``token`` precision/recall/F1 over non-``O`` tokens (exact tag
        match); ``entity`` precision/recall/F1 over BIO spans (exact span and type);
        ``num_sentences``, ``num_tokens``, ``num_entities``.

    Example:
        >>> from motifs.crf import load_crf, read_conll
        >>> from neuralblock.io import data_path
        >>> crf = load_crf()
        >>> m = evaluate(crf, read_conll(data_path("ner_wnut17", "emerging.dev.conll"))[:50])
        >>> 0.5 < m["token_accuracy"] <= 1.0
        True
    """
    pred_all = crf.decode([s for s, _ in sentences])
    correct = n_tok = tp_tok = pred_tok = gold_tok = 0
    tp_ent = pred_ent = gold_ent = 0
    for (_, gold), pred in zip(sentences, pred_all):
        for g, p in zip(gold, pred):
            n_tok += 1
            correct += g == p
            gold_tok += g != "O"
            pred_tok += p != "O"
            tp_tok += g == p and g != "O"
        gs, ps = entity_spans(gold), entity_spans(pred)
        tp_ent += len(gs & ps)
        pred_ent += len(ps)
        gold_ent += len(gs)
    return {
        "token_accuracy": correct / max(n_tok, 1),
        "token": precision_recall_f1(tp_tok, pred_tok, gold_tok),
        "entity": precision_recall_f1(tp_ent, pred_ent, gold_ent),
        "num_sentences": len(sentences),
        "num_tokens": n_tok,
        "num_entities": gold_ent,
    }
