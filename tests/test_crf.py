"""Tests of the WNUT-17 linear-chain CRF.

Data, files and graphs are in motifs/crf.py, training and F1 in experiments/crf_model.py; the chain
algorithms are tested against brute force in test_exact_chain.py.
"""

from __future__ import annotations

import doctest
import json
import shutil

import pytest
import torch

import experiments.crf_model
from experiments.crf_model import build_feature_list, entity_spans, evaluate, precision_recall_f1, train_crf
from motifs.crf import TAGS, LinearChainCRF, default_crf_path, load_crf, read_conll, token_features
from neuralblock.exact import marginals as exact_marginals
from neuralblock.io import data_path


@pytest.fixture(scope="module")
def crf() -> LinearChainCRF:
    return load_crf()


@pytest.fixture(scope="module")
def train_sentences():
    return read_conll(data_path("ner_wnut17", "wnut17train.conll"))


# ---------------------------------------------------------------------------- data
def test_read_conll_matches_manifest(train_sentences):
    counts = {
        "wnut17train.conll": (3394, 62730),
        "emerging.dev.conll": (1009, 15733),
        "emerging.test.annotated": (1287, 23394),
    }
    for file, (n_sent, n_tok) in counts.items():
        sents = train_sentences if file == "wnut17train.conll" else read_conll(data_path("ner_wnut17", file))
        assert (len(sents), sum(len(t) for t, _ in sents)) == (n_sent, n_tok)
        assert all(len(t) == len(y) > 0 for t, y in sents)
        assert {tag for _, y in sents for tag in y} <= set(TAGS)
    assert len(TAGS) == 13


