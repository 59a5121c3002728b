"""The WNUT-17 linear-chain CRF as a model of tag sequences, and its sentence graphs.

The NER experiment of the seed paper samples the tag sequences of sentences under a
trained linear-chain CRF; the ``crf_tags`` motif (:mod:`motifs.crf_tags`) proposes blocks
of consecutive tags. This module holds what the motif needs:

* data: :func:`read_conll` reads ``token<TAB>tag`` files (WNUT-17, 13 BIO tags);
* features: :func:`token_features` gives sparse indicator features per token (word,
  shape, affixes, capitalisation, digits, ``#``/``@``, position, neighbouring words);
* the model: :class:`LinearChainCRF`, emission score = sum of feature weights per tag,
  a ``13 x 13`` transition matrix plus start/end scores; its inference runs the chain
  algorithms of :mod:`neuralblock.exact.chain` on folded potentials;
* files: :meth:`LinearChainCRF.save` and :func:`load_crf` (safetensors weights plus a
  JSON sidecar with the feature list, the tag order, the training config and metrics;
  never pickle);
* graphs: :meth:`LinearChainCRF.sentence_graph` builds the chain MRF of one sentence as
  a :class:`~neuralblock.graph.FactorGraph` whose ``log_joint`` equals the CRF score.

Training (AdaGrad) and evaluation (token and entity F1) live in ``experiments/crf_model.py``.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018 (NER experiment).
    Lafferty, McCallum, Pereira. "Conditional Random Fields". ICML 2001.

Example:
    >>> crf = load_crf()
    >>> crf.num_tags
    13
    >>> crf.decode([["Empire", "State", "Building", "is", "tall"]])[0][:3]
    ['B-location', 'I-location', 'I-location']
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from neuralblock.exact.chain import chain_forward, chain_marginals, chain_sample, chain_score, chain_viterbi
from neuralblock.graph import FactorGraph
from neuralblock.io import data_path
from neuralblock.proposals import proposal_files

__all__ = [
    "CRF_FORMAT",
    "FEATURE_VERSION",
    "TAGS",
    "LinearChainCRF",
    "Sentence",
    "default_crf_path",
    "load_crf",
    "read_conll",
    "token_features",
]

TAGS: tuple[str, ...] = (
    "O",
    "B-corporation",
    "I-corporation",
    "B-creative-work",
    "I-creative-work",
    "B-group",
    "I-group",
    "B-location",
    "I-location",
    "B-person",
    "I-person",
    "B-product",
    "I-product",
)
"""The 13 WNUT-17 BIO tags, in the CRF's fixed order (``O`` first)."""

CRF_FORMAT = "neuralblock.crf"
"""The ``format`` field of a CRF JSON sidecar."""

FEATURE_VERSION = 1
"""Version of :func:`token_features`; a sidecar with another version is refused."""

_WEIGHT_KEYS = ("emission", "transitions", "start", "end")

Sentence = tuple[list[str], list[str]]
"""One sentence as ``(tokens, tags)``."""


# ---------------------------------------------------------------------------- data
def read_conll(path: str | os.PathLike, tags: Sequence[str] = TAGS) -> list[Sentence]:
    """Read a ``token<TAB>tag`` file with blank (or whitespace-only) lines between sentences.

    Args:
        path: the CoNLL file.
        tags: the allowed tags.

    Returns:
        A list of ``(tokens, tags)`` pairs.

    Raises:
        ValueError: a line without a tag, or a tag outside ``tags`` (names file and line).

    Example:
        >>> sents = read_conll(data_path("ner_wnut17", "emerging.dev.conll"))
        >>> len(sents), sum(len(t) for t, _ in sents)
        (1009, 15733)
    """
    allowed = set(tags)
    sentences: list[Sentence] = []
    tokens: list[str] = []
    labels: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for lineno, raw in enumerate(handle, 1):
            line = raw.rstrip("\n").rstrip("\r")
            if not line.strip():
                if tokens:
                    sentences.append((tokens, labels))
                    tokens, labels = [], []
                continue
            parts = line.rsplit("\t", 1) if "\t" in line else line.rsplit(None, 1)
            if len(parts) != 2 or not parts[0] or not parts[1].strip():
                raise ValueError(f"{path} line {lineno}: expected 'token<TAB>tag', got {line!r}")
            tag = parts[1].strip()
            if tag not in allowed:
                raise ValueError(f"{path} line {lineno}: unknown tag {tag!r}; expected one of {sorted(allowed)}")
            tokens.append(parts[0])
            labels.append(tag)
    if tokens:
        sentences.append((tokens, labels))
    return sentences


