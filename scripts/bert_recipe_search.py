#!/usr/bin/env python3
"""Search for a masked-LM pre-training recipe with which Chapter 10's tiny BERT learns on a CPU.

    python scripts/bert_recipe_search.py --name base15                          # BERT's recipe, toy scale
    python scripts/bert_recipe_search.py --name rope --pos rope                 # one change
    python scripts/bert_recipe_search.py --name final --vocab 256 --pos rope --mask 0.4 --lr 5e-3 \\
        --batch 64 --steps 500 --seeds 0,1,2 --final 1                          # the chapter's recipe

Each run trains ``ModelConfig.preset("bert-tiny")`` (2 layers, d = 64) with MLM (+ NSP) on the
chapter's data (every Shakespeare play, minus the held-out last 20% of the four task plays, in a
lowercase WordPiece vocabulary of ``--vocab`` tokens), one thread, and appends one JSON line to
``--out`` (default ``book/results/bert_recipe_search.jsonl``): the arguments, the count-model
baselines and, per seed, the seconds per step and the validation curve ``(step, loss, accuracy)``
at the ``[MASK]`` positions.

Selection never looks at the chapter's test text: the last 5% of the pre-training stream is held
out of training as the validation slice (2 batches of 256 pairs of 2 x 14 tokens, masked at BERT's
15%, 80/10/10), scored every ``--every`` steps. Baselines at exactly the same positions, fitted on
the training 95%: an add-one unigram model and interpolated Kneser-Ney bigram models (one
discount, 0.75) that predict the hidden token from its true left or its true right neighbour.
``--final 1`` also scores the held-out plays (the chapter's ``eval_batches``) after training.

The stored file holds 48 runs (about 19 CPU-minutes of training on one core, evaluation and
tokenising aside); Chapter 10 renders them as a table and re-runs only the final recipe.
Defaults are BERT's recipe at toy scale: 15% masking, learned positions, post-norm, MLM + NSP,
V = 1000, lr 3e-3 (10% warm-up, linear decay), 32 pairs x 600 steps, weight decay 0.01,
N(0, 0.02^2) initialisation.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from companion.config import ModelConfig
from companion.data import shakespeare_corpus
from companion.models.bert import BERT
from companion.objectives import mlm_mask, nsp_pairs, pack_pair
from companion.tokenization import WordPieceTokenizer
from companion.training import train, warmup_cosine_schedule, warmup_linear_schedule
from companion.utils import seed_everything

ROOT = Path(__file__).resolve().parents[1]
PLAYS = ("A Midsummer Night's Dream", "Henry V", "Hamlet", "The Tempest")  # the chapter's task plays
EVAL_SEQ = 32  # the chapter's evaluation format: pairs of 2 x 14 tokens, 15% masking, 80/10/10


def split_play(text: str) -> tuple[str, str]:
    """The first 80% of a play (training) and the last 20% (held out)."""
    cut = int(0.8 * len(text))
    return text[:cut], text[cut:]


def load_data(vocab: int, cache: Path | None) -> dict:
    """The chapter's token streams in a WordPiece vocabulary of ``vocab`` tokens (cached: tokenising takes a while)."""
    path = cache / f"data_v{vocab}.pkl" if cache else None
    if path and path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)
    texts = {row["title"]: row["text"].lower() for row in shakespeare_corpus()}
    pretrain_texts = [split_play(t)[0] if title in PLAYS else t for title, t in texts.items()]
    tok = WordPieceTokenizer.train(pretrain_texts, vocab_size=vocab)
    specials = [tok.special_tokens[s] for s in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    data = dict(V=tok.vocab_size, specials=specials,
                stream=[i for t in pretrain_texts for i in tok.encode(t)],
                heldout=[i for title in PLAYS for i in tok.encode(split_play(texts[title])[1])])
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(data, f)
    return data


def chunk(ids: list[int], n: int) -> list[list[int]]:
    return [ids[i:i + n] for i in range(0, len(ids) - n, n)]


def make_batch(g: torch.Generator, source: list, batch: int, seq: int, mask_prob: float, data: dict,
               nsp: bool = True):
    """(inputs, segments, MLM labels, NSP labels or None), masked afresh."""
    _, _, cls, sep, mask = data["specials"]
    if nsp:  # [CLS] A [SEP] B [SEP], B the next passage half the time
        pairs = nsp_pairs(source, batch, g)
        packed = [pack_pair(a, b, cls_id=cls, sep_id=sep, max_len=seq) for a, b, _ in pairs]
        ids = torch.tensor([p for p, _ in packed])
        segments = torch.tensor([t for _, t in packed])
        is_random = torch.tensor([lab for _, _, lab in pairs])
    else:  # RoBERTa-style: [CLS] contiguous text [SEP], one segment
        index = torch.randint(len(source), (batch,), generator=g).tolist()
        ids = torch.tensor([[cls, *source[i][:seq - 2], sep] for i in index])
        segments = torch.zeros_like(ids)
        is_random = None
    inputs, labels = mlm_mask(ids, vocab_size=data["V"], mask_id=mask, special_ids=data["specials"],
                              mask_prob=mask_prob, generator=g)
    return inputs, segments, labels, is_random


class KNBigram:
    """Interpolated Kneser-Ney bigram ``P(w | c)``, ``c`` the neighbour on one side, fitted on a stream."""

    def __init__(self, stream: list[int], vocab: int, direction: str, discount: float = 0.75) -> None:
        s = torch.tensor(stream)
        context, target = (s[:-1], s[1:]) if direction == "left" else (s[1:], s[:-1])
        c = torch.zeros(vocab, vocab)
        c.index_put_((context, target), torch.ones(len(context)), accumulate=True)
        continuation = (c > 0).sum(0).float()  # N1+(. w): distinct contexts of w
        p_cont = 0.999 * continuation / continuation.sum() + 0.001 / vocab
        total = c.sum(1, keepdim=True)
        followers = (c > 0).sum(1, keepdim=True).float()
        p = (c - discount).clamp(min=0) / total.clamp(min=1) + (discount * followers / total.clamp(min=1)) * p_cont
        p[total.squeeze(1) == 0] = p_cont  # unseen context: the continuation unigram
        self.log_p = p.log()

    def nll(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return -self.log_p[context, target]


def baselines(stream: list[int], vocab: int, batches: list, specials: list[int]) -> dict[str, float]:
    """Mean NLL at the [MASK] positions of ``batches``: add-one unigram, left and right Kneser-Ney bigrams
    on the true (uncorrupted) neighbour; at a [CLS] / [SEP] neighbour the bigrams fall back to the unigram."""
    mask = specials[4]
    counts = torch.bincount(torch.tensor(stream), minlength=vocab).float() + 1
    uni = -(counts / counts.sum()).log()
    models = (("left bigram", KNBigram(stream, vocab, "left"), -1),
              ("right bigram", KNBigram(stream, vocab, "right"), 1))
    special = torch.tensor(specials)
    out = {"unigram": 0.0, "left bigram": 0.0, "right bigram": 0.0}
    for inputs, _, labels, _ in batches:
        original = torch.where(labels != -100, labels, inputs)
        b, t = ((inputs == mask) & (labels != -100)).nonzero(as_tuple=True)
        y = original[b, t]
        out["unigram"] += uni[y].mean().item() / len(batches)
        for name, model, offset in models:
            neighbour = original[b, t + offset]
            nll = torch.where(torch.isin(neighbour, special), uni[y], model.nll(neighbour, y))
            out[name] += nll.mean().item() / len(batches)
    return out


@torch.no_grad()
def evaluate(model: BERT, batches: list, mask: int) -> tuple[float, float]:
    """Mean loss and accuracy at the [MASK] positions (per-batch means, averaged)."""
    model.eval()
    loss = acc = 0.0
    for inputs, segments, labels, _ in batches:
        where = (inputs == mask) & (labels != -100)
        logits = model.mlm_logits(model.encode(inputs, segments)[where])
        loss += F.cross_entropy(logits, labels[where]).item() / len(batches)
        acc += (logits.argmax(-1) == labels[where]).float().mean().item() / len(batches)
    model.train()
    return loss, acc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the run's name in the results file")
    ap.add_argument("--mask", type=float, default=0.15, help="share of tokens chosen (corrupted 80/10/10)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sched", choices=("linear", "cosine"), default="linear", help="decay after the warm-up")
    ap.add_argument("--warm", type=float, default=0.1, help="warm-up, as a share of the steps")
    ap.add_argument("--norm", choices=("post", "pre"), default="post")
    ap.add_argument("--pos", choices=("learned", "rope", "t5"), default="learned")
    ap.add_argument("--nsp", type=int, choices=(0, 1), default=1, help="0: MLM only, on contiguous windows")
    ap.add_argument("--seq", type=int, default=32, help="training sequence length")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--vocab", type=int, default=1000, help="WordPiece vocabulary size")
    ap.add_argument("--wd", type=float, default=0.01, help="weight decay")
    ap.add_argument("--tie", type=int, choices=(0, 1), default=1,
                    help="passed as tie_embeddings (BERT ties its MLM decoder either way)")
    ap.add_argument("--prec", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping norm; 0: none")
    ap.add_argument("--init", default="0.02", help='init_std, or "none": each module\'s PyTorch default')
    ap.add_argument("--seeds", default="0", help="comma-separated")
    ap.add_argument("--final", type=int, choices=(0, 1), default=0, help="1: also score the held-out plays")
    ap.add_argument("--every", type=int, default=100, help="validation every this many steps")
    ap.add_argument("--out", type=Path, default=ROOT / "book" / "results" / "bert_recipe_search.jsonl")
    ap.add_argument("--cache", type=Path, default=ROOT / "_build" / "bert_recipe_search",
                    help="where the tokenised streams are cached")
    return ap.parse_args(argv)


def run_seed(a: argparse.Namespace, seed: int, config: ModelConfig, schedule, data: dict, train_passages: list,
             val_batches: list) -> dict:
    """Train one seed; its seconds per step (evaluation excluded), validation curve and model."""
    seed_everything(seed)
    g = torch.Generator().manual_seed(seed)
    model = BERT(config)
    mask = data["specials"][4]
    curve, eval_seconds = [], 0.0

    def loss_fn(m: BERT, batch) -> torch.Tensor:
        inputs, segments, labels, is_random = batch
        hidden = m.encode(inputs, segments)
        chosen = labels != -100
        loss = F.cross_entropy(m.mlm_logits(hidden[chosen]), labels[chosen])
        if is_random is not None:
            loss = loss + F.cross_entropy(m.nsp_head(m.pool(hidden)), is_random)
        return loss

    def on_step(i: int, history) -> None:
        nonlocal eval_seconds
        if (i + 1) % a.every == 0 or i + 1 == a.steps:
            t = time.perf_counter()
            curve.append((i + 1, *evaluate(model, val_batches, mask)))
            eval_seconds += time.perf_counter() - t

    start = time.perf_counter()
    train(model, lambda i: make_batch(g, train_passages, a.batch, a.seq, a.mask, data, bool(a.nsp)), a.steps,
          loss_fn=loss_fn, lr=a.lr, weight_decay=a.wd, lr_schedule=schedule, progress=False, on_step=on_step,
          precision=a.prec, grad_clip=a.clip if a.clip > 0 else None)
    wall = time.perf_counter() - start - eval_seconds
    return dict(seed=seed, s_per_step=wall / a.steps, train_wall=wall,
                val_curve=[(s, round(loss, 3), round(acc, 4)) for s, loss, acc in curve], model=model)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    torch.set_num_threads(1)
    data = load_data(a.vocab, a.cache)
    vocab, specials, mask = data["V"], data["specials"], data["specials"][4]
    stream = data["stream"]
    cut = int(0.95 * len(stream))
    train_stream, val_stream = stream[:cut], stream[cut:]
    half = (EVAL_SEQ - 3) // 2
    passage = (a.seq - 3) // 2 if a.nsp else a.seq - 2  # halves of a pair (NSP) or whole windows (no NSP)
    train_passages = chunk(train_stream, passage)
    val_batches = [make_batch(torch.Generator().manual_seed(20_000 + i), chunk(val_stream, half), 256, EVAL_SEQ,
                              0.15, data) for i in range(2)]
    heldout_batches = [make_batch(torch.Generator().manual_seed(10_000 + i), chunk(data["heldout"], half), 256,
                                  EVAL_SEQ, 0.15, data) for i in range(2)]
    base = {"val": baselines(train_stream, vocab, val_batches, specials)}
    if a.final:
        base["heldout"] = baselines(train_stream, vocab, heldout_batches, specials)
    print(a.name, "baselines", json.dumps({k: {n: round(x, 3) for n, x in v.items()} for k, v in base.items()}),
          flush=True)

    positions = {} if a.pos == "learned" else {"position": a.pos}
    config = ModelConfig.preset("bert-tiny", vocab_size=vocab, max_len=max(a.seq, EVAL_SEQ), norm_position=a.norm,
                                tie_embeddings=bool(a.tie), init_std=None if a.init == "none" else float(a.init),
                                **positions)
    schedule = warmup_linear_schedule if a.sched == "linear" else warmup_cosine_schedule
    schedule = schedule(max(1, int(a.warm * a.steps)), a.steps)
    results = []
    for seed in (int(s) for s in a.seeds.split(",")):
        result = run_seed(a, seed, config, schedule, data, train_passages, val_batches)
        if a.final:
            result["heldout"] = evaluate(result.pop("model"), heldout_batches, mask)
        else:
            result.pop("model")
        results.append(result)
        print(a.name, json.dumps(result), flush=True)
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k not in ("out", "cache")}
    record = dict(name=a.name, args=args, baselines=base, results=results)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


if __name__ == "__main__":
    main()
