#!/usr/bin/env python3
"""Write the synthetic seeds of the fuzz corpora (tests/fuzz/corpus/<target>/).

The seeds are committed; run this again only to change them. Besides these, the corpora hold
real files: the harness's test layouts, two seldp-harness --dump outputs (dense and nf4), a
checkpoint's index and shard (checkpoint-index-nf4 of format version 1, -v2 of version 2), and
inputs the fuzzers once found (newline-in-*: a message that was not one line).

  manifest/     schema-manifest blobs (src/manifest.c's encoding), valid and broken
  safetensors/  small safetensors files of every dtype, metadata, empty tensors
  layout/       one byte choosing the roots (b'0' first, b'1' last, b'2' spread), then JSON
                (TP = PP = 1 files and a file of the full grid)
  megatron/     Megatron command lines: the framework examples of tests/harness/configs and
                short ones that reach the refusals
  toml/         torchtitan's train configs (tests/harness/configs) and TOML of every kind
  deepspeed/    ds_configs (tests/harness/configs) and short ones
  groups/       one byte choosing the layout (fuzz_groups.c), then a --compare-groups file
  sweep/        sweep files
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# dtype codes of include/seldp/dtype.h
F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64, BOOL = range(13)
HOST, CUDA = 0, 1


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def manifest(entries, magic=b"SDPM", version=1, count=None):
    """entries: (path, dtype, shape, alias, frozen, device kind), sorted by path."""
    out = bytearray(magic + struct.pack("<II", version, len(entries) if count is None else count))
    for path, dtype, shape, alias, frozen, kind in entries:
        p = path.encode()
        out += struct.pack("<I", len(p)) + p
        out += struct.pack("<BBBBI", dtype, len(shape), 1 if frozen else 0, kind, alias)
        for extent in shape:
            out += struct.pack("<Q", extent)
    return bytes(out)


STD = [
    ("embed.weight", F32, [8, 4], 0, False, HOST),
    ("final_norm.weight", F32, [4], 1, False, HOST),
    ("frozen.scale", F32, [3], 2, True, HOST),
    ("layers.0.norm.weight", BF16, [4], 3, False, HOST),
    ("layers.0.router.weight", F16, [2, 4], 4, False, HOST),
    ("lm_head.weight", F32, [8, 4], 0, False, HOST),
]


def manifests():
    write("manifest", "empty", manifest([]))
    write("manifest", "one", manifest([("w", F32, [3], 0, False, HOST)]))
    write("manifest", "standard", manifest(STD))
    write("manifest", "buffers", manifest([
        ("a.absmax", F32, [2], 0, True, HOST),
        ("a.qweight", U8, [64], 1, True, HOST),
        ("a.qzeros", I32, [4, 1], 2, True, HOST),
        ("a.scales", F16, [4, 2], 3, True, HOST),
        ("b.mask", BOOL, [16], 4, True, CUDA),
        ("c.scalar", BF16, [], 5, False, CUDA),
        ("d.deep", F32, [1, 2, 1, 2, 1, 2, 1, 2], 6, False, HOST),
        ("e.empty", F32, [0, 4], 7, False, HOST),
    ]))
    write("manifest", "aliases", manifest([
        ("a", F32, [2], 0, False, HOST),
        ("b", F32, [2], 0, False, HOST),
        ("c", F16, [2], 2, False, HOST),
        ("d", F16, [2], 2, False, HOST),
        ("e", F32, [2], 0, False, HOST),
    ]))
    # broken: each decoder check once
    std = manifest(STD)
    write("manifest", "bad-magic", b"SDPX" + std[4:])
    write("manifest", "bad-version", manifest(STD, version=2))
    write("manifest", "count-too-large", manifest(STD, count=1000))
    write("manifest", "truncated", std[:-5])
    write("manifest", "trailing", std + b"\0")
    write("manifest", "unsorted", manifest([STD[1], STD[0]]))
    write("manifest", "alias-forward", manifest([("a", F32, [2], 1, False, HOST),
                                                 ("b", F32, [2], 1, False, HOST)]))
    write("manifest", "dtype-13", manifest([("w", 13, [3], 0, False, HOST)]))
    write("manifest", "ndim-9", manifest([("w", F32, [1] * 9, 0, False, HOST)]))
    write("manifest", "extent-negative", manifest([("w", F32, [2**63], 0, False, HOST)]))
    write("manifest", "size-overflow", manifest([("w", F64, [2**40, 2**40], 0, False, HOST)]))


def safetensors(tensors, metadata=None, pad=True, header_len=None):
    """tensors: (name, dtype name, shape, bytes)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data