def _shape(word: str) -> str:
    out: list[str] = []
    for ch in word:
        c = "X" if ch.isupper() else "x" if ch.islower() else "d" if ch.isdigit() else ch
        if not out or out[-1] != c:
            out.append(c)
    return "".join(out)[:8]


def token_features(tokens: Sequence[str]) -> list[list[str]]:
    """Sparse indicator feature strings of every token of a sentence.

    Templates: bias; lowercased word; word shape (``Xx``, ``x``, ``X``, ``d``, ... with
    repeats collapsed); prefixes and suffixes of length 1-3; capitalised / all-caps / has a
    digit / starts with ``#`` / ``@`` / looks like a URL / has no letter or digit; first /
    last position; lowercased words and shapes of the neighbours at -1 and +1.

    Args:
        tokens: the words of one sentence.

    Returns:
        One list of feature strings per token.

    Example:
        >>> token_features(["Hi", "@bob"])[1][:4]
        ['b', 'w=@bob', 'sh=@x', 'p1=@']
    """
    lower = [t.lower() for t in tokens]
    shapes = [_shape(t) for t in tokens]
    n = len(tokens)
    out: list[list[str]] = []
    for i, (tok, low) in enumerate(zip(tokens, lower)):
        feats = ["b", f"w={low}", f"sh={shapes[i]}"]
        feats += [f"p{k}={low[:k]}" for k in (1, 2, 3) if len(low) >= k]
        feats += [f"s{k}={low[-k:]}" for k in (1, 2, 3) if len(low) >= k]
        if tok[:1].isupper():
            feats.append("cap")
        if len(tok) > 1 and tok.isupper():
            feats.append("allcap")
        if any(ch.isdigit() for ch in tok):
            feats.append("dig")
        if tok.startswith("#"):
            feats.append("hash")
        if tok.startswith("@"):
            feats.append("at")
        if low.startswith(("http", "www.")):
            feats.append("url")
        if not any(ch.isalnum() for ch in tok):
            feats.append("punct")
        if i == 0:
            feats.append("first")
        if i == n - 1:
            feats.append("last")
        feats.append(f"w-1={lower[i - 1]}" if i > 0 else "w-1=<s>")
        feats.append(f"w+1={lower[i + 1]}" if i + 1 < n else "w+1=</s>")
        feats.append(f"sh-1={shapes[i - 1]}" if i > 0 else "sh-1=<s>")
        feats.append(f"sh+1={shapes[i + 1]}" if i + 1 < n else "sh+1=</s>")
        out.append(feats)
    return out


