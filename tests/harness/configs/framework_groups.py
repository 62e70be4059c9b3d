#!/usr/bin/env python3
"""Write the groups a framework's own group-construction code builds, one entry per rank, as a
seldp-harness --compare-groups file (docs/harness-interop.md).

The framework's code runs as it is, read from a checkout of it; only what would communicate
(torch.distributed, DeviceMesh) is replaced by a stand-in that records rank lists. This is how
the *-groups.json files beside this script were made; ctest only reads those files.

  framework_groups.py megatron   MEGATRON_LM_DIR  --world 32 --tp 1 --pp 4 --ep 8 [--cp --etp --order]
  framework_groups.py deepspeed  DEEPSPEED_DIR    --world 8 --ep 8 [--tp --pp --etp --dp-ep --autoep]
  framework_groups.py torchtitan TORCHTITAN_DIR   --world 8 --ep 8 [--tp --pp --cp --etp --replicate]

Megatron-LM: megatron/core/parallel_state.py's RankGenerator and default_embedding_ranks, called
with the tokens initialize_model_parallel passes them (dense: tp, pp, cp, dp-cp; expert: ep, dp,
tp). DeepSpeed: deepspeed/utils/groups.py as deepspeed/moe/layer.py's MoE._create_process_groups
calls it (_create_expert_and_data_parallel, or with expert tensor parallelism
_create_expert_data_and_model_parallel over Megatron's mpu); --autoep: AutoEP with AutoTP, the
engine's folding tables (deepspeed/module_inject/auto_ep_folding.py). torchtitan:
torchtitan/distributed/parallel_dims.py's ParallelDims.build_mesh (the meshes of the TOML-era
releases: loss, tp, pp, cp, ep, efsdp, etp).
"""
import argparse
import ast
import itertools
import json
import os
import sys
import types


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def definitions(path, names, namespace):
    """Execute the top-level definitions `names` of the Python file at `path` in `namespace`."""
    tree = ast.parse(read(path), path)
    body = [n for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = set(names) - {n.name for n in body}
    if missing:
        sys.exit(f"{path}: no {', '.join(sorted(missing))}")
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)


# ---- Megatron-LM ---------------------------------------------------------------------------