def test_read_conll_rejects_bad_tags(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("Paris\tB-location\n\nfoo\tB-city\n")
    with pytest.raises(ValueError, match=r"line 3: unknown tag 'B-city'"):
        read_conll(bad)
    bad.write_text("lonely\n")
    with pytest.raises(ValueError, match="line 1"):
        read_conll(bad)


def test_token_features_templates():
    feats = token_features(["#Paris", "is", "2017"])
    assert "w=#paris" in feats[0] and "hash" in feats[0] and "cap" not in feats[0] and "first" in feats[0]
    assert "w-1=#paris" in feats[1] and "w+1=2017" in feats[1]
    assert "dig" in feats[2] and "sh=d" in feats[2] and "last" in feats[2]
    expected = {"b", "w=a", "sh=x", "p1=a", "s1=a", "first", "last", "w-1=<s>", "w+1=</s>", "sh-1=<s>", "sh+1=</s>"}
    assert build_feature_list([["a", "b"], ["a"]], min_count=2) == sorted(expected)


# ---------------------------------------------------------------------------- the shipped CRF and graphs
def test_sentence_graph_log_joint_equals_crf_score(crf):
    tokens = ["@user", "Watching", "Game", "of", "Thrones", "in", "London", "tonight", "#GoT"]
    fg = crf.sentence_graph(tokens)
    assert fg.num_variables == len(tokens) and fg.num_factors == 2 * len(tokens) - 1
    assert fg.cardinalities.tolist() == [13] * len(tokens)
    g = torch.Generator().manual_seed(0)
    tags = torch.randint(13, (64, len(tokens)), generator=g)
    assert torch.allclose(fg.log_joint(tags.float()), crf.score(tokens, tags), atol=1e-4)
    names = crf.decode([tokens])[0]
    assert torch.allclose(fg.log_joint(crf.tag_ids(names).float()), crf.score(tokens, names), atol=1e-4)
    # exact inference on the graph agrees with the CRF's forward-backward
    marg, log_z = exact_marginals(fg)
    assert abs(float(log_z) - float(crf.log_partition(tokens))) < 1e-3
    assert torch.allclose(marg.float(), crf.marginals(tokens), atol=1e-4)


def test_corpus_graph_is_disjoint_union(crf):
    sents = [["Hello", "Paris"], ["x"], ["Apple", "sues", "Samsung"]]
    fg = crf.corpus_graph(sents)
    assert fg.num_variables == 6 and fg.num_factors == 6 + 3
    assert fg.names[:3] == ["s0.t0", "s0.t1", "s1.t0"]
    tags = torch.randint(13, (8, 6), generator=torch.Generator().manual_seed(1))
    total = crf.score(sents[0], tags[:, :2]) + crf.score(sents[1], tags[:, 2:3]) + crf.score(sents[2], tags[:, 3:])
    assert torch.allclose(fg.log_joint(tags.float()), total, atol=1e-4)
    with pytest.raises(ValueError):
        crf.corpus_graph([["a"], []])


def test_shipped_crf_metadata_and_quality(crf):
    meta = crf.metadata
    assert crf.tags == list(TAGS) and crf.num_features > 1000
    assert meta["training"]["optimizer"] == "Adagrad" and meta["training"]["epochs"] == 10
    assert meta["seed"] == 0 and meta["training"]["num_sentences"] == 3394
    for split in ("dev", "test"):
        m = meta["metrics"][split]
        assert m["token_accuracy"] > 0.9 and 0.1 < m["entity"]["f1"] < 1.0
    # the recorded dev metric is reproducible from the shipped weights
    dev = read_conll(data_path("ner_wnut17", "emerging.dev.conll"))
    full = evaluate(crf, dev)
    assert abs(full["token_accuracy"] - meta["metrics"]["dev"]["token_accuracy"]) < 1e-9


def test_entity_spans_and_perfect_evaluation(crf):
    assert entity_spans(["O", "B-person", "I-person", "B-group", "I-location", "O"]) == {
        (1, 3, "person"),
        (3, 4, "group"),
        (4, 5, "location"),
    }
    sents = [(["a", "b"], ["O", "O"])]
    perfect = evaluate(crf, [(t, crf.decode([t])[0]) for t, _ in sents])
    assert perfect["token_accuracy"] == 1.0
    assert precision_recall_f1(0, 0, 3) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_crf_model_doctests():
    """experiments/ is outside the doctest paths of the pytest config, so its examples run here."""
    result = doctest.testmod(experiments.crf_model)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------- training and files
def test_training_lowers_nll(train_sentences):
    data = train_sentences[:50]
    crf, losses = train_crf(data, epochs=1, batch_size=10, lr=0.3, seed=0)
    feats, mask = crf.featurize([t for t, _ in data])
    gold = torch.zeros(mask.shape, dtype=torch.long)
    for b, (_, y) in enumerate(data):
        gold[b, : len(y)] = crf.tag_ids(y)
    with torch.no_grad():
        after = float(crf.nll(feats, mask, gold).mean())
    before = sum(len(t) for t, _ in data) * torch.log(torch.tensor(13.0)).item() / len(data)  # zero weights
    assert after < 0.5 * before
    assert len(losses) == 1 and crf.metadata["training"]["epochs"] == 1


def test_save_load_roundtrip_and_errors(tmp_path, train_sentences):
    crf, _ = train_crf(train_sentences[:20], epochs=1, batch_size=10, seed=0)
    crf.metadata["note"] = "tiny"
    crf.save(tmp_path / "tiny")
    back = load_crf(tmp_path / "tiny.safetensors")
    assert back.features == crf.features and back.metadata["note"] == "tiny"
    for key in ("emission", "transitions", "start", "end"):
        assert torch.equal(getattr(back, key), getattr(crf, key).detach())
    sidecar = json.loads((tmp_path / "tiny.json").read_text())

    def broken(name: str, sidecar_text: str | None = None, weights: bytes | None = None):
        stem = tmp_path / name
        shutil.copy(tmp_path / "tiny.safetensors", stem.with_suffix(".safetensors"))
        shutil.copy(tmp_path / "tiny.json", stem.with_suffix(".json"))
        if sidecar_text is not None:
            stem.with_suffix(".json").write_text(sidecar_text)
        if weights is not None:
            stem.with_suffix(".safetensors").write_bytes(weights)
        return stem.with_suffix(".safetensors")

    with pytest.raises(ValueError, match="not a valid JSON"):
        load_crf(broken("a", sidecar_text='{"format": "neuralblock.crf", '))
    fewer = dict(sidecar, features=sidecar["features"][:-1], num_features=sidecar["num_features"] - 1)
    with pytest.raises(ValueError, match="shape"):
        load_crf(broken("b", sidecar_text=json.dumps(fewer)))
    with pytest.raises(ValueError, match="num_features"):
        load_crf(broken("c", sidecar_text=json.dumps(dict(sidecar, num_features=3))))
    with pytest.raises(ValueError, match="tags"):
        load_crf(broken("d", sidecar_text=json.dumps(dict(sidecar, tags="O"))))
    with pytest.raises(ValueError, match="not a CRF sidecar"):
        load_crf(broken("e", sidecar_text=json.dumps({"format": "other"})))
    blob = (tmp_path / "tiny.safetensors").read_bytes()
    with pytest.raises(ValueError, match="truncated, corrupted"):
        load_crf(broken("f", weights=blob[: len(blob) // 2]))
    # a self-consistent but truncated file (sha matches) is still refused with a ValueError
    sha = __import__("hashlib").sha256(blob[:100]).hexdigest()
    with pytest.raises(ValueError, match="not a valid safetensors"):
        load_crf(broken("g", sidecar_text=json.dumps(dict(sidecar, weights_sha256=sha)), weights=blob[:100]))
    with pytest.raises(FileNotFoundError):
        load_crf(tmp_path / "missing")
    assert default_crf_path().name == "crf.safetensors"