# ---------------------------------------------------------------------------- the model
class LinearChainCRF(nn.Module):
    """Linear-chain CRF with sparse indicator features.

    The emission score of tag ``y`` at a token is the sum of ``emission[f, y]`` over the
    token's known features ``f`` (unknown feature strings are dropped); the sequence
    score adds ``start[y_0]``, ``transitions[y_{t-1}, y_t]`` and ``end[y_{L-1}]``.

    Args:
        features: the feature strings, in weight-row order.
        tags: the tag names, in weight-column order.

    Attributes:
        metadata: free-form JSON data stored in the sidecar (config, metrics, seed).

    Example:
        >>> crf = LinearChainCRF(["b", "w=hi"], tags=["O", "B-x", "I-x"])
        >>> crf.unary_potentials(["hi", "you"]).shape
        torch.Size([2, 3])
    """

    def __init__(self, features: Sequence[str], tags: Sequence[str] = TAGS) -> None:
        super().__init__()
        tags = [str(t) for t in tags]
        if len(tags) < 2 or len(set(tags)) != len(tags):
            raise ValueError(f"tags must be >= 2 distinct names, got {tags}")
        features = [str(f) for f in features]
        if len(set(features)) != len(features):
            raise ValueError("feature strings must be distinct")
        self.tags: list[str] = tags
        self.tag_index: dict[str, int] = {t: i for i, t in enumerate(tags)}
        self.features: list[str] = features
        self.feature_index: dict[str, int] = {f: i for i, f in enumerate(features)}
        k = len(tags)
        self.emission = nn.Parameter(torch.zeros(len(features), k))
        self.transitions = nn.Parameter(torch.zeros(k, k))
        self.start = nn.Parameter(torch.zeros(k))
        self.end = nn.Parameter(torch.zeros(k))
        self.metadata: dict[str, Any] = {}

    @property
    def num_tags(self) -> int:
        """Number of tags ``K``."""
        return len(self.tags)

    @property
    def num_features(self) -> int:
        """Number of feature strings ``F``."""
        return len(self.features)

    # ------------------------------------------------------------ featurization
    def featurize(self, sentences: Sequence[Sequence[str]]) -> tuple[Tensor, Tensor]:
        """Padded feature ids of a batch of sentences.

        Returns:
            ``(feats [B, T, M], mask [B, T])``; ``feats`` is padded with ``F`` (a zero row).

        Example:
            >>> crf = LinearChainCRF(["b"], tags=["O", "B-x"])
            >>> crf.featurize([["a", "b"], ["c"]])[1]
            tensor([[ True,  True],
                    [ True, False]])
        """
        if not sentences or any(len(s) == 0 for s in sentences):
            raise ValueError("featurize needs at least one sentence and no empty sentence")
        index = self.feature_index
        ids = [[[index[f] for f in feats if f in index] for feats in token_features(s)] for s in sentences]
        t_len = max(len(s) for s in ids)
        m_len = max(1, max(len(tok) for s in ids for tok in s))
        pad = self.num_features
        pad_tok = [pad] * m_len
        rows = [tok + pad_tok[len(tok) :] for sent in ids for tok in sent + [[]] * (t_len - len(sent))]
        feats = torch.tensor(rows, dtype=torch.long).reshape(len(ids), t_len, m_len)
        lengths = torch.tensor([len(s) for s in ids])
        mask = torch.arange(t_len) < lengths[:, None]
        return feats, mask

    def emission_scores(self, feats: Tensor) -> Tensor:
        """Emission scores ``[..., K]`` of padded feature ids ``[..., M]`` (one gather-sum)."""
        table = torch.cat([self.emission, self.emission.new_zeros(1, self.num_tags)], 0)
        return table[feats].sum(-2)

    def fold(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """Unary potentials ``[B, T, K]``: emissions plus start (first) and end (last valid) scores."""
        lengths = mask.long().sum(-1)
        if (lengths < 1).any():
            raise ValueError("every chain needs at least one position")
        unary = emissions.clone()
        unary[:, 0] = unary[:, 0] + self.start
        rows = torch.arange(unary.shape[0])
        unary[rows, lengths - 1] = unary[rows, lengths - 1] + self.end
        return unary

    def potentials(self, feats: Tensor, mask: Tensor) -> Tensor:
        """Folded unary log-potentials ``[B, T, K]`` of featurized sentences."""
        return self.fold(self.emission_scores(feats), mask)

    def unary_potentials(self, tokens: Sequence[str]) -> Tensor:
        """Folded unary log-potentials ``[L, K]`` of one sentence (start/end included)."""
        feats, mask = self.featurize([list(tokens)])
        return self.potentials(feats, mask)[0]

    def tag_ids(self, tags: Sequence[str] | Tensor) -> Tensor:
        """Tag names (or ids) as a ``LongTensor``; unknown names raise ``ValueError``."""
        if isinstance(tags, Tensor):
            return tags.long()
        try:
            return torch.tensor([self.tag_index[t] for t in tags], dtype=torch.long)
        except KeyError as err:
            raise ValueError(f"unknown tag {err.args[0]!r}; expected one of {self.tags}") from None

    # ------------------------------------------------------------ inference
    def nll(self, feats: Tensor, mask: Tensor, tags: Tensor) -> Tensor:
        """Negative log-likelihood ``[B]`` of gold tags ``[B, T]``."""
        unary = self.potentials(feats, mask)
        _, log_z = chain_forward(unary, self.transitions, mask)
        return log_z - chain_score(unary, self.transitions, tags, mask)

    def score(self, tokens: Sequence[str], tags: Sequence[str] | Tensor) -> Tensor:
        """Unnormalized log score of tag sequences (names, or ids ``[..., L]``) of one sentence.

        Example:
            >>> crf = load_crf()
            >>> toks = ["I", "love", "Paris"]
            >>> bool(crf.score(toks, ["O", "O", "B-location"]) > crf.score(toks, ["O", "O", "I-group"]))
            True
        """
        with torch.no_grad():
            unary = self.unary_potentials(tokens)
            ids = self.tag_ids(tags)
            if ids.shape[-1] != unary.shape[0]:
                raise ValueError(f"{ids.shape[-1]} tags for a sentence of {unary.shape[0]} tokens")
            return chain_score(unary[None], self.transitions, ids.unsqueeze(-2)).squeeze(-1)

    def log_partition(self, tokens: Sequence[str]) -> Tensor:
        """``log Z`` of one sentence."""
        with torch.no_grad():
            return chain_forward(self.unary_potentials(tokens)[None], self.transitions)[1][0]

    def marginals(self, tokens: Sequence[str]) -> Tensor:
        """Tag marginals ``[L, K]`` of one sentence."""
        with torch.no_grad():
            return chain_marginals(self.unary_potentials(tokens)[None], self.transitions)[0]

    def sample(self, tokens: Sequence[str], num_samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """Exact samples ``[num_samples, L]`` of tag ids of one sentence (FFBS)."""
        with torch.no_grad():
            unary = self.unary_potentials(tokens)[None]
            return chain_sample(unary, self.transitions, None, num_samples, generator)[:, 0]

    def decode(self, sentences: Sequence[Sequence[str]], batch_size: int = 256) -> list[list[str]]:
        """Viterbi tag names of each sentence."""
        out: list[list[str]] = []
        with torch.no_grad():
            for i in range(0, len(sentences), batch_size):
                chunk = [list(s) for s in sentences[i : i + batch_size]]
                feats, mask = self.featurize(chunk)
                tags, _ = chain_viterbi(self.potentials(feats, mask), self.transitions, mask)
                out += [[self.tags[j] for j in row[: len(s)]] for row, s in zip(tags.tolist(), chunk)]
        return out

    # ------------------------------------------------------------ graphs
    def sentence_graph(self, tokens: Sequence[str]) -> FactorGraph:
        """The chain MRF of one sentence: one ``K``-ary variable per token.

        Unary table factors hold the emission scores (start added to the first token, end
        to the last); pairwise table factors over ``(t, t+1)`` hold the transitions, so
        ``fg.log_joint(tags) == crf.score(tokens, tags)``. Variables are named ``t0, t1, ...``.

        Example:
            >>> crf = load_crf()
            >>> fg = crf.sentence_graph(["Hello", "London"])
            >>> fg.num_variables, fg.num_factors
            (2, 3)
        """
        return self.corpus_graph([tokens])

    def corpus_graph(self, sentences: Sequence[Sequence[str]]) -> FactorGraph:
        """One FactorGraph holding the disconnected chain MRFs of many sentences.

        Variable ids run sentence by sentence (ids of sentence ``j`` follow those of
        ``j - 1``); names are ``t<i>`` for one sentence and ``s<j>.t<i>`` otherwise.

        Example:
            >>> crf = load_crf()
            >>> crf.corpus_graph([["a", "b"], ["c"]]).num_variables
            3
        """
        sentences = [list(s) for s in sentences]
        if not sentences or any(not s for s in sentences):
            raise ValueError("corpus_graph needs at least one sentence and no empty sentence")
        with torch.no_grad():
            feats, mask = self.featurize(sentences)
            unary = self.potentials(feats, mask)[mask]  # [N, K], sentence-major
            trans = self.transitions.detach()
        fg = FactorGraph()
        k = self.num_tags
        single = len(sentences) == 1
        ids: list[int] = []
        for j, sent in enumerate(sentences):
            for i in range(len(sent)):
                ids.append(fg.add_variable(f"t{i}" if single else f"s{j}.t{i}", k))
        dtype = torch.get_default_dtype()
        fg.add_table_factors(torch.tensor(ids, dtype=torch.long)[:, None], unary.to(dtype))
        starts = torch.tensor([0] + [len(s) for s in sentences]).cumsum(0)[:-1]
        left = torch.cat([torch.arange(int(s), int(s) + len(sent) - 1) for s, sent in zip(starts, sentences)])
        if left.numel():
            scopes = torch.stack([left, left + 1], 1)
            fg.add_table_factors(scopes, trans.to(dtype).expand(len(left), k, k))
        return fg

    # ------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> None:
        """Write ``<path>.safetensors`` weights and the ``<path>.json`` sidecar, atomically.

        The sidecar holds the tag order, the feature strings (row order), the feature
        version, the weight shapes and SHA-256, and :attr:`metadata`.
        """
        from safetensors.torch import save as st_save

        from neuralblock.proposals.proposal import atomic_write_bytes

        weights_path, json_path = _crf_paths(path)
        tensors = {key: getattr(self, key).detach().to(torch.float32).contiguous() for key in _WEIGHT_KEYS}
        blob = st_save(tensors, metadata={"format": CRF_FORMAT})
        sidecar = {
            "format": CRF_FORMAT,
            "version": 1,
            "feature_version": FEATURE_VERSION,
            "tags": self.tags,
            "num_features": self.num_features,
            "shapes": {key: list(t.shape) for key, t in tensors.items()},
            "weights_sha256": hashlib.sha256(blob).hexdigest(),
            **{k: v for k, v in self.metadata.items() if k not in _RESERVED},
            "features": self.features,
        }
        atomic_write_bytes(weights_path, blob)
        atomic_write_bytes(json_path, json.dumps(sidecar, indent=1).encode("utf-8"))


_RESERVED = {"format", "version", "feature_version", "tags", "num_features", "shapes", "weights_sha256", "features"}


def _crf_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, sidecar)`` of a CRF file stem: named as proposal files are (dots kept)."""
    return proposal_files(path)


def default_crf_path() -> Path:
    """The shipped WNUT-17 CRF, ``data/ner_wnut17/crf.safetensors``."""
    return data_path("ner_wnut17", "crf.safetensors")


def load_crf(path: str | os.PathLike | None = None) -> LinearChainCRF:
    """Load a CRF saved by :meth:`LinearChainCRF.save` (default: the shipped WNUT-17 CRF).

    Args:
        path: the ``.safetensors`` file (or its ``.json`` sidecar, or the common stem).

    Returns:
        The CRF in eval mode, with :attr:`LinearChainCRF.metadata` from the sidecar.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: the sidecar is not valid JSON or not a CRF sidecar, or the weights are
            truncated/corrupted (SHA-256 mismatch) or do not match the sidecar's shapes.

    Example:
        >>> crf = load_crf()
        >>> crf.num_features == len(crf.features) and crf.metadata["training"]["epochs"] == 10
        True
    """
    from neuralblock.proposals.proposal import load_checked_safetensors

    weights_path, json_path = _crf_paths(default_crf_path() if path is None else path)
    for p in (weights_path, json_path):
        if not p.is_file():
            raise FileNotFoundError(f"CRF file {p} does not exist")
    try:
        sidecar = json.loads(json_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{json_path}: not a valid JSON CRF sidecar ({err})") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != CRF_FORMAT:
        raise ValueError(f"{json_path}: not a CRF sidecar (expected format {CRF_FORMAT!r})")
    if sidecar.get("version") != 1 or sidecar.get("feature_version") != FEATURE_VERSION:
        raise ValueError(
            f"{json_path}: unsupported version {sidecar.get('version')!r} / feature_version "
            f"{sidecar.get('feature_version')!r} (expected 1 / {FEATURE_VERSION})"
        )
    tags, features = sidecar.get("tags"), sidecar.get("features")
    if not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise ValueError(f"{json_path}: 'tags' must be a list of strings")
    if not (isinstance(features, list) and all(isinstance(f, str) for f in features)):
        raise ValueError(f"{json_path}: 'features' must be a list of strings")
    if sidecar.get("num_features") != len(features):
        raise ValueError(
            f"{json_path}: num_features {sidecar.get('num_features')!r} != {len(features)} feature strings"
        )
    tensors = load_checked_safetensors(weights_path, sidecar.get("weights_sha256"))
    try:
        crf = LinearChainCRF(features, tags)
    except ValueError as err:
        raise ValueError(f"{json_path}: {err}") from None
    expected = {key: list(getattr(crf, key).shape) for key in _WEIGHT_KEYS}
    if set(tensors) != set(_WEIGHT_KEYS):
        raise ValueError(f"{weights_path}: tensors {sorted(tensors)}, expected {sorted(_WEIGHT_KEYS)}")
    for key in _WEIGHT_KEYS:
        got = list(tensors[key].shape)
        if got != expected[key] or sidecar.get("shapes", {}).get(key) != got:
            raise ValueError(
                f"{weights_path}: tensor {key!r} has shape {got}, the sidecar expects "
                f"{sidecar.get('shapes', {}).get(key)} and the feature/tag lists imply {expected[key]}"
            )
        if not torch.isfinite(tensors[key]).all():
            raise ValueError(f"{weights_path}: tensor {key!r} has non-finite values")
    with torch.no_grad():
        for key in _WEIGHT_KEYS:
            getattr(crf, key).copy_(tensors[key])
    crf.metadata = {k: v for k, v in sidecar.items() if k not in _RESERVED}
    return crf.eval()