def megatron(args):
    from typing import Callable, List, Optional
    ns = {"List": List, "Optional": Optional, "Callable": Callable}
    definitions(os.path.join(args.root, "megatron/core/parallel_state.py"),
                ["generate_masked_orthogonal_rank_groups", "RankGenerator",
                 "default_embedding_ranks", "_inject_gtp_remat_axis"], ns)
    w, tp, pp, cp, ep = args.world, args.tp, args.pp, args.cp, args.ep
    etp = args.etp or tp
    order = args.order
    inject = ns["_inject_gtp_remat_axis"]
    gen = ns["RankGenerator"]
    dense = gen(tp=tp, ep=1, dp=w // (tp * pp * cp), pp=pp, cp=cp, order=inject(order, after="tp"))
    expert = gen(tp=etp, ep=ep, dp=w // (etp * ep * pp), pp=pp, cp=1,
                 order=inject(order, after="ep"))
    kinds = {
        "tp": dense.get_ranks("tp"),
        "pp": dense.get_ranks("pp"),
        "cp": dense.get_ranks("cp"),
        "dp": dense.get_ranks("dp-cp"),
        "ep": expert.get_ranks("ep"),
        "expert_dp": expert.get_ranks("dp"),
        "expert_tp": expert.get_ranks("tp"),
        "embedding": [ns["default_embedding_ranks"](r) for r in dense.get_ranks("pp")],
    }
    return per_rank(w, kinds, "megatron")


# ---- DeepSpeed -----------------------------------------------------------------------------

class FakeDist:
    """deepspeed.comm as groups.py uses it: new_group records its ranks."""

    def __init__(self, world):
        self.world, self.rank = world, 0

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return self.world

    def get_rank(self, group=None):
        return self.rank

    def new_group(self, ranks):
        return tuple(ranks)


def deepspeed(args):
    w, tp, pp, ep = args.world, args.tp, args.pp, args.ep
    dist = FakeDist(w)
    mpu = types.SimpleNamespace(
        get_tensor_model_parallel_world_size=lambda: tp,
        get_pipeline_model_parallel_world_size=lambda: pp,
        get_data_parallel_world_size=lambda: w // (tp * pp))
    for name, attrs in {
            "deepspeed": {}, "deepspeed.comm": {},
            "deepspeed.utils": {"log_dist": lambda *a, **k: None},
            "deepspeed.utils.bwc": {
                "bwc_tensor_model_parallel_world_size": lambda m: tp,
                "bwc_pipeline_parallel_world_size": lambda m: pp},
            "deepspeed.utils.exceptions": {"DeprecatedException": Exception},
            "deepspeed.accelerator": {"get_accelerator": lambda: None}}.items():
        sys.modules[name] = types.SimpleNamespace(**attrs)
    sys.modules["deepspeed"].comm = dist
    if args.autoep:
        return autoep(args)
    path = os.path.join(args.root, "deepspeed/utils/groups.py")
    groups = {"ep": [None] * w, "expert_dp": [None] * w}
    for rank in range(w):
        ns = {"dist": dist, "log_dist": lambda *a, **k: None, "mpu": mpu,
              "bwc_tensor_model_parallel_world_size": lambda m: tp,
              "bwc_pipeline_parallel_world_size": lambda m: pp,
              "_get_data_parallel_world_size": lambda: w // (tp * pp),
              "_EXPERT_PARALLEL_GROUP": {}, "_EXPERT_PARALLEL_GROUP_RANKS": {},
              "_EXPERT_DATA_PARALLEL_GROUP": {}, "_EXPERT_DATA_PARALLEL_GROUP_RANKS": {},
              "expert_tensor_parallel_world_size": 1}
        definitions(path, ["_ensure_divisibility", "_create_expert_and_data_parallel",
                           "_get_expert_parallel_ranks",
                           "_create_expert_data_and_model_parallel"], ns)
        dist.rank = rank
        name = f"ep_size_{ep}"
        if args.etp > 1:  # enable_expert_tensor_parallelism over Megatron's mpu
            ns["_create_expert_data_and_model_parallel"](
                ep, mpu=mpu, use_data_before_expert_parallel_=args.dp_ep)
        else:  # groups.mpu is None or expert tensor parallelism is off: the legacy path
            ns["_create_expert_and_data_parallel"](ep, pp_size=pp,
                                                   use_data_before_expert_parallel_=args.dp_ep)
        groups["ep"][rank] = sorted(ns["_EXPERT_PARALLEL_GROUP"][name])
        groups["expert_dp"][rank] = sorted(ns["_EXPERT_DATA_PARALLEL_GROUP"][name])
    return {"format": "seldp-groups", "framework": "deepspeed", "world": w,
            "ranks": [{"rank": r, "ep": groups["ep"][r], "expert_dp": groups["expert_dp"][r]}
                      for r in range(w)]}


def autoep(args):
    """AutoEP with AutoTP (tp > 1): the folding tables the engine creates its groups from
    (deepspeed/module_inject/auto_ep_folding.py)."""
    from dataclasses import dataclass
    from typing import Iterable
    ns = {"dataclass": dataclass, "Iterable": Iterable, "__name__": "auto_ep_folding"}
    definitions(os.path.join(args.root, "deepspeed/module_inject/auto_ep_folding.py"),
                ["ParallelFoldingSpec", "FoldingGroupTables", "_divisors", "_require_positive",
                 "build_folding_spec", "expected_folding_group_tables"], ns)
    spec = ns["build_folding_spec"](world_size=args.world, pp_size=args.pp, tp_size=args.tp,
                                    ep_size=args.ep, etp_size=1, mp_mode="tp")
    tables = ns["expected_folding_group_tables"](spec)
    out = per_rank(args.world, {"tp": tables.tp_groups, "dp": tables.dense_dp_groups,
                                "ep": tables.ep_groups, "expert_dp": tables.edp_groups},
                   "deepspeed")
    return out


# ---- torchtitan ----------------------------------------------------------------------------

class FakeMesh:
    """A DeviceMesh as one rank sees it: its ranks laid out row-major over named dimensions."""

    def __init__(self, ranks, shape, names, rank, flats=None):
        self.ranks, self.shape, self.mesh_dim_names, self.rank = ranks, tuple(shape), tuple(names), rank
        self.flats = flats if flats is not None else {}
        self.ndim = len(self.shape)

    def size(self):
        return len(self.ranks)

    def _unflatten(self, dim, sizes, names, backend_override=None):
        return FakeMesh(self.ranks, sizes, names, self.rank)

    def _coords(self, index):
        out = []
        for s in reversed(self.shape):
            out.append(index % s)
            index //= s
        return list(reversed(out))

    def __getitem__(self, names):
        if isinstance(names, str):
            if names in self.flats:
                return self.flats[names]
            names = (names,)
        dims = [self.mesh_dim_names.index(n) for n in names]
        mine = self._coords(self.ranks.index(self.rank))
        ranks = []
        for combo in itertools.product(*[range(self.shape[d]) for d in dims]):
            c = list(mine)
            for d, v in zip(dims, combo):
                c[d] = v
            index = 0
            for s, v in zip(self.shape, c):
                index = index * s + v
            ranks.append(self.ranks[index])
        return FakeMesh(ranks, [self.shape[d] for d in dims], names, self.rank, self.flats)

    def _flatten(self, mesh_dim_name):
        flat = FakeMesh(self.ranks, [len(self.ranks)], [mesh_dim_name], self.rank)
        self.flats[mesh_dim_name] = flat
        return flat


def torchtitan(args):
    from dataclasses import dataclass, field
    w = args.world
    state = {"rank": 0}
    fake = {
        "torch": {}, "torch.distributed": {},
        "torch.distributed.device_mesh": {
            "DeviceMesh": FakeMesh,
            "init_device_mesh": lambda device, shape, mesh_dim_names=None:
                FakeMesh(list(range(w)), shape, mesh_dim_names or ("world",), state["rank"])},
        "torchtitan": {}, "torchtitan.tools": {},
        "torchtitan.tools.logging": {"logger": types.SimpleNamespace(info=lambda *a, **k: None)},
        "torchtitan.tools.utils": {"device_type": "cpu"}}
    for name, attrs in fake.items():
        sys.modules[name] = types.SimpleNamespace(**attrs)
    ns = {"__name__": "parallel_dims"}
    exec(compile(read(os.path.join(args.root, "torchtitan/distributed/parallel_dims.py")),
                 "parallel_dims.py", "exec"), ns)
    dp_shard = w // (args.replicate * args.cp * args.tp * args.pp)
    kinds = {k: [None] * w for k in ("tp", "pp", "cp", "dp", "ep", "expert_dp", "expert_tp")}
    names = {"tp": "tp", "pp": "pp", "cp": "cp", "dp": "loss", "ep": "ep", "expert_dp": "efsdp",
             "expert_tp": "etp"}
    for rank in range(w):
        state["rank"] = rank
        dims = ns["ParallelDims"](dp_replicate=args.replicate, dp_shard=dp_shard, cp=args.cp,
                                  tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp or 1,
                                  world_size=w)
        dims.build_mesh()
        for kind, mesh in names.items():
            ranks = dims._meshes[mesh].ranks
            if kind == "expert_dp" and args.replicate > 1:  # HSDP: the experts' replicas too
                ranks = dims._global_meshes["sparse"][("dp_replicate", "efsdp")].ranks
            kinds[kind][rank] = sorted(ranks)
    return {"format": "seldp-groups", "framework": "torchtitan", "world": w,
            "ranks": [dict([("rank", r)] + [(k, kinds[k][r]) for k in kinds]) for r in range(w)]}


def per_rank(world, kinds, framework):
    ranks = []
    for r in range(world):
        entry = {"rank": r}
        for kind, groups in kinds.items():
            mine = [sorted(g) for g in groups if r in g]
            entry[kind] = mine[0] if mine else None
        ranks.append(entry)
    return {"format": "seldp-groups", "framework": framework, "world": world, "ranks": ranks}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("framework", choices=["megatron", "deepspeed", "torchtitan"])
    p.add_argument("root", help="a checkout of the framework")
    for name in ("world", "tp", "pp", "cp", "ep", "etp", "replicate"):
        p.add_argument("--" + name, type=int, default=0 if name == "etp" else 1)
    p.add_argument("--order", default="tp-cp-ep-dp-pp")
    p.add_argument("--dp-ep", action="store_true", help="DeepSpeed's data-before-expert")
    p.add_argument("--autoep", action="store_true", help="DeepSpeed's AutoEP+AutoTP folding")
    p.add_argument("-o", "--output", default="-")
    args = p.parse_args()
    out = {"megatron": megatron, "deepspeed": deepspeed, "torchtitan": torchtitan}[args.framework](args)
    text = json.dumps(out, indent=None, separators=(", ", ": "))
    text = text.replace(", {\"rank\"", ",\n  {\"rank\"").replace("\"ranks\": [{", "\"ranks\": [\n  {")
    if args.output == "-":
        print(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
