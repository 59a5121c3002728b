"""The ``crf_tags`` motif: ``n`` consecutive tag variables of a linear-chain MRF.

The NER experiment of the seed paper runs MCMC over the tag sequences of sentences
under a trained linear-chain CRF (:mod:`motifs.crf`). This motif proposes ``n = 2, 3, 4``
consecutive 13-ary tags at once:

* **B**: ``n`` consecutive tag variables (``BlockSpec([13] * n)``);
* **C**: the Markov blanket, the tag just left and the tag just right of the block
  (either may be absent at a sentence end);
* **Psi**: the local potentials: the ``n`` unary log-potential vectors of the block tokens
  and the transition log-potentials of the edges touching the block.

Features (``feature_dim = 13 n + 2 * 14 + 169 (n - 1)``, i.e. 223 / 405 / 587 for
``n = 2 / 3 / 4``), in this order:

1. the ``n`` block unary log-potentials, each centred (its mean over the 13 tags removed);
2. the left-edge transition row selected by the left tag, ``T_left[c_left, :]`` (centred),
   then an *absent* flag (1.0 and zeros when there is no left neighbour);
3. the right-edge transition column selected by the right tag, ``T_right[:, c_right]``
   (centred), then its *absent* flag;
4. the ``n - 1`` block-internal transition matrices (each centred), so that
   ``p(B | C, Psi)`` is a deterministic function of the features even in graphs whose
   edges carry different tables (in a CRF sentence graph they are all the CRF's matrix).

Centring only shifts log-potentials by constants, so :meth:`CrfTagsMotif.exact_conditional`
recovers the exact conditional from the features. ``-inf`` log-potentials are encoded as
``-1e4`` (a weight of ``e^-10000``, zero in floating point).

:meth:`CrfTagsMotif.find_instances` works on any :class:`~neuralblock.graph.FactorGraph`
whose 13-ary variables are linked into chains by pairwise ``13 x 13`` table factors (and
carry any number of unary ``13``-tables): every window of ``n`` consecutive latent chain
variables whose factors are all such tables is an instance. Cycles are skipped.

Training instantiations (:meth:`CrfTagsMotif.sample_training_batch`) come from the
sentence MRFs of the shipped WNUT-17 CRF (:func:`motifs.crf.load_crf`): a uniformly random
window of a training sentence, with ``(B, C)`` drawn from the chain's exact joint by
forward filtering, backward sampling, and the exact conditional ``log_p [B, 13^n]``.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018 (NER experiment).

Example:
    >>> from motifs.crf import load_crf
    >>> motif = CrfTagsMotif(tags=2)
    >>> fg = load_crf().sentence_graph(["I", "love", "New", "York"])
    >>> inst = motif.find_instances(fg)
    >>> len(inst), motif.feature_dim
    (3, 223)
    >>> motif.encode(fg, inst, torch.zeros(4)).shape
    torch.Size([3, 223])
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from motifs.crf import LinearChainCRF, default_crf_path, load_crf, read_conll
from neuralblock.exact.chain import chain_backward, chain_forward, gumbel_argmax
from neuralblock.graph import FactorGraph
from neuralblock.graph.groups import TableGroup
from neuralblock.io import data_path
from neuralblock.motif import BlockSpec, Motif, MotifInstances, TrainingBatch, register_motif
from neuralblock.proposals import proposal_files

__all__ = ["NUM_TAGS", "CrfTagsMotif"]

NUM_TAGS = 13
"""Cardinality of a tag variable (the WNUT-17 BIO tag set)."""

_NEG = -1e4  # encoding of -inf log-potentials


def _center(x: Tensor, dims: int = 1) -> Tensor:
    x = x.clamp(min=_NEG)
    return x - x.mean(dim=tuple(range(-dims, 0)), keepdim=True)


class CrfTagsMotif(Motif):
    """Block of ``tags`` consecutive 13-ary tag variables of a linear-chain MRF.

    Args:
        tags: block size ``n`` (2, 3 or 4).
        crf_path: optional CRF file for training instantiations (default: the shipped
            WNUT-17 CRF). Not part of :meth:`options`; the features do not depend on it.

    Example:
        >>> motif = CrfTagsMotif(tags=3)
        >>> motif.block_spec.cardinalities, motif.feature_dim
        ([13, 13, 13], 405)
        >>> batch = motif.sample_training_batch(8, torch.Generator().manual_seed(0))
        >>> batch.features.shape, batch.block.shape, batch.log_p.shape
        (torch.Size([8, 405]), torch.Size([8, 3]), torch.Size([8, 2197]))
    """

    name = "crf_tags"
    version = 1

    def __init__(self, tags: int = 2, crf_path: str | os.PathLike | None = None) -> None:
        if isinstance(tags, bool) or not isinstance(tags, int) or not 2 <= tags <= 4:
            raise ValueError(f"crf_tags: tags must be an integer in 2..4, got {tags!r}")
        self.n = tags
        self.k = NUM_TAGS
        self._crf_path = crf_path
        self._cache: dict[str, Any] | None = None
        k, n = self.k, self.n
        self._u = slice(0, n * k)
        self._left = slice(n * k, n * k + k)
        self._left_flag = n * k + k
        self._right = slice(n * k + k + 1, n * k + 2 * k + 1)
        self._right_flag = n * k + 2 * k + 1
        self._internal = slice(n * k + 2 * k + 2, n * k + 2 * k + 2 + (n - 1) * k * k)

    # ------------------------------------------------------------------ protocol
    @property
    def block_spec(self) -> BlockSpec:
        """``BlockSpec([13] * n)``."""
        return BlockSpec([self.k] * self.n)

    @property
    def feature_dim(self) -> int:
        """``13 n + 28 + 169 (n - 1)``."""
        return self.n * self.k + 2 * (self.k + 1) + (self.n - 1) * self.k * self.k

    def options(self) -> dict[str, Any]:
        """``{"tags": n}``."""
        return {"tags": self.n}

    def describe(self) -> str:
        """The structure the motif looks for, in words (shown when a model has no instance).

        Example:
            >>> print(CrfTagsMotif(tags=3).describe())
            3 consecutive latent variables of a chain of 13-ary (13-state) variables: neighbours joined by pairwise \
