"""`scene-eplb hash-counts --model DIR (--token-ids F | --histogram F | --prompts F) -o OUT [--fill RECORD]`:
the hash-routed layers' counts predicted from the tokens a node computes, before (or beside) any record:
exact when those tokens are, an estimate where no client can see them (a D node's rejected drafts)."""

from __future__ import annotations

import numpy as np

from ..errors import SceneEplbError
from ..formats import read_counts, write_counts
from ..formats.counts import PREDICTED_KEY
from ..hash_layers.hash_counts import TOKEN_RATIO_BAND, fill_hash_layers, predicted_counts, prediction_meta
from ..hash_layers.hash_routing import HashTables, check_histogram, model_hash_geometry, read_hash_tables, token_histogram
from ..hash_layers.token_input import read_histogram, read_prompts, read_token_ids, tokenize
from ..layouts.counts import Counts
from ..planning.model_files import ModelFiles, read_model
from .arguments import model_arg
from .console import Console
from .options import check_output_file
from .scenes import check_model_counts

HELP = "predict the hash-routed layers' counts (DeepSeek-V4) from the tokens a node computes"
DESCRIPTION = (
    "DeepSeek-V4 routes its first num_hash_layers MoE layers by a table on the token id "
    "(layers.N.ffn.gate.tid2eid), so their counts are a function of the tokens a node computes: exact for the "
    "tokens given, as good as those tokens otherwise. Under vLLM 0.32 a P node computes each request's prompt "
    "past its prefix-cache hit (usage.prompt_tokens_details.cached_tokens under --enable-prompt-tokens-details; "
    "the hit ends on a block boundary before the last prompt token, so a full hit still computes that token) "
    "and, after a preemption, the request's tokens again past a new hit: exact with the hits known and no "
    "preemption. A D node computes the prompt tail it did not load (at least the last prompt token) and each "
    "token it samples but the last, which ends the request: exact without a drafter when every request ends on "
    "max_tokens, or on EOS under --no-async-scheduling (an asynchronous step may compute the last token; a stop "
    "string is caught after the engine ran on). With MTP or another drafter the target computes each accepted "
    "draft once, in its verify pass (sampled plus drafted tokens count it twice), and each rejected draft too; "
    "vLLM gives no client the drafts, so D's counts are an estimate: from its sampled tokens, short by the "
    "rejected drafts. Give those tokens; the command writes a scene-eplb counts file over the model's layer "
    "axis that `fit` takes: one entry, the hash layers predicted, every other layer zero, the metadata naming "
    "the predicted layers. With --fill, a recorded counts file whose hash layers came out empty gets them "
    "filled instead, the prediction split over its entries by their tokens; tokens outside "
    f"{TOKEN_RATIO_BAND[0]}-{TOKEN_RATIO_BAND[1]} x the record's are refused unless --accept-token-ratio."
)


def add_arguments(p) -> None:
    model_arg(p, required=True, help="the model's folder: config.json (its hash layers, vocab_size) and its safetensors")
    tokens = p.add_mutually_exclusive_group(required=True)
    tokens.add_argument(
        "--token-ids",
        metavar="FILE",
        help="token ids per request: a JSON list of lists of integers, or .jsonl with one list a line "
        "(P: the prompt past its prefix-cache hit; D: the prompt tail it computes and every sampled token but "
        "the last, an estimate under speculative decoding: the rejected drafts are not given to any client)",
    )
    tokens.add_argument("--histogram", metavar="FILE", help="a token histogram: a JSON list, the count of token id i at index i")
    tokens.add_argument(
        "--prompts",
        metavar="FILE",
        help='text prompts (a JSON list or .jsonl lines of strings or of {"prompt": ...}), tokenized by the model\'s '
        "tokenizer with its special tokens, as a completion request is (needs transformers); every prompt token "
        "counts, i.e. a P node with no prefix-cache hits",
    )
    p.add_argument(
        "--fill",
        metavar="RECORD",
        help="a recorded counts file of this model whose hash layers are all zero: write it with them filled "
        "(measured physical_count and source_count are dropped: the prediction cannot split them)",
    )
    p.add_argument(
        "--accept-token-ratio",
        action="store_true",
        help="with --fill, take tokens whose count is outside "
        f"{TOKEN_RATIO_BAND[0]}-{TOKEN_RATIO_BAND[1]} x the tokens the record routed (refused by default)",
    )
    p.add_argument("--role", choices=("prefill", "decode"), help="the node the tokens are from (counts metadata role)")
    p.add_argument("-o", "--output", required=True, help="counts file to write (scene-eplb .npz; replaced atomically)")