def safetensors_seeds():
    sizes = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "I16": 2, "U16": 2,
             "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}
    every = [(f"t.{d.lower()}", d, [2, 3], bytes(range(6 * s))) for d, s in sizes.items()]
    write("safetensors", "every-dtype", safetensors(every, {"config": "{\"vocab\": 8}"}))
    write("safetensors", "empty-header", safetensors([]))
    write("safetensors", "metadata-only", safetensors([], {"layout": "{}", "x": "y"}))
    write("safetensors", "empty-tensors", safetensors([
        ("a", "F32", [0], b""), ("b", "F16", [2, 0, 3], b""), ("c", "U8", [], b"\x07")]))
    write("safetensors", "scalar", safetensors([("s", "F64", [], b"\0" * 8)]))
    good = safetensors([("w", "F32", [2], b"\0" * 8)])
    write("safetensors", "truncated-data", good[:-3])
    write("safetensors", "header-too-long", safetensors([("w", "F32", [2], b"\0" * 8)],
                                                        header_len=4096))
    write("safetensors", "gap", struct.pack("<Q", 64) +
          b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'.ljust(64) + b"\0" * 8)
    write("safetensors", "overlap", struct.pack("<Q", 104) +
          (b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
           b'"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}').ljust(104) + b"abcdef")
    write("safetensors", "unknown-dtype", safetensors([("w", "F8", [2], b"\0\0")]))


LAYOUT_EP_DP_8_4 = {
    "description": "ep-dp, world 8, ep 4", "world": 8, "shared_root": 0,
    "ep_groups": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "experts": [{"owners": [j, j + 4], "root": j} for j in range(4) for _ in range(2)],
}


def layouts():
    src = os.path.join(HERE, "..", "harness", "layouts")
    for i, name in enumerate(sorted(os.listdir(src))):
        with open(os.path.join(src, name), "rb") as f:
            write("layout", name, str(i % 3).encode() + f.read())
    write("layout", "ep-dp-8-4.json", b"0" + json.dumps(LAYOUT_EP_DP_8_4).encode())
    write("layout", "one-rank.json", b"1" + b'{"ep_groups": [[0]], "experts": [{"owners": [0]}]}')
    write("layout", "escapes.json", b"2" + json.dumps({
        "description": "\u00e9 \ud83d\ude00 \"quoted\" \\ \t", "ep_groups": [[1], [0]],
        "experts": [{"owners": [0, 1]}]}, ensure_ascii=True).encode())
    write("layout", "numbers.json", b"0" + b'{"world": 2, "shared_root": 1, "ep_groups": '
          b'[[0, 1]], "experts": [{"owners": [0], "root": 0}, {"owners": [1, 0]}], '
          b'"description": "-0 1e3 0.5 true false null"}')
    # the full grid: tp 2 x cp 2 blocks, groups of every kind, the embedding derived
    write("layout", "grid-tp2-cp2.json", b"1" + json.dumps({
        "tp": 2, "cp": 2, "ep": 2, "framework": None, "experts": [{}, {"root": 3}],
        "groups": {"tp": [[0, 1], [2, 3]], "pp": [[0], [1], [2], [3]], "cp": [[0, 2], [1, 3]],
                   "dp": [[0, 2], [1, 3]], "ep": [[0, 1], [2, 3]], "expert_dp": [[0, 2], [1, 3]],
                   "expert_tp": [[0], [1], [2], [3]]}}).encode())


CONFIGS = os.path.join(HERE, "..", "harness", "configs")


def config(rel):
    with open(os.path.join(CONFIGS, rel), "rb") as f:
        return f.read()


def interop():
    for rel in ("megatron/mixtral_8x7b.args", "megatron/gptoss_20b.args",
                "megatron/deepseek_v3_fsdp.args", "megatron-deepspeed/gpt_125M_MoE64.args"):
        write("megatron", os.path.basename(rel), config(rel))
    write("megatron", "launcher.args", b"python -m torch.distributed.run --nproc-per-node=4 "
          b"--nnodes=2 pretrain_gpt.py --num-experts 8 --expert-model-parallel-size 4 "
          b"--moe-expert-capacity-factor -1 --moe-shared-expert-intermediate-size 128")
    write("megatron", "refusals.args", b"--tensor-model-parallel-size ${TP} --bf16 --fp16 "
          b"--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.01 "
          b"--data-path '/unterminated")
    write("megatron", "quotes.args", b"--split \"99,1,0\" --x='a b' \\\n --y \\\\ # comment\n"
          b"--micro-batch-size 3 --global-batch-size 256 --use-tp-pp-dp-mapping")
    for rel in ("torchtitan/deepseek_v3_16b.toml", "torchtitan/llama4_17bx128e.toml",
                "torchtitan/deepseek_v3_671b.toml"):
        write("toml", os.path.basename(rel), config(rel))
    write("toml", "every-kind.toml", b"# every kind\ntitle = \"t\\u00e9\"\n[a.b]\n"
          b"'q k' = 'lit'\nn = [1, 2.5e-3, -inf, 0x1f, 0o7, 0b1, 1_000,\n]\n"
          b"t = { x = 1, y.z = true }\n[a]\nc.d = false\n")
    write("toml", "redefined.toml", b"[t]\nk = 1\n[t]\nk = 2\n[[x]]\n")
    write("toml", "hsdp.toml", b"[parallelism]\ndata_parallel_replicate_degree = 2\n"
          b"data_parallel_shard_degree = 4\nexpert_parallel_degree = 4\n"
          b"pipeline_parallel_degree = 2\n[training]\nlocal_batch_size = 4\n"
          b"global_batch_size = 64\ndtype = \"bfloat16\"\n")
    for rel in ("megatron-deepspeed/ds_config_gpt_125M_MoE64.json",
                "deepspeed/autoep_zero2_bf16.json"):
        write("deepspeed", os.path.basename(rel), config(rel))
    write("deepspeed", "autotp.json", json.dumps({
        "tensor_parallel": {"autotp_size": 2}, "use_data_before_expert_parallel_": True,
        "expert_parallel": {"enabled": True, "autoep_size": 4}, "train_batch_size": "auto",
        "fp16": {"enabled": True, "loss_scale": 0}, "communication_data_type": "fp32"}).encode())
    groups = [(0, "megatron/mixtral_8x7b-groups.json"), (1, "megatron/gptoss_20b-groups.json"),
              (2, "megatron-deepspeed/gpt_125M_MoE64-groups.json"),
              (3, "torchtitan/deepseek_v3_16b-groups.json")]
    for byte, rel in groups:
        write("groups", os.path.basename(rel), str(byte).encode() + config(rel))
    write("groups", "hot-expert.json", b"4" + json.dumps({"ranks": [
        {"rank": 0, "dp": [0, 1, 2, 3], "expert_dp": [0, 2], "experts": [0, 1]},
        {"rank": 1, "embedding": None, "expert_dp": [1, 3]}, {"rank": 2}, {"rank": 3}]}).encode())
    write("sweep", "layouts.json", json.dumps([
        {"name": "first", "world": 4, "ep": 2, "order": "dp-ep", "flow": "mean"},
        {"framework": "megatron", "tp": 2, "order": "tp-dp-pp", "fp32-master": True},
        {"framework": "torchtitan", "ep": 4, "aux-loss-coeff": 0.01, "inject": "local-aux"}]).encode())
    write("sweep", "refused.json", b'[{"seed": 3}, {"bogus": 1}, {"ep": "x"}]')


if __name__ == "__main__":
    manifests()
    safetensors_seeds()
    layouts()
    interop()