[13, 13] tables, each block variable touching only unary [13] and pairwise [13, 13] tables (e.g. an HMM or \
linear-chain CRF with 13 states)
        """
        k = self.k
        return (
            f"{self.n} consecutive latent variables of a chain of {k}-ary ({k}-state) variables: neighbours joined by "
            f"pairwise [{k}, {k}] tables, each block variable touching only unary [{k}] and pairwise [{k}, {k}] tables "
            f"(e.g. an HMM or linear-chain CRF with {k} states)"
        )

    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        """Every window of ``n`` consecutive latent tag variables of every chain in ``fg``.

        A *chain* is a path of 13-ary variables joined by pairwise ``13 x 13`` table
        factors (several factors on one pair are summed). A block variable must be latent,
        have at most two chain neighbours and no factor other than unary 13-tables and
        chain tables. Its Markov blanket (``context``) is its left/right neighbour on the
        path (``-1`` when absent; it may be observed or carry other factors).

        Returns:
            Instances with ``blocks [I, n]``, ``context [I, 2]`` (left, right),
            ``params [I, feature_dim]`` (the static features, zeros in the C-dependent
            slots) and ``extra`` ``left_rows``/``right_cols [I, 13, 13]`` (centred
            transition rows/columns, indexed by the context value).

        Example:
            >>> from motifs.crf import load_crf
            >>> fg = load_crf().corpus_graph([["a", "b", "c"], ["d"], ["e", "f"]])
            >>> CrfTagsMotif(tags=2).find_instances(fg).blocks.tolist()
            [[0, 1], [1, 2], [4, 5]]
        """
        k, n = self.k, self.n
        dtype = torch.get_default_dtype()
        nv = fg.num_variables
        unary = torch.zeros(nv, k, dtype=dtype)
        dirty = torch.zeros(nv, dtype=torch.bool)
        pair_scopes: list[Tensor] = []
        pair_tables: list[Tensor] = []
        for group in fg.groups:
            if isinstance(group, TableGroup) and group.table_shape == (k,):
                unary.index_add_(0, group.scopes[:, 0], group.log_tables.to(dtype).clamp(min=_NEG))
            elif isinstance(group, TableGroup) and group.table_shape == (k, k):
                pair_scopes.append(group.scopes)
                pair_tables.append(group.log_tables.to(dtype).clamp(min=_NEG))
            else:
                scopes = group.scopes
                dirty[scopes[scopes >= 0]] = True
        for v in fg.evidence:
            dirty[v] = True
        empty = MotifInstances(
            torch.zeros(0, n, dtype=torch.long),
            torch.zeros(0, 2, dtype=torch.long),
            torch.zeros(0, self.feature_dim, dtype=dtype),
            {"left_rows": torch.zeros(0, k, k, dtype=dtype), "right_cols": torch.zeros(0, k, k, dtype=dtype)},
        )
        if not pair_scopes:
            return empty
        scopes = torch.cat(pair_scopes)
        tables = torch.cat(pair_tables)
        lo, hi = scopes.min(1).values, scopes.max(1).values
        flip = scopes[:, 0] > scopes[:, 1]
        tables = torch.where(flip[:, None, None], tables.transpose(-1, -2), tables)  # oriented lo -> hi
        keys, inverse = torch.unique(lo * nv + hi, return_inverse=True)
        edge_tables = torch.zeros(len(keys), k, k, dtype=dtype).index_add_(0, inverse, tables)
        e_lo, e_hi = (keys // nv).tolist(), (keys % nv).tolist()
        adjacency: dict[int, list[tuple[int, int]]] = {}
        for e, (a, b) in enumerate(zip(e_lo, e_hi)):
            adjacency.setdefault(a, []).append((b, e))
            adjacency.setdefault(b, []).append((a, e))
        degree = {v: len(nb) for v, nb in adjacency.items()}
        dirty_list = dirty.tolist()
        clean = [v in degree and degree[v] <= 2 and not dirty_list[v] for v in range(nv)]
        # ordered sequences: paths of degree<=2 nodes, extended by an outside neighbour at each end
        seq_nodes: list[int] = []
        seq_edges: list[int] = []  # signed edge id + 1 between consecutive nodes (neg: reversed), 0 at seq end
        starts: list[int] = []
        seen: set[int] = set()
        for v0 in sorted(adjacency):
            if v0 in seen or degree[v0] > 2:
                continue
            comp = self._path_from(v0, adjacency, degree, seen)
            if comp is None:
                continue
            nodes, edges = comp
            base = len(seq_nodes)
            seq_nodes.extend(nodes)
            seq_edges.extend(edges)
            length = len(nodes)
            ok = [clean[v] for v in nodes]
            for s in range(length - n + 1):
                if all(ok[s : s + n]):
                    starts.append(base + s)
        if not starts:
            return empty
        node_t = torch.tensor(seq_nodes, dtype=torch.long)
        edge_t = torch.tensor(seq_edges, dtype=torch.long)
        # oriented table between sequence position j and j+1 (zeros at a sequence end)
        eid = edge_t.abs() - 1
        oriented = torch.where(
            (edge_t < 0)[:, None, None], edge_tables[eid.clamp(min=0)].transpose(-1, -2), edge_tables[eid.clamp(min=0)]
        )
        oriented = oriented * (edge_t != 0)[:, None, None].to(dtype)
        g = torch.tensor(starts, dtype=torch.long)
        offs = torch.arange(n)
        blocks = node_t[g[:, None] + offs]
        has_left = (g > 0) & (edge_t[(g - 1).clamp(min=0)] != 0)
        has_right = edge_t[g + n - 1] != 0
        left_var = torch.where(has_left, node_t[(g - 1).clamp(min=0)], -1)
        right_var = torch.where(has_right, node_t[(g + n).clamp(max=len(seq_nodes) - 1)], -1)
        internal = oriented[g[:, None] + torch.arange(n - 1)]  # [I, n-1, K, K]
        left_tab = oriented[(g - 1).clamp(min=0)] * has_left[:, None, None].to(dtype)
        right_tab = oriented[g + n - 1] * has_right[:, None, None].to(dtype)
        left_rows = _center(left_tab) * has_left[:, None, None].to(dtype)  # [I, c_left, x_first]
        right_cols = _center(right_tab.transpose(-1, -2)) * has_right[:, None, None].to(dtype)  # [I, c_right, x_last]
        params = self._assemble(
            unary[blocks],
            torch.zeros(len(g), k, dtype=dtype),
            ~has_left,
            torch.zeros(len(g), k, dtype=dtype),
            ~has_right,
            internal,
        )
        return MotifInstances(
            blocks, torch.stack([left_var, right_var], 1), params, {"left_rows": left_rows, "right_cols": right_cols}
        )

    @staticmethod
    def _path_from(
        v0: int, adjacency: dict[int, list[tuple[int, int]]], degree: dict[int, int], seen: set[int]
    ) -> tuple[list[int], list[int]] | None:
        """The path component of degree<=2 nodes through ``v0``, extended by outside neighbours."""
        comp, stack = {v0}, [v0]
        while stack:
            v = stack.pop()
            for w, _ in adjacency[v]:
                if w not in comp and degree[w] <= 2:
                    comp.add(w)
                    stack.append(w)
        seen.update(comp)
        inner = {v: [(w, e) for w, e in adjacency[v] if w in comp] for v in comp}
        ends = sorted(v for v in comp if len(inner[v]) <= 1)
        if not ends:
            return None  # a cycle
        order = [ends[0]]
        prev = -1
        while True:
            nxt = [w for w, _ in inner[order[-1]] if w != prev]
            if not nxt:
                break
            prev = order[-1]
            order.append(nxt[0])
        if len(order) == 1:
            return None  # a lone chain variable: no window of >= 2 consecutive variables
        # the ends have one path neighbour, so at most one neighbour outside the path (their MB)
        head = [w for w, _ in adjacency[order[0]] if w not in comp]
        tail = [w for w, _ in adjacency[order[-1]] if w not in comp]
        nodes = head + order + tail
        edge_of = {(v, w): e for v in nodes for w, e in adjacency[v]}
        edges = [edge_of[(a, b)] + 1 if a < b else -(edge_of[(a, b)] + 1) for a, b in zip(nodes[:-1], nodes[1:])]
        edges.append(0)
        return nodes, edges

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Tensor:
        """Features ``[..., I, feature_dim]`` of the instances for states ``[..., n_vars]`` (one gather).

        Example:
            >>> from motifs.crf import load_crf
            >>> fg = load_crf().sentence_graph(["Go", "Lakers", "!"])
            >>> motif = CrfTagsMotif(tags=2)
            >>> motif.encode(fg, motif.find_instances(fg), torch.zeros(5, 3)).shape
            torch.Size([5, 2, 223])
        """
        if state.shape[-1] != fg.num_variables:
            raise ValueError(f"state must have shape [..., {fg.num_variables}], got {tuple(state.shape)}")
        params = instances.params
        count = params.shape[0]
        ctx = state[..., instances.context.clamp(min=0)].long()  # [..., I, 2]
        rows = torch.arange(count)
        left = instances.extra["left_rows"][rows, ctx[..., 0]]  # [..., I, K]
        right = instances.extra["right_cols"][rows, ctx[..., 1]]
        p = params.expand(left.shape[:-1] + params.shape[-1:])
        pieces = [
            p[..., : self._left.start],
            left.to(p.dtype),
            p[..., self._left_flag : self._right.start],
            right.to(p.dtype),
            p[..., self._right_flag :],
        ]
        return torch.cat(pieces, -1)

    def exact_conditional(self, features: Tensor) -> Tensor:
        """Exact ``log p(B | C, Psi)`` over all ``13^n`` block values (:meth:`BlockSpec.enumerate` order).

        Args:
            features: ``[..., feature_dim]``.

        Returns:
            ``[..., 13^n]`` normalized log-probabilities (first block variable slowest).

        Example:
            >>> motif = CrfTagsMotif(tags=2)
            >>> motif.exact_conditional(torch.zeros(3, 223)).exp().sum(-1)
            tensor([1.0000, 1.0000, 1.0000])
        """
        if features.shape[-1] != self.feature_dim:
            raise ValueError(f"features must have shape [..., {self.feature_dim}], got {tuple(features.shape)}")
        k, n = self.k, self.n
        batch = features.shape[:-1]
        unary = features[..., self._u].reshape(*batch, n, k)
        internal = features[..., self._internal].reshape(*batch, n - 1, k, k)
        score = unary[..., 0, :] + features[..., self._left]  # [..., K]
        for j in range(1, n):
            # score [..., K^(j)] over x_0..x_{j-1}; add T_j[x_{j-1}, x_j] + u_j[x_j]
            view = (*batch,) + (1,) * (j - 1) + (k, k)
            score = score.unsqueeze(-1) + internal[..., j - 1, :, :].reshape(view)
            score = score + unary[..., j, :].reshape((*batch,) + (1,) * j + (k,))
        score = score + features[..., self._right].reshape((*batch,) + (1,) * (n - 1) + (k,))
        return torch.log_softmax(score.reshape(*batch, k**n), -1)

    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """Random windows of WNUT-17 training sentences under the CRF, ``(B, C)`` by exact FFBS.

        Vectorized over the batch; deterministic given ``generator``.

        Example:
            >>> motif = CrfTagsMotif(tags=2)
            >>> b = motif.sample_training_batch(4, torch.Generator().manual_seed(1))
            >>> bool(torch.allclose(b.log_p.exp().sum(-1), torch.ones(4)))
            True
        """
        draw = self._draw(batch_size, generator)
        cache = self._training_cache()
        k, n = self.k, self.n
        unary, trans = cache["unary"], cache["trans"]
        s, st, values = draw["sentence"], draw["start"], draw["values"]
        has_left, has_right = draw["has_left"], draw["has_right"]
        block = values[:, 1 : n + 1]
        dtype = unary.dtype
        left = _center(trans[values[:, 0]]) * has_left[:, None].to(dtype)
        right = _center(trans.t()[values[:, n + 1]]) * has_right[:, None].to(dtype)
        internal = cache["internal"].expand(batch_size, n - 1, k, k)
        block_unary = unary[s[:, None], st[:, None] + torch.arange(n)]
        features = self._assemble(block_unary, left, ~has_left, right, ~has_right, internal)
        features = features.to(torch.get_default_dtype())
        return TrainingBatch(
            features=features,
            block=block.to(torch.get_default_dtype()),
            log_p=self.exact_conditional(features),
        )

    # ------------------------------------------------------------------ helpers
    def _draw(self, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Uniform random windows and their ``(C_left, B, C_right)`` values by exact FFBS.

        Returns:
            ``sentence``, ``start`` (window start), ``has_left``, ``has_right`` ``[batch]`` and
            ``values [batch, n + 2]`` (left MB, block, right MB; absent MB slots hold 0).
        """
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        cache = self._training_cache()
        n = self.n
        alpha, beta, trans = cache["alpha"], cache["beta"], cache["trans"]
        w = torch.randint(len(cache["win_sent"]), (batch_size,), generator=generator)
        s, st, length = cache["win_sent"][w], cache["win_start"][w], cache["win_len"][w]
        has_left = st > 0
        has_right = st + n < length
        top = torch.where(has_right, st + n, st + n - 1)
        low = torch.where(has_left, st - 1, st)
        values = torch.zeros(batch_size, n + 2, dtype=torch.long)
        rows = torch.arange(batch_size)
        y = gumbel_argmax(alpha[s, top] + beta[s, top], generator)
        values[rows, top - st + 1] = y
        for j in range(1, n + 2):
            t = top - j
            valid = t >= low
            cand = gumbel_argmax(alpha[s, t.clamp(min=0)] + trans.t()[y], generator)
            y = torch.where(valid, cand, y)
            pos = (t - st + 1).clamp(min=0)
            values[rows, pos] = torch.where(valid, cand, values[rows, pos])
        return {"sentence": s, "start": st, "values": values, "has_left": has_left, "has_right": has_right}

    def _assemble(
        self, unary: Tensor, left: Tensor, left_absent: Tensor, right: Tensor, right_absent: Tensor, internal: Tensor
    ) -> Tensor:
        """Feature rows from ``unary [I, n, K]`` (raw), centred ``left``/``right [I, K]``, flags, raw ``internal``."""
        count = unary.shape[0]
        dtype = unary.dtype
        return torch.cat(
            [
                _center(unary).reshape(count, unary.shape[1:].numel()),
                left,
                left_absent.to(dtype)[:, None],
                right,
                right_absent.to(dtype)[:, None],
                _center(internal, dims=2).reshape(count, internal.shape[1:].numel()),
            ],
            -1,
        )

    def _training_cache(self) -> dict[str, Any]:
        """The training sentences' potentials and messages (shared by all motifs of one CRF) and windows."""
        if self._cache is not None:
            return self._cache
        shared = _sentence_cache(self._crf_path)
        trans, lengths = shared["trans"], shared["lengths"]
        counts = (lengths - self.n + 1).clamp(min=0)
        win_sent = torch.repeat_interleave(torch.arange(len(lengths)), counts)
        firsts = torch.cumsum(counts, 0) - counts
        win_start = torch.arange(len(win_sent)) - firsts[win_sent]
        self._cache = {
            **shared,
            "internal": trans.expand(self.n - 1, self.k, self.k)[None],
            "win_sent": win_sent,
            "win_start": win_start,
            "win_len": lengths[win_sent],
        }
        return self._cache


