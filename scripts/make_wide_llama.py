"""Write a random Llama with Llama-2-7B's widths as one GGUF file, the embedded model's tokenizer inside.

    python scripts/make_wide_llama.py --layers 2 --out .cache/wide/llama2-7b-widths-2l.F16.gguf
    python -m helpers.run --profile quick -p model=.cache/wide/llama2-7b-widths-2l.F16.gguf --only 03 05 06

Decode on a CPU is a question of bytes: at the embedded SmolLM2-135M's widths (576 / 1536) a step
reads about 270 MB of float16 weights, at Llama-2-7B's (4096 / 11008) one decoder layer alone reads
405 MB. This script builds a model with Llama-2-7B's widths (hidden 4096, intermediate 11008, 32
attention heads and 32 KV heads, untied output head, RMSNorm eps 1e-5, rope base 10000) and only a
few decoder layers, so chapters 03, 05 and 06 measure kernels at the shapes where the bytes decide
without 13 GB of weights. The weights are random (seeded, so the same command writes the same
bytes); the vocabulary and tokenizer are the embedded SmolLM2's, copied from its GGUF, so prompts
tokenize exactly as in the other chapters.

One GGUF file is what both sides read: transformers loads it with ``gguf_file=`` the way it loads
the embedded model (``helpers.models.load_model`` converts it once into the model cache), and
llama.cpp reads the very same weights, so chapter 06's comparison with llama.cpp runs one model.
``--type`` picks the weight format of the matrices (F16, or Q8_0 / Q4_0 through ``gguf.quants``);
norms stay F32 as llama.cpp's own converter writes them.

The tensors are drawn in GGUF's layout (attn_q / attn_k rows in llama.cpp's rotary order); the
transformers loader undoes that permutation, so both runtimes compute the same function.
Layer: a script outside the package (it only writes a file the runner is pointed at).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Llama-2-7B's config.json (meta-llama/Llama-2-7b-hf): the widths this script copies.
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
             "num_key_value_heads": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "max_position_embeddings": 4096}
TYPES = ("F16", "Q8_0", "Q4_0")
# `--small`: the widths make test runs the Chinese edition, the dtype runs and the legacy set's chapters
# on (tests/conftest.py, Makefile). Every code path of a chapter runs on it, llama.cpp and vLLM included,
# at a few milliseconds per decode step; multiples of 32 so the Q8_0 / Q4_0 and INT4 g32 paths run too.
SMALL = {"hidden": 256, "intermediate": 704, "heads": 4, "kv_heads": 2, "layers": 2}
LAYER_RANGE = (1, 32)  # Llama-2-7B has 32; 2-4 is the intended use (about 0.8-1.2 G parameters)
INIT_STD = 0.02  # LlamaConfig's initializer_range: activations stay finite through the layers


def tokenizer_fields(source: Path) -> list:
    """``(key, value, vtype, sub_type)`` for every ``tokenizer.*`` field of the GGUF at ``source``."""
    import gguf

    reader = gguf.GGUFReader(source)
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    if not any(k == "tokenizer.ggml.tokens" for k, *_ in out):
        raise SystemExit(f"{source} has no tokenizer.ggml.tokens; pass a GGUF with a tokenizer")
    return out


def _check(layers: int, kind: str, hidden: int, intermediate: int, heads: int, kv_heads: int) -> None:
    if not LAYER_RANGE[0] <= layers <= LAYER_RANGE[1]:
        raise SystemExit(f"--layers {layers}: choose {LAYER_RANGE[0]}..{LAYER_RANGE[1]} (2-4 is the intended range)")
    if kind not in TYPES:
        raise SystemExit(f"--type {kind!r}: choose one of {', '.join(TYPES)}")
    if hidden % heads or heads % kv_heads:
        raise SystemExit(f"--hidden {hidden} must divide by --heads {heads}, and --heads by --kv-heads {kv_heads}")
    if kind != "F16" and (hidden % 32 or intermediate % 32):
        raise SystemExit(f"--type {kind} packs blocks of 32 values: --hidden {hidden} and "
                         f"--intermediate {intermediate} must be multiples of 32")


def build(out: "str | Path", layers: int = 2, kind: str = "F16", seed: int = 0,
          hidden: int = LLAMA2_7B["hidden_size"], intermediate: int = LLAMA2_7B["intermediate_size"],
          heads: int = LLAMA2_7B["num_attention_heads"], kv_heads: int = LLAMA2_7B["num_key_value_heads"],
          tokenizer_from: "str | Path | None" = None) -> Path:
    """Write the model to ``out`` (one ``.gguf`` file) and return its path.

    Deterministic: the same arguments give the same bytes (one numpy generator seeded with ``seed``,
    tensors drawn in a fixed order, no timestamps in the metadata).
    """
    import gguf
    from gguf import GGMLQuantizationType as Q

    _check(layers, kind, hidden, intermediate, heads, kv_heads)
    if tokenizer_from is None:
        from helpers.model_files import locate_embedded_gguf
        tokenizer_from = locate_embedded_gguf()
    fields = tokenizer_fields(Path(tokenizer_from))
    vocab = len(next(v for k, v, *_ in fields if k == "tokenizer.ggml.tokens"))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    qtype = {"F16": Q.F16, "Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0}[kind]
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)

    tmp = out.with_name(out.name + ".partial")  # a cut-off write never leaves a loadable-looking file
    writer = gguf.GGUFWriter(tmp, "llama")
    widths = ("Llama-2-7B widths" if (hidden, intermediate) == (LLAMA2_7B["hidden_size"], LLAMA2_7B["intermediate_size"])
              else f"hidden {hidden}, intermediate {intermediate}")
    writer.add_name(f"random Llama, {widths}, {layers} layers, seed {seed}")
    writer.add_block_count(layers)
    writer.add_context_length(LLAMA2_7B["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(LLAMA2_7B["rope_theta"])
    writer.add_layer_norm_rms_eps(LLAMA2_7B["rms_norm_eps"])
    writer.add_vocab_size(vocab)
    writer.add_file_type({"F16": gguf.LlamaFileType.MOSTLY_F16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[kind])
    for key, value, vtype, sub in fields:
        writer.add_key_value(key, value, vtype, sub)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    def matrix(name: str, rows: int, cols: int) -> None:
        # drawn in float32 then rounded once, so F16 and the quantized files hold the same numbers
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * INIT_STD)
        if qtype == Q.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(hidden, dtype=np.float32))  # RMSNorm starts at 1, as in training

    matrix("token_embd.weight", vocab, hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", intermediate, hidden)
        matrix(f"blk.{i}.ffn_up.weight", intermediate, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, intermediate)
    norm("output_norm.weight")
    matrix("output.weight", vocab, hidden)  # untied, as in Llama-2-7B

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def parameter_count(layers: int, vocab: int, hidden: int = LLAMA2_7B["hidden_size"],
                    intermediate: int = LLAMA2_7B["intermediate_size"]) -> int:
    """Parameters of the model ``build`` writes with full-width heads (MHA: 4 square projections)."""
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    return 2 * vocab * hidden + layers * per_layer + hidden


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the .gguf file to write (its name ends in .<TYPE>.gguf "
                        "so chapter 06 labels llama.cpp's weights, e.g. llama2-7b-widths-2l.F16.gguf)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (2-4 intended; default 2)")
    parser.add_argument("--type", dest="kind", default="F16", choices=TYPES, help="weight format of the matrices")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=LLAMA2_7B["hidden_size"], help="(tests use small widths)")
    parser.add_argument("--intermediate", type=int, default=LLAMA2_7B["intermediate_size"])
    parser.add_argument("--heads", type=int, default=LLAMA2_7B["num_attention_heads"])
    parser.add_argument("--kv-heads", type=int, default=LLAMA2_7B["num_key_value_heads"])
    parser.add_argument("--small", action="store_true", help="the small test model instead of Llama-2-7B's "
                        f"widths: {', '.join(f'{k} {v}' for k, v in SMALL.items())} (overrides those options)")
    args = parser.parse_args(argv)
    if args.small:
        for key, value in SMALL.items():
            setattr(args, key, value)
    path = build(args.out, args.layers, args.kind, args.seed, args.hidden, args.intermediate,
                 args.heads, args.kv_heads)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {args.kind}, {args.layers} layers, "
          f"hidden {args.hidden}, intermediate {args.intermediate}, {args.heads} heads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