def _histogram(args, tables: HashTables, model: ModelFiles) -> tuple[np.ndarray, str]:
    """The tokens the options give, as a histogram over the vocabulary, and where they came from in words."""
    if args.histogram:
        return check_histogram(read_histogram(args.histogram), tables.vocab, args.histogram), f"histogram {args.histogram}"
    if args.token_ids:
        requests, path = read_token_ids(args.token_ids), args.token_ids
        source = f"token ids of {len(requests)} requests in {path}"
    else:
        prompts, path = read_prompts(args.prompts), args.prompts
        requests, source = tokenize(prompts, model.folder), f"{len(prompts)} prompts in {path}"
    return token_histogram(requests, tables.vocab, path), source


def run(args, console: Console) -> None:
    tokens_file = args.token_ids or args.histogram or args.prompts
    check_output_file(args.output, [f for f in (args.fill, tokens_file) if f], args.model)
    if args.accept_token_ratio and not args.fill:
        raise SceneEplbError("--accept-token-ratio applies to --fill only: there is no record to compare with")
    model = read_model(args.model)
    geometry, _ = model_hash_geometry(model)
    record = read_counts(args.fill) if args.fill else None
    if record is not None:
        check_model_counts(model, record, args.fill)
    with console.progress(f"reading the hash tables of {args.model}"):
        tables = read_hash_tables(model)
    with console.progress("reading the tokens"):
        histogram, source = _histogram(args, tables, model)
    if not histogram.any():
        raise SceneEplbError("the tokens given hold no token: nothing to predict", tokens_file)
    meta = prediction_meta(geometry, tables, histogram, source) | ({"role": args.role} if args.role else {})
    if record is None:
        counts = predicted_counts(geometry, tables, histogram, {"model": model.folder.resolve().name, **meta})
    else:
        try:
            counts = fill_hash_layers(record, geometry, tables, histogram, meta)
        except SceneEplbError as exc:
            raise SceneEplbError(exc.problem, args.fill) from None
    ratio = None if record is None else _token_ratio(int(histogram.sum()), counts.meta["recorded_tokens"], args)
    out = write_counts(counts, args.output)
    total = counts.total()[list(tables.layers)]
    measured = {} if record is None else {"physical_count": record.physical, "source_count": record.sources}
    payload = {
        "output": str(out),
        PREDICTED_KEY: list(tables.layers),
        "tokens": int(histogram.sum()),
        "tokens_from": source,
        "expert_skew_max_over_mean": dict(zip(map(str, tables.layers), (total.max(axis=1) / total.mean(axis=1)).tolist())),
        "filled": args.fill,
        "recorded_tokens": counts.meta.get("recorded_tokens"),
        "token_ratio": ratio,
        "token_ratio_band": list(TOKEN_RATIO_BAND),
        "dropped": [key for key, array in measured.items() if array is not None],
        "shape": list(counts.data.shape),
    }
    console.emit(payload, _text(payload, tables, counts))


def _token_ratio(given: int, recorded: float, args) -> float:
    """The tokens given over the tokens the record routed per score-routed layer; outside the band they
    cannot be the record's tokens, refused unless --accept-token-ratio."""
    ratio, (low, high) = given / recorded, TOKEN_RATIO_BAND
    if not low <= ratio <= high and not args.accept_token_ratio:
        raise SceneEplbError(
            f"the tokens given ({given}) are {ratio:.3g} x the {recorded:.1f} tokens the record routed per "
            f"score-routed layer, outside [{low}, {high}]: not this record's tokens; --accept-token-ratio fills it anyway",
            args.fill,
        )
    return ratio


def _text(payload: dict, tables: HashTables, counts: Counts) -> str:
    """What the command says: the tables, the tokens, each hash layer's skew and what it wrote."""
    lines = [
        f"hash layers {list(tables.layers)}: {tables.num_experts} experts, top-{tables.top_k}, vocabulary {tables.vocab}",
        f"tokens: {payload['tokens']} from {payload['tokens_from']}",
        "expert load max/mean: " + ", ".join(f"layer {k} {v:.2f}" for k, v in payload["expert_skew_max_over_mean"].items()),
    ]
    shape = "[T={}, L={}, E={}]".format(*payload["shape"])
    if payload["filled"] is None:
        lines.append(f"wrote {payload['output']}: counts {shape}, the hash layers predicted, every other layer zero")
        return "\n".join(lines)
    recorded, ratio, (low, high) = payload["recorded_tokens"], payload["token_ratio"], payload["token_ratio_band"]
    band = f"within [{low}, {high}]" if low <= ratio <= high else f"outside [{low}, {high}], taken by --accept-token-ratio"
    lines.append(
        f"the record routed {recorded:.1f} tokens a score-routed layer, the tokens given {payload['tokens']} "
        f"(ratio {ratio:.3g}: {band}; 1 when they are the record's tokens)"
    )
    if payload["dropped"]:
        lines.append(
            f"dropped {', '.join(payload['dropped'])}: measured, the prediction cannot split the hash layers by slot or source"
        )
    written = counts.written_entries().size
    lines.append(
        f"wrote {payload['output']}: counts {shape}, {payload['filled']} with its hash layers filled over its {written} written entries"
    )
    return "\n".join(lines)