_SENTENCE_CACHE: dict[tuple[str, int, int], dict[str, Tensor]] = {}


def _sentence_cache(crf_path: str | os.PathLike | None) -> dict[str, Tensor]:
    """Folded unary potentials, forward/backward messages of the WNUT-17 training sentences under a CRF.

    Cached per CRF file (path, size and modification time), so building several motifs is cheap.
    """
    path = Path(crf_path) if crf_path is not None else default_crf_path()
    weights, _ = proposal_files(path)
    stat = weights.stat() if weights.is_file() else None
    key = (str(weights.resolve()), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
    if key in _SENTENCE_CACHE:
        return _SENTENCE_CACHE[key]
    crf: LinearChainCRF = load_crf(path)
    if crf.num_tags != NUM_TAGS:
        raise ValueError(f"crf_tags needs a {NUM_TAGS}-tag CRF, got {crf.num_tags} tags")
    sentences = [tokens for tokens, _ in read_conll(data_path("ner_wnut17", "wnut17train.conll"), crf.tags)]
    with torch.no_grad():
        feats, mask = crf.featurize(sentences)
        unary = crf.potentials(feats, mask).detach()
        trans = crf.transitions.detach().clone()
        alpha, _ = chain_forward(unary, trans, mask)
        beta = chain_backward(unary, trans, mask)
    entry = {"unary": unary, "trans": trans, "alpha": alpha, "beta": beta, "lengths": mask.long().sum(-1)}
    _SENTENCE_CACHE.clear()  # keep one CRF's tensors (a few MB) at a time
    _SENTENCE_CACHE[key] = entry
    return entry


register_motif("crf_tags", CrfTagsMotif)
